"""QLoRA: a policy loaded with its weights quantized by bitsandbytes (4-bit NF4/FP4, or 8-bit), trained
through LoRA adapters.

TRL takes ``RLOOTrainer(quantization_config=BitsAndBytesConfig(...))`` (or ``model_init_kwargs``'s) and
loads the model with it (trl#6157); so does rloo, recording it in ``model_init_kwargs`` as a plain mapping
so ``config.yaml`` re-runs the same model. The quantized weights are frozen: a quantized policy without
``peft_config`` (or adapters of its own) is refused, as there is nothing it could train. The base model is
prepared as peft's QLoRA recipe does (``prepare_model_for_kbit_training``: its non-quantized weights in
float32), and the reference is the same quantized base with the adapters disabled, as with LoRA, so a
reference costs no second copy. bitsandbytes >= 0.50 runs 4-bit weights on a CPU as well as on CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from rloo.config import RLOOConfig
from rloo.config.trl.passthrough import quantization_settings


def with_quantization(args: RLOOConfig, quantization_config: Any, model: Any) -> RLOOConfig:
    """``args`` with the trainer's ``quantization_config`` (a ``BitsAndBytesConfig`` or a mapping of one) in
    ``model_init_kwargs``, where a model is loaded by name; refused given twice or with a loaded model."""
    if quantization_config is None:
        return args
    given = dict(args.model_init_kwargs or {})
    if "quantization_config" in given:
        raise ValueError(
            "quantization_config is given both to RLOOTrainer and in RLOOConfig.model_init_kwargs: give it once"
        )
    if not isinstance(model, str):
        raise ValueError(
            "RLOOTrainer(quantization_config=...) quantizes a model it loads: pass the model's path or hub id, or "
            "load it yourself with from_pretrained(..., quantization_config=...) and pass that model"
        )
    settings = quantization_settings(quantization_config)
    if not isinstance(settings, Mapping):
        raise ValueError(
            f"quantization_config must be a transformers BitsAndBytesConfig or a mapping of its fields, got "
            f"{type(quantization_config).__name__}"
        )
    return args.replace(model_init_kwargs={**given, "quantization_config": dict(settings)})


def loading_kwargs(init_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``from_pretrained`` keywords with a ``quantization_config`` mapping built into a ``BitsAndBytesConfig``."""
    kwargs = dict(init_kwargs)
    settings = kwargs.get("quantization_config")
    if isinstance(settings, Mapping):
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig.from_dict(dict(settings))  # type: ignore[no-untyped-call]
    return kwargs


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model``'s weights are bitsandbytes-quantized (loaded in 4 or 8 bits)."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def prepare_quantized(model: nn.Module, peft_config: Any, adapted: bool) -> None:
    """Refuse a quantized policy with nothing to train; prepare one for LoRA adapters (peft's recipe)."""
    if peft_config is None and not adapted:
        raise ValueError(
            "the model is loaded quantized (bitsandbytes), and quantized weights cannot be trained: give "
            "peft_config=LoraConfig(...) (QLoRA: the adapters train, the quantized base stays frozen), or load "
            "the model unquantized"
        )
    if not adapted:
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # type: ignore[no-untyped-call]
    for module in model.modules():
        # bitsandbytes (0.50) repacks a 4-bit layer's weights for its CPU inference kernel at the first no-grad
        # eval forward on a CPU with AVX512-BF16 (the sampler's), and that kernel has no backward: the training
        # passes after it get no gradient at all. The general kernel serves sampling and training alike.
        if getattr(module, "support_avx512bf16_for_cpu", False):
            setattr(module, "support_avx512bf16_for_cpu", False)  # noqa: B010 (an attribute of bitsandbytes' layers)
