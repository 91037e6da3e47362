"""Prompts with images: the ``image`` column end to end, and what is refused at start-up.

The per-family checks (greedy == generate, log-probs == a forward pass, shared prefill, training,
LoRA) are in ``tests/generation/test_model_families.py``; tiny models come from ``tests/helpers/vision.py``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import rloo.training.setup.vision as vision_module
from rloo import RLOOTrainer
from rloo.data.images import encode_image_prompts
from rloo.generation.multimodal import placeholder_token_ids
from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.training.passes import no_grad_logprobs
from tests.helpers.models import config, make_model, make_tokenizer, params, token_id_sum
from tests.helpers.vision import build_vision, tiny_image

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["1+2=", "34+5=", "7=", "10+11+12="]


def image_rows(n: int = 8) -> list[dict[str, Any]]:
    """Rows of one ``image`` each, conversational prompts without image parts (rloo places the image)."""
    return [
        {"prompt": [{"role": "user", "content": PROMPTS[i % 4]}], "image": tiny_image(i % 4), "answer": str(i)}
        for i in range(n)
    ]


def make_trainer(tmp_path: Path, data: Any, model: Any = None, processing_class: Any = None, **overrides: Any) -> Any:
    if model is None:
        processing_class, model = build_vision("llava")
    return RLOOTrainer(
        model=model,
        reward_funcs=token_id_sum,
        args=config(tmp_path, **{"max_steps": 1, **overrides}),
        train_dataset=data,
        processing_class=processing_class,
    )


def test_an_image_column_trains_end_to_end_and_reaches_the_reward_function(tmp_path: Path) -> None:
    seen: dict[str, list[Any]] = {"image": [], "answer": []}

    def reward(completions: list[Any], image: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        seen["image"] += image
        seen["answer"] += answer
        return [float(len(completion[0]["content"])) for completion in completions]

    processor, model = build_vision("qwen2_5_vl")
    trainer = RLOOTrainer(
        model=model,
        reward_funcs=reward,
        args=config(tmp_path, max_steps=2, beta=0.05),
        train_dataset=image_rows(),
        processing_class=processor,
    )
    before = params(trainer.unwrapped_model)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry and "reward" in entry]
    assert len(logged) == 2 and all(math.isfinite(entry["loss"]) for entry in logged)
    assert any(not torch.equal(before[name], value) for name, value in params(trainer.unwrapped_model).items())
    assert len(seen["image"]) == 16  # 2 steps x 2 prompts x K=4, each completion its row's image
    rows = {row["answer"]: row["image"].tobytes() for row in image_rows()}
    assert all(image.tobytes() == rows[answer] for image, answer in zip(seen["image"], seen["answer"], strict=True))
    final = tmp_path / "run" / "final"
    assert (final / "processor_config.json").exists() or (final / "preprocessor_config.json").exists()


def test_a_saved_vision_language_model_loads_with_its_processor_from_a_folder(tmp_path: Path) -> None:
    processor, model = build_vision("llava")
    model.save_pretrained(tmp_path / "llava")
    processor.save_pretrained(tmp_path / "llava")
    trainer = make_trainer(tmp_path, image_rows(), str(tmp_path / "llava"))
    assert type(trainer.unwrapped_model).__name__ == "LlavaForConditionalGeneration"  # not its language model alone
    assert type(trainer.processing_class).__name__ == "LlavaProcessor"
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_rloo_eval_scores_a_saved_vision_language_model_on_prompts_with_images(tmp_path: Path) -> None:
    import datasets

    from rloo.cli.evaluate import EvalSettings, evaluate_model
    from rloo.rewards.calling import RewardFunctions

    processor, model = build_vision("llava")
    model.save_pretrained(tmp_path / "llava")
    processor.save_pretrained(tmp_path / "llava")
    data = datasets.Dataset.from_list(image_rows(4))
    settings = EvalSettings(num_generations=2, max_completion_length=4, batch_size=4)
    result = evaluate_model(str(tmp_path / "llava"), data, RewardFunctions([token_id_sum]), settings)
    assert result["num_prompts"] == 4 and math.isfinite(result["sampled"]["combined_mean"])


@pytest.mark.parametrize("family", ["text", "llava"])
def test_a_peft_adapter_folder_loads_its_base_model_class(tmp_path: Path, family: str) -> None:
    """Before: choosing the auto class read the folder's config.json, which an adapter folder lacks."""
    from peft import LoraConfig, get_peft_model

    from rloo.training.setup.models import load_policy

    model = make_model(make_tokenizer()) if family == "text" else build_vision(family)[1]
    model.save_pretrained(tmp_path / "base")
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    adapted.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    adapted.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists()
    loaded = load_policy(str(tmp_path / "adapter"), None)
    assert type(loaded).__name__ == type(model).__name__
    assert any("lora_" in name for name, _ in loaded.named_parameters())


def test_a_processor_that_cannot_load_is_named_at_start_up(tmp_path: Path) -> None:
    _, model = build_vision("llava")
    model.save_pretrained(tmp_path / "llava")  # no processor files beside it
    with pytest.raises(
        ValueError, match=r"the processor of '.*llava' could not be loaded .*pass it as processing_class"
    ):
        make_trainer(tmp_path, image_rows(), str(tmp_path / "llava"))


def test_an_eval_set_with_images_is_checked_at_start_up_and_evaluated_with_them(tmp_path: Path) -> None:
    processor, model = build_vision("gemma3_vl")
    text_rows = [{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS]
    bad = [{"prompt": text, "image": tiny_image(0)} for text in PROMPTS]
    args = config(tmp_path, max_steps=1, eval_steps=1)
    with pytest.raises(ValueError, match=r"row 0's prompt is plain text in a dataset with images"):
        RLOOTrainer(model, token_id_sum, args, text_rows, {"pictures": bad}, processing_class=processor)
    trainer = RLOOTrainer(model, token_id_sum, args, text_rows, image_rows(4), processing_class=processor)
    images = trainer.evaluate()
    blank = trainer.evaluate([row | {"image": tiny_image(99)} for row in image_rows(4)])
    assert math.isfinite(images["eval_reward"]) and images != blank  # the eval prompts' images were seen


def test_an_image_column_with_a_text_only_model_is_refused_at_start_up_by_model_class(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    with pytest.raises(ValueError, match=r"`image` column but LlamaForCausalLM is a text-only model"):
        make_trainer(tmp_path, image_rows(), make_model(tokenizer), tokenizer)
    assert not (tmp_path / "run").exists()


def test_a_vision_family_not_supported_is_refused_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision_module, "SUPPORTED_VISION_FAMILIES", ("qwen2_5_vl",))
    with pytest.raises(ValueError, match=r"LlavaForConditionalGeneration \(llava\) is a vision-language family rloo"):
        make_trainer(tmp_path, image_rows())
    assert not (tmp_path / "run").exists()


def test_an_image_column_with_a_tokenizer_instead_of_the_processor_is_refused(tmp_path: Path) -> None:
    processor, model = build_vision("llava")
    with pytest.raises(ValueError, match=r"processing_class is a \w+; pass .* processor"):
        make_trainer(tmp_path, image_rows(), model, processor.tokenizer)


def test_a_plain_text_prompt_with_an_image_is_refused_at_start_up_by_row(tmp_path: Path) -> None:
    data = [{"prompt": text, "image": tiny_image(0)} for text in PROMPTS]
    with pytest.raises(ValueError, match=r"row 0's prompt is plain text in a dataset with images"):
        make_trainer(tmp_path, data)


def test_image_parts_that_do_not_match_the_row_s_images_are_refused_at_start_up_by_row(tmp_path: Path) -> None:
    parts = [{"type": "image"}, {"type": "text", "text": "1+2="}]
    data = [{"prompt": [{"role": "user", "content": parts * (1 + (i == 2))}], "image": tiny_image(i)} for i in range(4)]
    with pytest.raises(ValueError, match=r"row 2's prompt has 2 image content parts but the row has 1 images"):
        make_trainer(tmp_path, data)


def test_image_and_images_columns_together_are_refused(tmp_path: Path) -> None:
    data = [row | {"images": [row["image"]]} for row in image_rows(2)]
    with pytest.raises(ValueError, match=r"both an `image` and an `images` column"):
        make_trainer(tmp_path, data)


def test_a_prompt_with_images_over_max_prompt_length_is_refused_not_cut(tmp_path: Path) -> None:
    processor, _ = build_vision("llava")
    prompt = [{"role": "user", "content": "1+2="}]
    with pytest.raises(ValueError, match=r"prompt 0 is 20 tokens with its image tokens, over max_prompt_length=8"):
        encode_image_prompts([prompt], [[tiny_image(0)]], processor, max_prompt_length=8)
    with pytest.raises(ValueError, match=r"over max_prompt_length=16; a prompt with images is not truncated"):
        make_trainer(tmp_path, image_rows(), max_prompt_length=16)  # at start-up, the first row
    assert not (tmp_path / "run").exists()


def test_conversation_content_parts_are_valid_prompts_and_image_parts_place_the_images() -> None:
    processor, _ = build_vision("llava")
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "1+"}, {"type": "image"}, {"type": "text", "text": "2="}]}
    ]
    tokenized, vision = encode_image_prompts([parts], [[tiny_image(0)]], processor, None)
    text = processor.tokenizer.decode(tokenized.ids[0])
    assert text == "1+" + "<image>" * 16 + "2=" and vision.num_images == 1


def test_a_sampled_image_placeholder_ends_the_completion_before_it_as_truncated() -> None:
    """Before: the placeholder reached the forward passes, which raised 'Image features and image
    tokens do not match' (a tiny Qwen2-VL sampled its video token)."""
    processor, model = build_vision("llava")
    (placeholder,) = placeholder_token_ids(model)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    with torch.no_grad():  # the same head, with the placeholder made likely
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[placeholder] = 6.0
    model.lm_head = head
    tokenized, vision = encode_image_prompts(
        [[{"role": "user", "content": text}] for text in PROMPTS], [[tiny_image(i)] for i in range(4)], processor, None
    )
    rollout = generate_rollouts(
        model,
        tokenized.ids,
        [0, 1, 2, 3],
        num_generations=4,
        max_new_tokens=8,
        params=SamplingParams(temperature=1.0),
        eos_token_ids=[processor.tokenizer.eos_token_id],
        pad_token_id=processor.tokenizer.pad_token_id,
        sampling_seed=0,
        vision=vision,
    )
    lengths = rollout.completion_mask.sum(dim=1)
    cut = rollout.truncated & (lengths < 8)
    assert bool(cut.any()), "the placeholder should have been sampled"
    assert not bool((rollout.completion_ids == placeholder).any())
    with torch.no_grad():
        forward = no_grad_logprobs(model, rollout, 1.0, max_rows=16)
    real = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.sampling_logprobs[real], forward[real], atol=1e-4, rtol=0)


def gemma3_with(image_size: int, patch_size: int, mm_tokens_per_image: int) -> Any:
    """The tiny Gemma 3 (``tests/helpers/vision.py``) with another vision grid and token count."""
    _, model = build_vision("gemma3_vl")
    settings = copy.deepcopy(model.config)
    settings.vision_config.image_size, settings.vision_config.patch_size = image_size, patch_size
    settings.mm_tokens_per_image = mm_tokens_per_image
    return transformers.Gemma3ForConditionalGeneration(settings).eval()


def test_a_gemma3_config_that_cannot_pool_its_patches_fails_in_transformers_itself() -> None:
    # TRL's tiny Gemma 3 shape: SigLIP's default 224 / 16 (a 14x14 grid) and Gemma 3's 256 image tokens
    # (16 a side): pooling kernel 14 // 16 = 0, whatever pixels rloo would pass
    model, token = gemma3_with(224, 16, 256), 7
    ids = torch.tensor([[1] + [token] * 256 + [2]])
    model.config.image_token_id = token
    with torch.no_grad(), pytest.raises(RuntimeError, match="stride should not be zero"):
        model(input_ids=ids, pixel_values=torch.zeros(1, 3, 224, 224), token_type_ids=(ids == token).long())


@pytest.mark.parametrize(
    ("image_size", "patch_size", "tokens", "kernel"),
    [(224, 16, 256, 0), (28, 7, 5, 2), (21, 7, 4, 1)],  # kernel 0; not a square; a 3x3 grid pooled to 3x3, not 2x2
)
def test_a_gemma3_config_that_cannot_pool_its_patches_is_refused_at_start_up_naming_the_fields(
    tmp_path: Path, image_size: int, patch_size: int, tokens: int, kernel: int
) -> None:
    processor, _ = build_vision("gemma3_vl")
    model = gemma3_with(image_size, patch_size, tokens)
    fields = (
        rf"vision_config.image_size={image_size} // vision_config.patch_size={patch_size} .*"
        rf"isqrt\(mm_tokens_per_image={tokens}\) = .*, with a kernel of .* = {kernel}.*"
        r"image_size // patch_size a multiple of t"
    )
    with pytest.raises(ValueError, match=fields):
        make_trainer(tmp_path, image_rows(), model, processor)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("image_size", "patch_size", "tokens"), [(28, 7, 4), (28, 7, 16), (28, 14, 4)])
def test_a_gemma3_config_whose_patches_pool_to_its_image_tokens_trains(
    tmp_path: Path, image_size: int, patch_size: int, tokens: int
) -> None:
    built, _ = build_vision("gemma3_vl")
    processor = transformers.Gemma3Processor(  # as many image tokens in a prompt as the projector gives
        built.image_processor, built.tokenizer, chat_template=built.chat_template, image_seq_length=tokens
    )
    model = gemma3_with(image_size, patch_size, tokens)
    trainer = make_trainer(tmp_path, image_rows(4), model, processor)
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])
