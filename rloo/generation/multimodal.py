"""Image inputs of a vision-language policy, row by row, and the positions its forward passes take.

A processor turns one prompt and its images into token ids (each image expanded to its image
tokens) plus tensors of two kinds, kept apart here because rows are selected differently:

- per-token tensors, one value per prompt token (Gemma3's ``token_type_ids``, Qwen-VL's
  ``mm_token_type_ids``): ``(N, Tp)`` left-padded with 0 like the prompt ids, and extended with 0
  (text) over the completion columns of a forward pass;
- per-image tensors (``pixel_values``, ``image_grid_thw``, ``image_sizes``, Gemma 4's ``image_position_ids``:
  each patch's place in its image's grid, -1 for the padding patches): the images of all rows
  of a forward pass concatenated in row order, which is the order their image tokens appear in.
  Qwen-VL's ``pixel_values`` are flattened patches, ``image_grid_thw.prod(-1)`` of them per image,
  so they are kept per row and never indexed by row number.

Qwen-VL models place image tokens with 3-D rotary positions (``get_rope_index``): a completion
token sits at its text position plus the prompt's ``rope_delta``, so the sampler, the reference
and the training passes compute positions here, from the same ids, mask and image inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

# processor outputs with one value per prompt token
TOKEN_LEVEL_KEYS = ("token_type_ids", "mm_token_type_ids")
# processor outputs with one entry (first dimension) per image, or per patch for Qwen-VL's pixel_values
IMAGE_KEYS = ("pixel_values", "image_grid_thw", "image_sizes", "image_position_ids")


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: ``cumsum(mask) - 1``, clamped at 0. ``(B, L)``."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


@dataclass
class VisionInputs:
    """The image inputs of N prompt rows.

    images: N dicts (one per row) of per-image tensors from :data:`IMAGE_KEYS`, holding that row's
    images only (an empty dict: a row without images); the K rows of a prompt share one dict.
    token_types: ``{name: (N, Tp)}`` per-token tensors from :data:`TOKEN_LEVEL_KEYS`, aligned with the
    rows' left-padded prompt ids.
    """

    images: list[dict[str, Tensor]]
    token_types: dict[str, Tensor]

    @classmethod
    def from_prompts(
        cls, images: Sequence[dict[str, Tensor]], token_types: Sequence[Mapping[str, Sequence[int]]], width: int
    ) -> VisionInputs:
        """P prompts' processor outputs: per-token lists left-padded with 0 to ``width`` columns."""
        names = sorted({name for row in token_types for name in row})
        padded = {name: torch.zeros((len(token_types), width), dtype=torch.long) for name in names}
        for index, row in enumerate(token_types):
            for name in names:
                values = list(row.get(name, ()))
                if values:
                    padded[name][index, width - len(values) :] = torch.tensor(values, dtype=torch.long)
        return cls(list(images), padded)

    def to(self, device: torch.device) -> VisionInputs:
        images = [{name: value.to(device) for name, value in row.items()} for row in self.images]
        return VisionInputs(images, {name: value.to(device) for name, value in self.token_types.items()})

    def repeat(self, k: int) -> VisionInputs:
        """Each row repeated ``k`` times, consecutively (a prompt's K samples)."""
        images = [row for row in self.images for _ in range(k)]
        repeated = {name: value.repeat_interleave(k, dim=0) for name, value in self.token_types.items()}
        return VisionInputs(images, repeated)

    def select(self, rows: Tensor, columns: slice = slice(None)) -> VisionInputs:
        """Rows ``rows`` (1-D indices), per-token tensors cut to the prompt ``columns`` kept."""
        images = [self.images[index] for index in rows.tolist()]
        return VisionInputs(images, {name: value[rows][:, columns] for name, value in self.token_types.items()})

    def pad_left(self, width: int) -> VisionInputs:
        """Per-token tensors left-padded with 0 to ``width`` columns (the prompt ids were)."""
        pad = torch.nn.functional.pad
        padded = {name: pad(value, (width - value.shape[1], 0)) for name, value in self.token_types.items()}
        return VisionInputs(self.images, padded)

    @staticmethod
    def concat(parts: Sequence[VisionInputs | None], width: int) -> VisionInputs | None:
        """The rows of ``parts`` in order, per-token tensors left-padded to ``width`` (None: no part has images)."""
        if all(part is None for part in parts):
            return None
        if any(part is None for part in parts):
            raise ValueError("cannot join rollouts with and without image inputs")
        padded = [part.pad_left(width) for part in parts if part is not None]
        device = next(iter(padded[0].token_types.values())).device if padded[0].token_types else None
        return VisionInputs(
            [row for part in padded for row in part.images],
            {name: torch.cat([part.token_types[name].to(device) for part in padded]) for name in padded[0].token_types},
        )

    def model_inputs(self, completion_width: int = 0) -> dict[str, Tensor]:
        """The forward's keyword inputs for these rows followed by ``completion_width`` text tokens:
        the rows' images concatenated in row order, per-token tensors extended with 0."""
        pad = torch.nn.functional.pad
        inputs = {name: pad(value, (0, completion_width)) for name, value in self.token_types.items()}
        for name in dict.fromkeys(name for row in self.images for name in row):
            inputs[name] = concat_padded([row[name] for row in self.images if name in row])
        return inputs

    @property
    def num_images(self) -> int:
        return sum(_images_in(row) for row in self.images)


def concat_padded(parts: Sequence[Tensor]) -> Tensor:
    """``parts`` concatenated along dim 0, each zero-padded at the end of its other dims to the largest:
    LLaVA-Next's ``pixel_values`` are ``(images, crops, C, H, W)`` with the crops of one processor call
    padded to its most; the model keeps each image's real crops (from ``image_sizes``)."""
    if len(parts) == 1:
        return parts[0]
    shape = [max(sizes) for sizes in zip(*(part.shape[1:] for part in parts), strict=True)]
    padded = []
    for part in parts:
        pad = [
            amount
            for size, most in zip(reversed(part.shape[1:]), reversed(shape), strict=True)
            for amount in (0, most - size)
        ]
        padded.append(torch.nn.functional.pad(part, pad) if any(pad) else part)
    return torch.cat(padded)


def _images_in(row: Mapping[str, Tensor]) -> int:
    if "image_grid_thw" in row:
        return int(row["image_grid_thw"].shape[0])
    pixels = row.get("pixel_values")
    return 0 if pixels is None else int(pixels.shape[0])


# config fields naming the token ids a vision-language model replaces with image (or video) features
PLACEHOLDER_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")


def placeholder_token_ids(model: nn.Module) -> list[int]:
    """The ids of the model's image/video placeholder tokens (empty for a text-only model)."""
    config = getattr(model, "config", None)
    ids = [getattr(config, name, None) for name in PLACEHOLDER_FIELDS]
    return sorted({token for token in ids if isinstance(token, int)})


def rope_index_module(model: nn.Module) -> Any:
    """The submodule with Qwen-VL's ``get_rope_index`` (3-D positions for image tokens), or None."""
    for module in model.modules():
        if callable(getattr(module, "get_rope_index", None)):
            return module
    return None


@dataclass(frozen=True)
class Positions:
    """``position_ids`` for a forward over left-padded rows, and the per-row ``rope_deltas`` of a
    Qwen-VL prompt (``(N, 1)``, None for 1-D positions) that later decoding steps add."""

    position_ids: Tensor
    rope_deltas: Tensor | None = None


def prompt_positions(model: nn.Module, ids: Tensor, mask: Tensor, vision: VisionInputs | None) -> Positions:
    """Positions of ``ids`` (``(B, L)``, ``mask`` its attention): ``cumsum(mask) - 1``; for a Qwen-VL
    model given image inputs, the 3-D positions of ``get_rope_index`` after that text row (the
    ``(4, B, L)`` layout ``generate`` passes), with the rows' ``rope_deltas``."""
    text = position_ids_from_mask(mask)
    if vision is None or "mm_token_type_ids" not in vision.token_types:
        return Positions(text)
    rope = rope_index_module(model)
    if rope is None:
        return Positions(text)
    inputs = vision.model_inputs(ids.shape[1] - vision.token_types["mm_token_type_ids"].shape[1])
    grids = {name: inputs[name] for name in ("image_grid_thw",) if name in inputs}
    positions, deltas = rope.get_rope_index(
        ids, mm_token_type_ids=inputs["mm_token_type_ids"], attention_mask=mask, **grids
    )
    return Positions(torch.cat([text.unsqueeze(0), positions.to(text)]), deltas.to(text))


def step_positions(next_position: Tensor, rope_deltas: Tensor | None) -> Tensor:
    """Positions of one decoding step: ``next_position`` ``(N, 1)`` (text), with the 3-D rows
    ``next_position + rope_delta`` after it for a Qwen-VL prompt."""
    if rope_deltas is None:
        return next_position
    return torch.cat([next_position.unsqueeze(0), (next_position + rope_deltas).unsqueeze(0).expand(3, -1, -1)])
