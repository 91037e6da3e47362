"""Loading saved weights (full model or PEFT adapter) back into a live model."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from rloo.training.models import is_peft_model


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load ``folder``'s safetensors into ``model`` in place.

    A PEFT model loads ``adapter_model.safetensors``; a full model every ``*.safetensors``
    shard. Keys missing from the files must be tied weights (e.g. the LM head tied to the
    embeddings), which ``save_pretrained`` leaves out; anything else is an error.
    """
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
        return
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"no *.safetensors weights in {folder}")
    state = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_parameter_names(model)
    untied_missing = [k for k in missing if k not in tied]
    if untied_missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {untied_missing[:5]}, unexpected {unexpected[:5]}"
        )


def _tied_parameter_names(model: nn.Module) -> set[str]:
    """Names of parameters that share storage with an earlier-named parameter."""
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        else:
            seen[id(param)] = name
    return tied
