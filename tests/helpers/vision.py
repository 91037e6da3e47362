"""Tiny random vision-language models, their processors and images, built locally (nothing downloads).

Each family gets a one-character-per-token tokenizer with the family's image special tokens,
the family's own processor class around a PIL-backend image processor (this machine has no
torchvision), a chat template that renders image content parts as the family's image
placeholder, and a model of 2 text layers (hidden size 32) and a 1-layer vision tower, with
weights re-drawn larger than the init so next-token distributions are peaked.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL processors take a video processor, which needs torchvision: the test
processors subclass them without one (images only; rloo passes no videos).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast
from transformers.processing_utils import ProcessorMixin

CHARS = "0123456789+= abcdefghijklmnopqrstuvwxyz?<>\n"
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
IMAGE_SPECIAL = (
    "<image>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
GEMMA_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GQA = {**TEXT, "num_key_value_heads": 2}
VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
SIGLIP = {**VISION, "image_size": 28, "patch_size": 7}
CLIP = {**VISION, "model_type": "clip_vision_model", "image_size": 28, "patch_size": 7, "projection_dim": 16}


def chat_template(image: str) -> str:
    """The messages' contents, back to back (short prompts whose ends differ); an image content part
    renders as ``image``."""
    return (
        "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}{% endfor %}"
    )


def vision_tokenizer(named_tokens: dict[str, str] | None = None) -> PreTrainedTokenizerFast:
    """One token per character of :data:`CHARS`, plus the special and image tokens."""
    tokens = [*SPECIAL, *IMAGE_SPECIAL, *dict.fromkeys(CHARS)]
    backend = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        extra_special_tokens=named_tokens or {},
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_SPECIAL)})
    return tokenizer


def _qwen_processor(base: type) -> type:
    class ImageOnlyProcessor(base):  # type: ignore[misc, valid-type]
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **_: Any):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
            for name in ("image_token", "video_token", "vision_start_token", "vision_end_token"):
                setattr(self, f"{name}_id", tokenizer.convert_tokens_to_ids(getattr(self, name)))
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    ImageOnlyProcessor.__name__ = base.__name__
    return ImageOnlyProcessor


def _ids(tokenizer: Any) -> dict[str, int]:
    return {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id}


def _qwen(version: str) -> tuple[Any, Any]:
    tokenizer = vision_tokenizer()
    image_processor = transformers.Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    base = transformers.Qwen2_5_VLProcessor if version == "2.5" else transformers.Qwen2VLProcessor
    processor = _qwen_processor(base)(image_processor, tokenizer, chat_template=chat_template(QWEN_IMAGE))
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
    text = {**GQA, "vocab_size": len(tokenizer), "rope_parameters": rope, "eos_token_id": tokenizer.eos_token_id}
    text |= _ids(tokenizer)
    vision = {"depth": 1, "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    if version == "2.5":
        vision |= {"hidden_size": 16, "intermediate_size": 32, "out_hidden_size": 32}
        vision |= {"fullatt_block_indexes": [0], "window_size": 28}
        config_class, model_class = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    else:
        vision |= {"embed_dim": 16, "mlp_ratio": 2, "hidden_size": 32}
        config_class, model_class = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    config = _qwen_config(config_class, processor, text, vision, eos_token_id=tokenizer.eos_token_id, **_ids(tokenizer))
    return processor, model_class(config)


def _qwen_config(config_class: Any, processor: Any, text: Any, vision: Any, **fields: Any) -> Any:
    """A Qwen-VL family's config, its image, video and vision start/end token ids the processor's."""
    return config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=processor.vision_start_token_id,
        vision_end_token_id=processor.vision_end_token_id,
        tie_word_embeddings=False,
        **fields,
    )


def _qwen3(version: str) -> tuple[Any, Any]:
    """Qwen3-VL, or Qwen3.5 (its text model hybrid: a gated-delta linear-attention layer and an
    attention layer); 16-pixel patches, a learned position grid, interleaved 3-D rotary sections."""
    tokenizer = vision_tokenizer()
    image_processor = transformers.Qwen2VLImageProcessorPil(
        min_pixels=32 * 32, max_pixels=64 * 64, patch_size=16, merge_size=2, temporal_patch_size=2
    )
    processor = _qwen_processor(transformers.Qwen3VLProcessor)(
        image_processor, tokenizer, chat_template=chat_template(QWEN_IMAGE)
    )
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0, "mrope_interleaved": True}
    text = {**GQA, "head_dim": 8, "vocab_size": len(tokenizer), "rope_parameters": rope}
    text |= {"eos_token_id": tokenizer.eos_token_id, **_ids(tokenizer)}
    vision = {"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16}
    vision |= {"spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 32, "num_position_embeddings": 16}
    if version == "3.5":
        text |= {"layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4}
        text |= {"linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2}
        text |= {"linear_num_value_heads": 4}
        config_class, model_class = transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration
    else:
        vision |= {"deepstack_visual_indexes": [0]}
        config_class, model_class = transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration
    return processor, model_class(_qwen_config(config_class, processor, text, vision))


def _gemma3() -> tuple[Any, Any]:
    tokenizer = vision_tokenizer(GEMMA_TOKENS)
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    processor = transformers.Gemma3Processor(
        image_processor, tokenizer, chat_template=chat_template("<start_of_image>"), image_seq_length=4
    )
    config = transformers.Gemma3Config(
        text_config={**GQA, "vocab_size": len(tokenizer), "head_dim": 8, **_ids(tokenizer)}
        | {"sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"], "query_pre_attn_scalar": 8},
        vision_config=SIGLIP,
        mm_tokens_per_image=4,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **_ids(tokenizer),
    )
    return processor, transformers.Gemma3ForConditionalGeneration(config)


class _ImageOnlyGemma4(transformers.Gemma4Processor):  # type: ignore[misc]
    """Gemma 4's processor without its video processor (which needs torchvision) and audio feature extractor:
    images only, as rloo passes them."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **_: Any):
        self.image_seq_length = image_processor.max_soft_tokens
        self.image_token_id = tokenizer.image_token_id
        self.boi_token, self.eoi_token, self.image_token = (
            tokenizer.boi_token,
            tokenizer.eoi_token,
            tokenizer.image_token,
        )
        self.video_token, self.video_token_id = "<|video_pad|>", tokenizer.convert_tokens_to_ids("<|video_pad|>")
        self.audio_seq_length, self.audio_ms_per_token = 750, 40
        self.audio_token_id = self.audio_token = None
        self.boa_token = self.eoa_token = "<s>"  # its validate_inputs reads them even without audio
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


_ImageOnlyGemma4.__name__ = "Gemma4Processor"


def _gemma4() -> tuple[Any, Any]:
    """Gemma 4 with its vision tower: per-layer head sizes (``head_dim`` 8 sliding, ``global_head_dim`` 16 full),
    per-layer inputs, and 70 soft tokens an image (its image processor's least ``max_soft_tokens``)."""
    tokenizer = vision_tokenizer(GEMMA_TOKENS)
    image_processor = transformers.Gemma4ImageProcessorPil(patch_size=7, max_soft_tokens=70, pooling_kernel_size=3)
    processor = _ImageOnlyGemma4(image_processor, tokenizer, chat_template=chat_template("<image_soft_token>"))
    text = {**GQA, "vocab_size": len(tokenizer), "head_dim": 8, "global_head_dim": 16, "sliding_window": 4}
    text |= {"layer_types": ["sliding_attention", "full_attention"], "hidden_size_per_layer_input": 8}
    vision = {**VISION, "num_key_value_heads": 2, "head_dim": 8, "patch_size": 7, "pooling_kernel_size": 3}
    config = transformers.Gemma4Config(
        text_config=text | _ids(tokenizer),
        vision_config=vision,
        boi_token_id=tokenizer.boi_token_id,
        eoi_token_id=tokenizer.eoi_token_id,
        image_token_id=tokenizer.image_token_id,
        video_token_id=processor.video_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **_ids(tokenizer),
    )
    return processor, transformers.Gemma4ForConditionalGeneration(config)


def _llava(next_: bool) -> tuple[Any, Any]:
    tokenizer = vision_tokenizer()
    size = {"size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28}}
    common = {"patch_size": 7, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
    text = {**GQA, "model_type": "llama", "vocab_size": len(tokenizer), **_ids(tokenizer)}
    fields = {"image_token_index": tokenizer.convert_tokens_to_ids("<image>"), "vision_feature_layer": -1}
    fields |= {"vision_feature_select_strategy": "default", "eos_token_id": tokenizer.eos_token_id}
    if next_:
        pinpoints = [[28, 28], [28, 56], [56, 28]]  # a square image gets 2 crops, a wide or tall one 3
        image_processor = transformers.LlavaNextImageProcessorPil(image_grid_pinpoints=pinpoints, **size)
        processor = transformers.LlavaNextProcessor(
            image_processor, tokenizer, chat_template=chat_template("<image>"), **common
        )
        config = transformers.LlavaNextConfig(
            text_config=text, vision_config=CLIP, image_grid_pinpoints=pinpoints, **fields
        )
        model_class = transformers.LlavaNextForConditionalGeneration
    else:
        image_processor = transformers.LlavaImageProcessorPil(**size)
        processor = transformers.LlavaProcessor(
            image_processor, tokenizer, chat_template=chat_template("<image>"), **common
        )
        config = transformers.LlavaConfig(text_config=text, vision_config=CLIP, **fields)
        model_class = transformers.LlavaForConditionalGeneration
    config.tie_word_embeddings = False
    return processor, model_class(config)


def llava_next_hub_shaped() -> tuple[Any, Any]:
    """LLaVA-NeXT as TRL's ``trl-internal-testing/tiny-LlavaNextForConditionalGeneration`` is built (TRL's
    ``scripts/generate_tiny_models``): ``llava-hf/llava-v1.6-mistral-7b-hf``'s configuration and processor
    settings (336-pixel CLIP crops of 14-pixel patches, its five grid pinpoints, the feature layer -2 of a
    3-layer tower, a Mistral text model), with hidden sizes of 16 and this module's tokenizer; its
    intermediate sizes are cut from 14,336 and 4,096 to 64 (they change no shape but the MLPs')."""
    tokenizer = vision_tokenizer()
    pinpoints = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    size = {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}}
    image_processor = transformers.LlavaNextImageProcessorPil(image_grid_pinpoints=pinpoints, **size)
    processor = transformers.LlavaNextProcessor(
        image_processor,
        tokenizer,
        chat_template=chat_template("<image>"),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    text = {"model_type": "mistral", "hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 1e6, "sliding_window": None}
    vision = {"model_type": "clip_vision_model", "hidden_size": 16, "intermediate_size": 64, "num_attention_heads": 4}
    vision |= {"num_hidden_layers": 3, "image_size": 336, "patch_size": 14, "projection_dim": 768}
    config = transformers.LlavaNextConfig(
        text_config=text | {"vocab_size": len(tokenizer), **_ids(tokenizer)},
        vision_config=vision,
        image_grid_pinpoints=pinpoints,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **_ids(tokenizer),
    )
    return processor, transformers.LlavaNextForConditionalGeneration(config)


VISION_FAMILIES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "qwen2_5_vl": lambda: _qwen("2.5"),
    "qwen2_vl": lambda: _qwen("2"),
    "qwen3_vl": lambda: _qwen3("3"),
    "qwen3_5_vl": lambda: _qwen3("3.5"),
    "gemma3_vl": _gemma3,
    "gemma4_vl": _gemma4,
    "llava": lambda: _llava(next_=False),
    "llava_next": lambda: _llava(next_=True),
}
# shapes of TRL's hub test models (their prompts are over a thousand tokens: not in the family checks)
HUB_SHAPED: dict[str, Callable[[], tuple[Any, Any]]] = {"llava_next_hub_shaped": llava_next_hub_shaped}


def build_vision(family: str, seed: int = 0) -> tuple[Any, Any]:
    """``(processor, model)``: a tiny random vision-language model of ``family`` with peaked weights."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        processor, model = {**VISION_FAMILIES, **HUB_SHAPED}[family]()
        with torch.no_grad():  # larger than the init: each token's context (and image) weighs on its logits
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, 0.3)
            for name, parameter in model.named_parameters():
                if name.endswith("projection_weight"):  # Gemma3's projector is a bare matrix, zero at init
                    parameter.normal_(0.0, 0.3)
            for embedding in (model.get_input_embeddings(), model.get_output_embeddings()):
                embedding.weight.normal_(0.0, 1.0)
    return processor, model.eval()


def tiny_image(index: int, size: tuple[int, int] = (28, 28)) -> Image.Image:
    """A deterministic RGB image whose pixels depend on ``index`` (a different picture per index)."""
    generator = torch.Generator().manual_seed(1000 + index)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), mode="RGB")


def zen_image_sizes(n: int, seed: int = 0) -> list[Image.Image]:
    """``n`` random-pixel images of TRL's ``zen-image`` sizes: height and width each drawn from 32..63."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(32, 64, (n, 2), generator=generator).tolist()
    return [
        Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8).numpy(), mode="RGB")
        for h, w in sizes
    ]
