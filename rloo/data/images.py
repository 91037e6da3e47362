"""Prompts with images: the ``image`` / ``images`` column, image content parts, the processor.

A row may carry one image (``image``: a PIL image, or None) or several (``images``: a list of
PIL images), as in TRL. Its prompt must be a conversation; the images are placed where its
``{"type": "image"}`` content parts are, or (none given) at the start of the first user message,
as TRL's ``prepare_multimodal_messages`` does. The conversation is rendered with the processor's
chat template and the processor expands each image into its image tokens and pixel inputs
(:class:`rloo.generation.multimodal.VisionInputs`). The columns also reach reward functions, by name.

Prompts with images are never truncated (that would cut image tokens): one longer than
``max_prompt_length`` is refused, naming its row.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from rloo.data.prompts import TokenizedPrompts, is_conversational
from rloo.generation.multimodal import IMAGE_KEYS, TOKEN_LEVEL_KEYS, VisionInputs

IMAGE_COLUMNS = ("image", "images")


def image_column(names: Sequence[str]) -> str | None:
    """The dataset's image column (``image`` or ``images``), None without one; both is refused."""
    found = [name for name in IMAGE_COLUMNS if name in names]
    if len(found) > 1:
        raise ValueError("the dataset has both an `image` and an `images` column; keep one (`images`: a list per row)")
    return found[0] if found else None


def is_processor(processing_class: Any) -> bool:
    """A multimodal processor (it holds a tokenizer and an image processor), not a tokenizer."""
    return hasattr(processing_class, "image_processor") and hasattr(processing_class, "tokenizer")


def row_images(columns: Mapping[str, Sequence[Any]], index: int) -> list[Any]:
    """Row ``index``'s images: ``[image]`` (none when it is None) or its ``images`` list, each checked."""
    name = image_column(list(columns))
    if name is None:
        return []
    value = columns[name][index]
    images = ([] if value is None else [value]) if name == "image" else list(value or [])
    for image in images:
        if not _is_pil_image(image):
            raise ValueError(
                f"row {index}'s `{name}` holds a {type(image).__name__}; give PIL images (a datasets.Image "
                "column decodes to them): rloo passes them to the model's processor"
            )
    return images


def _is_pil_image(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow comes with transformers' image processing
        return False
    return isinstance(value, Image.Image)


def image_messages(prompt: Any, num_images: int, row: int) -> list[dict[str, Any]]:
    """``prompt`` (a conversation) with content parts: text contents become text parts and, when no
    message has an image part, ``num_images`` image parts open the first user message. The image
    parts must number ``num_images``."""
    if not is_conversational(prompt):
        raise ValueError(
            f"row {row}'s prompt is plain text in a dataset with images; give a conversation, e.g. "
            '[{"role": "user", "content": "What is shown?"}] (rloo places the row\'s images in it)'
        )
    messages: list[dict[str, Any]] = copy.deepcopy(prompt)
    for message in messages:
        if isinstance(message["content"], str):
            message["content"] = [{"type": "text", "text": message["content"]}]
    placed = sum(part.get("type") == "image" for message in messages for part in message["content"])
    if placed == 0 and num_images:
        user = next((m for m in messages if m["role"] == "user"), None)
        if user is None:
            raise ValueError(f"row {row} has images but no user message to place them in; add one")
        user["content"] = [{"type": "image"} for _ in range(num_images)] + user["content"]
    elif placed != num_images:
        raise ValueError(
            f"row {row}'s prompt has {placed} image content parts but the row has {num_images} images; "
            "give one {'type': 'image'} part per image, or none (the images then open the first user message)"
        )
    return messages


def split_processor_output(
    encoded: Mapping[str, Any], row: int
) -> tuple[list[int], dict[str, list[int]], dict[str, Tensor]]:
    """One prompt's processor output -> ``(ids, per-token lists, per-image tensors)``; an output rloo
    does not know how to pass row by row is refused (the family is not supported)."""
    unknown = [name for name in encoded if name not in (*TOKEN_LEVEL_KEYS, *IMAGE_KEYS, "input_ids", "attention_mask")]
    if unknown:
        raise ValueError(
            f"the processor returned {unknown} for row {row}, which rloo cannot pass to the model row by row; "
            f"this vision-language family is not supported (known inputs: {', '.join(TOKEN_LEVEL_KEYS + IMAGE_KEYS)})"
        )
    ids = [int(token) for token in encoded["input_ids"][0]]
    token_types = {name: [int(v) for v in encoded[name][0]] for name in TOKEN_LEVEL_KEYS if name in encoded}
    return ids, token_types, {name: encoded[name] for name in IMAGE_KEYS if name in encoded}


def encode_image_prompts(
    prompts: Sequence[Any],
    images: Sequence[Sequence[Any]],
    processor: Any,
    max_prompt_length: int | None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[TokenizedPrompts, VisionInputs]:
    """Render each conversation with the processor's chat template and encode it with its images,
    one prompt at a time (each prompt's pixel inputs stay its own)."""
    ids: list[list[int]] = []
    token_types: list[dict[str, list[int]]] = []
    pixels: list[dict[str, Tensor]] = []
    for row, (prompt, row_images_) in enumerate(zip(prompts, images, strict=True)):
        messages = image_messages(prompt, len(row_images_), row)
        text = processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {})
        )
        encoded = processor(
            text=[text], images=list(row_images_) or None, return_tensors="pt", add_special_tokens=False
        )
        prompt_ids, types, tensors = split_processor_output(encoded, row)
        if max_prompt_length is not None and len(prompt_ids) > max_prompt_length:
            raise ValueError(
                f"prompt {row} is {len(prompt_ids)} tokens with its image tokens, over max_prompt_length="
                f"{max_prompt_length}; a prompt with images is not truncated (it would cut image tokens): raise "
                "max_prompt_length, set it to None, or use smaller images"
            )
        ids.append(prompt_ids)
        token_types.append(types)
        pixels.append(tensors)
    width = max(len(row_ids) for row_ids in ids)
    return TokenizedPrompts(ids=ids, num_truncated=0), VisionInputs.from_prompts(pixels, token_types, width)
