"""Vision-language policies: which families train on images, their processor, LoRA placement,
and the start-up checks that refuse an image column the model would not see.

Tested families (tiny random models, ``tests/generation/test_model_families.py``) are the only ones
accepted with an image column; another vision-language family is refused at start-up by name,
never trained text-only. Without an image column any of them trains on text like a causal LM.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import re
from collections.abc import Sequence
from typing import Any

import datasets
from torch import nn

from rloo.data.images import encode_image_prompts, image_column, image_messages, is_processor, row_images
from rloo.data.loading import column_names
from rloo.data.prompt_checks import PROMPT_COLUMN
from rloo.offline import hub_or_cache

# config.model_type of the vision-language families tested with images
SUPPORTED_VISION_FAMILIES = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_5",
    "gemma3",
    "gemma4",
    "llava",
    "llava_next",
)


def base_model_of(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (``model`` itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_vision_language(model: Any) -> bool:
    """A model whose config has a vision tower (``vision_config``): it takes images."""
    return getattr(getattr(base_model_of(model), "config", None), "vision_config", None) is not None


def load_processor(source: str, trust_remote_code: bool) -> Any:
    """The processor saved with a vision-language model (``AutoProcessor``); a clear error without one."""
    from transformers import AutoProcessor

    try:
        with hub_or_cache(source):
            processor = AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]
    except (OSError, ValueError, ImportError, AttributeError) as error:  # no processor files, a missing backend
        if "torchvision" in str(error).lower() and importlib.util.find_spec("torchvision") is None:
            raise ValueError(
                f"the dataset has images but the processor of {source!r} needs torchvision, which is not installed "
                f"(transformers: {str(error).strip().splitlines()[0]}; rloo passes no videos, but the processor is "
                "built with its video part): `pip install torchvision` (the build matching your torch), or pass the "
                "processor as processing_class"
            ) from error
        raise ValueError(
            f"the dataset has images but the processor of {source!r} could not be loaded ({type(error).__name__}: "
            f"{error}); pass it as processing_class"
        ) from error
    if not is_processor(processor):
        raise ValueError(f"{source!r} has no image processor (AutoProcessor gave a {type(processor).__name__})")
    return processor


def vision_modules(model: nn.Module) -> list[str]:
    """Qualified names of the modules beside the language model (vision tower, projector): the
    siblings of ``get_decoder()``; empty when the model has no separate language model."""
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None  # type: ignore[operator]
    names = {id(module): name for name, module in model.named_modules()}
    name = names.get(id(decoder)) if decoder is not None else None
    if not name or decoder is model:
        return []
    parent_name = name.rpartition(".")[0]
    parent = model.get_submodule(parent_name) if parent_name else model
    prefix = f"{parent_name}." if parent_name else ""
    return [prefix + child for child, module in parent.named_children() if module is not decoder]


def language_model_only(model: nn.Module, peft_config: Any) -> Any:
    """``peft_config`` with the vision tower and projector excluded (a copy), for a vision-language
    ``model`` whose config leaves ``exclude_modules`` unset: LoRA trains the language model only by
    default. An ``exclude_modules`` the user set (an empty list too) is kept as given."""
    if not is_vision_language(model) or getattr(peft_config, "exclude_modules", "unset") is not None:
        return peft_config
    excluded = [name for name in vision_modules(model) if name != "lm_head"]
    if not excluded:
        return peft_config
    config = copy.deepcopy(peft_config)
    config.exclude_modules = "(" + "|".join(re.escape(name) for name in excluded) + r")(\..*)?"
    return config


def check_image_inputs(dataset: Any, policy: nn.Module, processing_class: Any, args: Any = None) -> None:
    """Refuse, at start-up, an ``image``/``images`` column the policy would not see: a text-only
    model, a vision-language family not tested with images, or no processor; then check every row's
    prompt against its image count and encode the first row with the processor (``args``: the
    RLOOConfig's ``max_prompt_length`` and ``chat_template_kwargs`` apply; None: neither)."""
    names = column_names(dataset)
    name = image_column(names)
    if name is None:
        return
    model = base_model_of(policy)
    model_class, family = type(model).__name__, getattr(model.config, "model_type", "?")
    if not is_vision_language(model):
        raise ValueError(
            f"the dataset has an `{name}` column but {model_class} is a text-only model, which cannot see images; "
            "use a vision-language model (e.g. Qwen2.5-VL), or rename the column if only reward functions read it"
        )
    if family not in SUPPORTED_VISION_FAMILIES:
        raise ValueError(
            f"{model_class} ({family}) is a vision-language family rloo does not support with images "
            f"(supported: {', '.join(SUPPORTED_VISION_FAMILIES)}); it would not be trained text-only in its place"
        )
    check_image_pooling(model)
    if not is_processor(processing_class):
        raise ValueError(
            f"the dataset has an `{name}` column but processing_class is a {type(processing_class).__name__}; pass "
            f"{model_class}'s processor (AutoProcessor.from_pretrained(...)) as processing_class"
        )
    if isinstance(dataset, datasets.Dataset):
        for row, (prompt, count) in enumerate(zip(dataset[PROMPT_COLUMN], image_counts(dataset, name), strict=True)):
            image_messages(prompt, count, row)
        first = dataset[0]
        images = row_images({name: [first[name]]}, 0)
        limit, template_kwargs = getattr(args, "max_prompt_length", None), getattr(args, "chat_template_kwargs", None)
        encode_image_prompts([first[PROMPT_COLUMN]], [images], processing_class, limit, template_kwargs)


def check_image_pooling(model: nn.Module) -> None:
    """Refuse a Gemma 3 config whose projector cannot pool an image's patches to its image tokens.

    Gemma 3 average-pools the vision tower's ``p x p`` patch grid (``p = image_size // patch_size``)
    to ``t x t`` tokens (``t = sqrt(mm_tokens_per_image)``) with a kernel and stride of ``p // t``: a
    kernel of 0 fails in the tower's pooling ("stride should not be zero"), and a grid that does not
    pool to exactly ``t x t`` gives more or fewer features than the prompt has image tokens. Both
    are properties of the config alone (the model fails the same in transformers' own forward), as
    in a tiny test config with SigLIP's default 224 / 16 and Gemma 3's 256 tokens."""
    config: Any = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "gemma3":
        return
    vision: Any = config.vision_config
    tokens = int(config.mm_tokens_per_image)
    side, grid = math.isqrt(tokens), vision.image_size // vision.patch_size
    kernel = grid // side if side else 0
    if side * side == tokens and kernel >= 1 and grid // kernel == side:
        return
    failure = " (0: the vision tower fails with 'stride should not be zero')" if not kernel else ""
    raise ValueError(
        f"{type(model).__name__}'s config cannot pool an image into its {tokens} image tokens: "
        f"vision_config.image_size={vision.image_size} // vision_config.patch_size={vision.patch_size} is a "
        f"{grid}x{grid} patch grid, which Gemma 3 average-pools to t x t tokens, t = isqrt(mm_tokens_per_image="
        f"{tokens}) = {side}, with a kernel of {grid} // {side} = {kernel}{failure}; give mm_tokens_per_image as a "
        "square t*t and image_size // patch_size a multiple of t (e.g. 896, 14 and 256, as Gemma 3's own; 28, 7 "
        "and 4 for a tiny one), with the processor's image size and image_seq_length matching"
    )


def image_counts(dataset: datasets.Dataset, name: str) -> Sequence[int]:
    """The number of images of every row, read without decoding them."""
    feature = dataset.features.get(name)
    if isinstance(feature, datasets.Image):
        dataset = dataset.cast_column(name, datasets.Image(decode=False))
    elif isinstance(feature, datasets.List | list) and isinstance(_inner(feature), datasets.Image):
        dataset = dataset.cast_column(name, datasets.List(datasets.Image(decode=False)))
    values = dataset[name]
    if name == "image":
        return [0 if value is None else 1 for value in values]
    return [len(value or []) for value in values]


def _inner(feature: Any) -> Any:
    return feature[0] if isinstance(feature, list) else getattr(feature, "feature", None)
