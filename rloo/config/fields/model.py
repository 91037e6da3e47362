"""How the policy is loaded (``from_pretrained``'s keywords, remote code) and how its training passes spend
memory and compute. The speed and memory settings are exact: they change no gradient
(:mod:`rloo.forward.lm_head`, :mod:`rloo.forward.packing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.config.errors import fail
from rloo.config.field_types import KeywordMapping
from rloo.config.fields.declare import option

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


@dataclass
class ModelFields:
    """Model-loading and pass-layout fields of ``RLOOConfig``, with their documentation (``model_init_kwargs``
    is normalized by :mod:`rloo.config.trl.passthrough` when the config is built)."""

    # speed and memory: exact, they change no gradient
    skip_zero_advantage: bool = option(
        True,
        "Rows with zero advantage skip their (exactly zero) backward; only with no entropy bonus or KL in the loss.",
        trl=None,
    )
    max_logits_memory_mb: float = option(
        256.0,
        "MiB, > 0: float32 logits stay under it: the LM head runs in chunks of it (else passes split by rows).",
        trl=None,
    )
    padding_free: bool = option(
        True,
        "Pack a pass's rows end to end (positions restarting per row) where the model's attention keeps them "
        "apart and it costs fewer FLOPs than padding; False: never. Per pass, by a FLOPs model (docs/models.md).",
        trl=None,
    )
    model_init_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of from_pretrained for a model given by name or path. Weights load in float32 unless "
        "it names a dtype (a torch.dtype or its name, e.g. {dtype: bfloat16}); values must be YAML-writable.",
        trl="model_init_kwargs",
    )
    trust_remote_code: bool = option(
        False,
        "Run the modelling/tokenizer code a model folder or hub repo ships (only for sources you trust).",
        trl="trust_remote_code",
    )


def check_model(config: RLOOConfig) -> None:
    """The logits' memory budget (the keyword mappings are checked as they are normalized)."""
    if not config.max_logits_memory_mb > 0:
        raise fail("max_logits_memory_mb", config.max_logits_memory_mb, "must be > 0 (MiB of logits per pass)")
