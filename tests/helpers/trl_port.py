"""Local stand-ins for what TRL's ``tests/test_rloo_trainer.py`` loads from the hub, for
``tests/training/test_trl_rloo_port.py``: the ``zen`` prompt datasets (plain, conversational,
with images; map-style or streaming) and tiny model folders named after TRL's test models.

Nothing downloads: models are random-init and tiny (``rloo.tiny``, ``tests/helpers/vision.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers

from rloo import RLOOConfig
from rloo.tiny import DEFAULT_CHARS, build_char_tokenizer, build_tiny_llama
from tests.helpers.models import tiny_reward_model
from tests.helpers.vision import build_vision, tiny_image, zen_image_sizes

# the Zen of Python, each line cut where a completion would go on (train: 17 rows, test: 2)
ZEN_TRAIN = [
    "Beautiful is better",
    "Explicit is better than",
    "Simple is",
    "Complex is better than",
    "Flat is better",
    "Sparse is better than",
    "Readability",
    "Special cases aren't special enough",
    "Although practicality",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity,",
    "There should be one",
    "Although that way may not be",
    "Now is better",
    "Although never is often",
    "If the implementation is hard",
]
ZEN_TEST = ["If the implementation is easy", "Namespaces are one honking"]
# prompts of the image datasets: lower-case words the vision tokenizer spells
IMAGE_QUESTIONS = ["what is this", "how many dots", "is it red", "what shape", "is it dark", "what is left"]


def zen(config_name: str = "standard_prompt_only", split: str = "train", streaming: bool = False) -> Any:
    """The ``zen`` prompts as TRL's ``load_dataset("trl-internal-testing/zen", config_name, split=split,
    streaming=streaming)`` shapes them: a ``prompt`` string, or one user message when conversational."""
    lines = ZEN_TRAIN if split == "train" else ZEN_TEST
    if config_name == "conversational_prompt_only":
        rows: list[dict[str, Any]] = [{"prompt": [{"role": "user", "content": line}]} for line in lines]
    else:
        rows = [{"prompt": line} for line in lines]
    data = datasets.Dataset.from_list(rows)
    return data.to_iterable_dataset() if streaming else data


def zen_repository(folder: Path, configs: tuple[str, ...] = ("standard_prompt_only",)) -> Path:
    """A folder laid out as a clone of the hub's ``trl-internal-testing/zen``: one folder of parquet files per
    configuration and a README.md naming them, which ``load_dataset(folder, config, split=...)`` reads."""
    card = ["---", "configs:"]
    for config in configs:
        (folder / config).mkdir(parents=True)
        card += [f"- config_name: {config}", "  data_files:"]
        for split in ("train", "test"):
            zen(config, split).to_parquet(str(folder / config / f"{split}-00000-of-00001.parquet"))
            card += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    (folder / "README.md").write_text("\n".join([*card, "---", ""]))
    return folder


def zen_image(images_per_row: int = 1, n: int = 6, hub_sizes: bool = False) -> datasets.Dataset:
    """Conversational prompts with ``images_per_row`` image parts each and an ``images`` column: 28x28
    images, or (``hub_sizes``) random pixels of the hub dataset's sizes, 32..63 a side."""
    sized = zen_image_sizes(n * images_per_row) if hub_sizes else []
    rows = []
    for i in range(n):
        parts = [{"type": "image"}] * images_per_row + [{"type": "text", "text": IMAGE_QUESTIONS[i % 6]}]
        rows.append(
            {
                "prompt": [{"role": "user", "content": parts}],
                "images": [
                    sized[i * images_per_row + j] if hub_sizes else tiny_image(i + j) for j in range(images_per_row)
                ],
            }
        )
    return datasets.Dataset.from_list(rows)


def port_config(output_dir: Path, **overrides: Any) -> RLOOConfig:
    """TRL's test settings (3 prompts' worth of completions, K = 3, 8 tokens, lr 0.1), bounded to one
    optimizer step (TRL's tests run an epoch of the 17 prompts) and no checkpoint."""
    values: dict[str, Any] = {
        "output_dir": str(output_dir),
        "learning_rate": 0.1,
        "per_device_train_batch_size": 3,
        "num_generations": 3,
        "max_completion_length": 8,
        "max_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 0,
    }
    values.update(overrides)
    return RLOOConfig(**values)


# TRL's test_train models, built small: family -> (model class, config class, fields); 2 layers, hidden size 32
ATTENTION = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
TWO_LAYERS = {**ATTENTION, "num_hidden_layers": 2}
SLIDING = {"head_dim": 8, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}
EXPERTS = {"num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "Cohere2ForCausalLM": ("Cohere2ForCausalLM", "Cohere2Config", {**TWO_LAYERS, **SLIDING}),
    "Glm4MoeForCausalLM": (
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        {**TWO_LAYERS, **EXPERTS, "head_dim": 8, "n_routed_experts": 4, "first_k_dense_replace": 1}
        | {"n_group": 1, "topk_group": 1},
    ),
    "GptOssForCausalLM": (
        "GptOssForCausalLM",
        "GptOssConfig",
        {**TWO_LAYERS, **SLIDING, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "Qwen2ForCausalLM": ("Qwen2ForCausalLM", "Qwen2Config", TWO_LAYERS),
    "Qwen3MoeForCausalLM": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        {**TWO_LAYERS, **EXPERTS, "head_dim": 8, "num_experts": 4},
    ),
    "NemotronHForCausalLM": (
        "NemotronHForCausalLM",
        "NemotronHConfig",
        {**ATTENTION, "layers_block_type": ["mamba", "attention"], "head_dim": 8, "ssm_state_size": 8}
        | {"mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1, "conv_kernel": 4, "expand": 2, "chunk_size": 16},
    ),
}
# the families with a load-balancing loss (GLM-4-MoE balances its experts with a routing bias instead)
ROUTER_LOSS = ("GptOssForCausalLM", "Qwen3MoeForCausalLM")


def _save(folder: Path, model: Any, tokenizer: Any) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def family_model(family: str, tokenizer: Any) -> Any:
    """A tiny random causal LM of ``family`` sized to ``tokenizer``."""
    model_class, config_class, fields = FAMILIES[family]
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    model_config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **ids, **fields)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, model_class)(model_config)


REMOTE_CODE = '''"""A causal LM class that lives beside its weights (loaded with trust_remote_code=True)."""

from transformers import LlamaConfig, LlamaForCausalLM


class RemoteConfig(LlamaConfig):
    model_type = "remote"


class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig
'''


def remote_model(folder: Path) -> str:
    """A tiny Llama saved as ``RemoteForCausalLM``, a class defined by ``remote.py`` in the folder."""
    tokenizer = build_char_tokenizer()
    _save(folder, build_tiny_llama(len(tokenizer), tokenizer=tokenizer), tokenizer)
    (folder / "remote.py").write_text(REMOTE_CODE)
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "remote", "architectures": ["RemoteForCausalLM"]}
    config["auto_map"] = {"AutoConfig": "remote.RemoteConfig", "AutoModelForCausalLM": "remote.RemoteForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def build_hub(root: Path) -> dict[str, str]:
    """Folders standing in for TRL's test model ids, by TRL's short name (``tiny-Qwen2ForCausalLM-2.5``
    is a tiny Llama: rloo's character tokenizer round-trips the prompts exactly)."""
    tokenizer = build_char_tokenizer()
    # a second reward model with another vocabulary order: its token ids differ from the policy's
    other = build_char_tokenizer(DEFAULT_CHARS[::-1])
    hub = {
        "tiny-Qwen2ForCausalLM-2.5": _save(
            root / "policy", build_tiny_llama(len(tokenizer), tokenizer=tokenizer), tokenizer
        ),
        "tiny-Qwen2ForSequenceClassification-2.5": _save(root / "reward", tiny_reward_model(tokenizer), tokenizer),
        "tiny-Qwen3ForSequenceClassification": _save(root / "reward2", tiny_reward_model(other), other),
        "tiny-RemoteForCausalLM": remote_model(root / "remote"),
    }
    for family in FAMILIES:
        hub[f"tiny-{family}"] = _save(root / family, family_model(family, tokenizer), tokenizer)
    return hub


def vision_folder(root: Path, family: str) -> tuple[str, Any]:
    """A tiny vision-language model of ``family`` saved with its processor (``tests/helpers/vision.py``),
    and the processor. A Qwen-VL or Gemma 4 folder also gets the video processor's settings a hub folder has
    (the test processors have none; Gemma 4's its audio feature extractor's too, which it loads first): loading
    it needs torchvision, as loading the hub's does."""
    processor, model = build_vision(family)
    folder = _save(root / family, model, processor)
    video_processor = "Qwen2VLVideoProcessor" if family.startswith("qwen") else VIDEO_PROCESSORS.get(family)
    if family == "gemma4_vl":
        transformers.Gemma4AudioFeatureExtractor().save_pretrained(folder)
    if video_processor is not None:
        video = {"video_processor_type": video_processor, "processor_class": type(processor).__name__}
        (Path(folder) / "video_preprocessor_config.json").write_text(json.dumps(video))
    return folder, processor


# the video processors (torchvision's) the hub's processors of these families are built with (Qwen-VL's: above)
VIDEO_PROCESSORS = {"gemma4_vl": "Gemma4VideoProcessor"}
