"""Loading the policy, its tokenizer, PEFT adapters and the frozen reference.

Where we depart from TRL: dropout is switched off in the policy (sampling and training
then see the same distribution, so the importance ratio is exactly 1 on a fresh batch),
and with ``beta == 0`` no reference is built at all. With a PEFT policy the reference is
the same model: with its adapters disabled when they change nothing yet (a fresh LoRA), else
with a frozen copy of its adapter selected (:mod:`rloo.training.setup.reference_adapter`);
never a second copy of the base weights.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rloo.data.images import image_column, is_processor
from rloo.data.loading import column_names
from rloo.generation.device import is_peft_model
from rloo.offline import hub_or_cache
from rloo.training.setup.quantized import is_quantized, loading_kwargs, prepare_quantized
from rloo.training.setup.reference_adapter import (
    adapters_are_identity,
    add_reference_adapter,
    has_reference_adapter,
    reference_adapter_selected,
)
from rloo.training.setup.vision import check_image_inputs, is_vision_language, language_model_only, load_processor


def bf16_supported() -> bool:
    """True on a CUDA device that runs bf16 natively."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_mixed_precision(bf16: bool | None, fp16: bool = False) -> str:
    """Accelerate's ``mixed_precision``: ``fp16`` (autocast and a gradient scaler) when asked on a CUDA
    GPU; asked without one, ``no`` with a warning (TRL's ``fp16=not bf16_supported()`` is True on every
    CPU); else ``bf16`` when asked or (unset) supported, else ``no``. RLOOConfig refuses both True."""
    if fp16:
        if torch.cuda.is_available():
            return "fp16"
        warnings.warn("fp16=True needs a CUDA GPU and there is none: training in fp32 instead", stacklevel=2)
        return "no"
    use_bf16 = bf16_supported() if bf16 is None else bf16
    return "bf16" if use_bf16 else "no"


def check_model_folder(model: str) -> None:
    """A ``model`` that is written as a path (``./x``, ``/x``, ``~/x``) or names an existing folder
    must be a folder saved with ``save_pretrained``: say so before transformers reads it as a hub id."""
    path = Path(model).expanduser()
    if not (model.startswith((".", "/", "~")) or path.exists()):
        return  # a hub id
    if not path.is_dir():
        raise ValueError(
            f"model folder {model!r} does not exist; give a folder written by save_pretrained (config.json + "
            "weights) or a hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'"
        )
    if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise ValueError(
            f"model folder {model!r} has no config.json (nor a PEFT adapter_config.json), so it is not a saved "
            "model; give the folder save_pretrained wrote (a run's final/ or checkpoint-STEP/ folder is one)"
        )


def load_policy(model: str | PreTrainedModel, init_kwargs: Mapping[str, Any] | None) -> PreTrainedModel:
    """A causal LM from a local folder or hub id (float32 weights and ``trust_remote_code`` off unless
    ``init_kwargs`` say otherwise), or as given. A vision-language model (its config has a
    ``vision_config``) loads with ``AutoModelForImageTextToText``, vision tower included."""
    if isinstance(model, PreTrainedModel):
        return model
    if is_peft_model(model):  # type: ignore[arg-type]
        return model  # type: ignore[return-value]
    if not isinstance(model, str):
        raise ValueError(
            f"model must be a path, a hub id, a PreTrainedModel or a peft PeftModel, got {type(model).__name__}"
        )
    check_model_folder(model)
    kwargs = loading_kwargs({"trust_remote_code": False, "dtype": "float32", **(init_kwargs or {})})
    try:
        with hub_or_cache(model):  # no network: the cache, at once (not ~80 s of retries)
            loaded: PreTrainedModel = auto_model_class(model, kwargs["trust_remote_code"]).from_pretrained(
                model, **kwargs
            )
    except OSError as err:
        raise ValueError(
            f"could not load a causal LM from {model!r}: {str(err).strip().rstrip('.')}. Give a local folder "
            "with config.json and weights, or a hub id reachable from this machine."
        ) from err
    except SafetensorError as err:
        damaged = damaged_safetensors(model)
        files = ", ".join(repr(str(file)) for file in damaged) if damaged else f"a .safetensors file of {model!r}"
        raise ValueError(
            f"the weights file {files} is damaged (truncated or corrupt: {str(err).strip().rstrip('.')}); "
            "re-download it (a hub model: delete it from the Hugging Face cache first) or re-save the model "
            "with save_pretrained"
        ) from err
    return loaded


def damaged_safetensors(model: str) -> list[Path]:
    """The ``.safetensors`` files of a local model folder (or of a hub id's cached snapshot) whose
    header safetensors refuses: a file cut short or overwritten. Empty when none is found."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a hub id, or no cache: the message names the model instead
            return []
        if not isinstance(cached, str):
            return []
        folder = Path(cached).parent
    damaged = []
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError):
            damaged.append(file)
    return damaged


def auto_model_class(model: str, trust_remote_code: bool) -> Any:
    """``AutoModelForImageTextToText`` for a vision-language model (its config has a ``vision_config``),
    else ``AutoModelForCausalLM``. A PEFT adapter folder has no config.json: its base model's config
    decides; one that cannot be read leaves it to ``AutoModelForCausalLM`` (as before images)."""
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        config = _adapter_base_config(model, trust_remote_code)
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM


def _adapter_base_config(model: str, trust_remote_code: bool) -> Any:
    adapter = Path(model).expanduser() / "adapter_config.json"
    try:
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        return AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code) if base else None
    except (OSError, ValueError):  # not a local adapter folder, or its base is out of reach
        return None


def load_processing_class(
    model: str | PreTrainedModel,
    processing_class: Any,
    policy: nn.Module,
    datasets: Sequence[Any],
    args: Any = None,
) -> Any:
    """The tokenizer, or a vision-language policy's processor (given, or loaded with ``AutoProcessor``
    when a dataset has an image column) with its tokenizer set up as :func:`load_tokenizer` does;
    an image column the policy would not see is refused (:func:`check_image_inputs`). ``datasets``:
    the train set and the eval set(s): None, one, or a dict of named ones; ``args``: the RLOOConfig
    (``trust_remote_code``, ``chat_template_kwargs``, ``max_prompt_length``; None: off, none, none)."""
    trust_remote_code = bool(getattr(args, "trust_remote_code", False))
    sets = [
        data for item in datasets for data in (item.values() if isinstance(item, dict) else [item]) if data is not None
    ]
    processor = processing_class if is_processor(processing_class) else None
    with_images = any(image_column(column_names(data)) for data in sets)
    if processing_class is None and is_vision_language(policy) and with_images:
        source = model if isinstance(model, str) else str(getattr(policy.config, "name_or_path", ""))
        if not source:
            raise ValueError("the model instance has no name_or_path: pass its processor as processing_class")
        processor = load_processor(source, trust_remote_code)
    if processor is not None:
        load_tokenizer(model, processor.tokenizer, trust_remote_code)
    result = processor if processor is not None else load_tokenizer(model, processing_class, trust_remote_code)
    check_vocabulary_fits(policy, processor.tokenizer if processor is not None else result)
    for data in sets:
        check_image_inputs(data, policy, result, args)
    return result


def check_vocabulary_fits(policy: nn.Module, tokenizer: Any) -> None:
    """Refuse a tokenizer with more tokens than the policy's input embeddings have rows (its high
    ids would index past the table at the first forward). Fewer is normal: padded vocabularies."""
    get_embeddings = getattr(policy, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    rows = getattr(embeddings, "num_embeddings", None)  # kept when ZeRO-3 or FSDP shard the weight
    if not isinstance(rows, int) or not hasattr(tokenizer, "__len__") or len(tokenizer) <= rows:
        return
    name = str(getattr(getattr(policy, "config", None), "name_or_path", "") or "")
    model = f"model {name!r}" if name else "model"
    raise ValueError(
        f"the tokenizer has {len(tokenizer)} tokens but the {model}'s input embeddings have {rows} rows, so "
        f"token ids {rows} and above would index past them; resize the embeddings "
        "(model.resize_token_embeddings(len(tokenizer))) or use the model's own tokenizer"
    )


# the files AutoTokenizer reads a saved tokenizer's settings from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(
    model: str | PreTrainedModel, processing_class: PreTrainedTokenizerBase | None, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The given tokenizer, or the one saved with the model; pad = eos when it has none.

    Padding is on the left, as generation needs.
    """
    tokenizer = processing_class
    if tokenizer is not None and not hasattr(tokenizer, "batch_decode"):
        raise ValueError(
            f"processing_class must be a tokenizer, got a {type(tokenizer).__name__}; load one with "
            f"AutoTokenizer.from_pretrained({tokenizer!r}) or leave it None to use the model's"
        )
    if tokenizer is None:
        source = model if isinstance(model, str) else model.config.name_or_path
        if not source:
            raise ValueError("the model instance has no name_or_path: pass its tokenizer as processing_class")
        try:
            with hub_or_cache(source):
                tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        except Exception as err:
            folder = Path(source).expanduser()
            if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
                raise ValueError(
                    f"model folder {source!r} has no tokenizer files ({' or '.join(TOKENIZER_FILES)}); pass "
                    "processing_class= (the tokenizer) or save the tokenizer into the folder "
                    "(tokenizer.save_pretrained(folder))"
                ) from err
            raise
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token: set tokenizer.eos_token so completions can end")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


# float attributes some modules copy from the config at init (OPT's layers keep `dropout`,
# `activation_dropout` and `layerdrop` as plain floats), so zeroing the config is not enough
DROPOUT_ATTRIBUTES = ("dropout", "attention_dropout", "activation_dropout", "hidden_dropout", "layerdrop")


def draws_dropout(model: nn.Module) -> bool:
    """Whether a training forward of ``model`` draws dropout: an ``nn.Dropout`` or a float dropout
    attribute of a module (:data:`DROPOUT_ATTRIBUTES`) above 0 (:func:`disable_dropout` zeroes them all)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            return True
        if any(isinstance(p := getattr(module, name, None), float) and p > 0 for name in DROPOUT_ATTRIBUTES):
            return True
    return False


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0: ``nn.Dropout`` modules, float dropout attributes modules
    keep, and the config's (attention dropout included)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in DROPOUT_ATTRIBUTES:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def apply_peft(model: Any, peft_config: Any, gradient_checkpointing: bool) -> nn.Module:
    """Wrap the model with PEFT adapters; only adapter weights stay trainable (a vision-language
    model's vision tower gets none unless ``exclude_modules`` is set: :func:`language_model_only`)."""
    from peft import get_peft_model

    peft_config = language_model_only(model, peft_config)
    if gradient_checkpointing:
        # checkpointed blocks need an input that requires grad when the embeddings are frozen
        model.enable_input_require_grads()
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` (its call, not ours; peft <= 0.21.2)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        wrapped: nn.Module = get_peft_model(model, peft_config)
    return wrapped


def train_adapters(model: Any, peft_config: Any, gradient_checkpointing: bool) -> None:
    """An already-adapted ``PeftModel`` (``PeftModel.from_pretrained`` loads adapters frozen): its
    active adapter becomes trainable, the base model stays frozen (the reference: :func:`build_reference`).
    A ``peft_config`` as well is refused: the model has its adapters."""
    if peft_config is not None:
        raise ValueError(
            "model is already a PeftModel (it has adapters) and peft_config asks for new ones: pass "
            "peft_config=None to train its adapters, or pass its base model (model.get_base_model())"
        )
    model.set_requires_grad(model.active_adapters, requires_grad=True)
    if gradient_checkpointing:
        model.enable_input_require_grads()


def enable_gradient_checkpointing(model: nn.Module, extra_kwargs: Mapping[str, Any] | None = None) -> None:
    """Checkpointing with ``use_reentrant=False`` (works with frozen embeddings and LoRA), or as
    ``extra_kwargs`` (``gradient_checkpointing_kwargs``) say."""
    # its keyword-only parameters, and preserve_rng_state, which it documents but reads from **kwargs
    signature = inspect.signature(torch.utils.checkpoint.checkpoint).parameters.values()
    accepted = {p.name for p in signature if p.kind is p.KEYWORD_ONLY} | {"preserve_rng_state"}
    for key in extra_kwargs or {}:
        if key not in accepted:
            raise ValueError(
                f"RLOOConfig.gradient_checkpointing_kwargs has {key!r}, which torch.utils.checkpoint.checkpoint "
                "does not take; use its keywords, e.g. {use_reentrant: false, preserve_rng_state: true}"
            )
    target: Any = model.get_base_model() if is_peft_model(model) else model  # type: ignore[operator]
    kwargs = {"use_reentrant": False, **(extra_kwargs or {})}
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    target.config.use_cache = False


def build_reference(model: str | PreTrainedModel, policy: nn.Module, beta: float, init_kwargs: Any) -> nn.Module | None:
    """The frozen reference policy, or None when none is needed.

    None when ``beta == 0`` (no KL) or when the policy is a PEFT model: the reference is then
    the policy with adapters disabled or, when its adapters already change the model (trained,
    or a non-zero init), with a frozen copy of them added and selected (:func:`reference_mode`).
    Otherwise a second copy: loaded again from the same path, or a deep copy of the given instance.
    """
    if beta == 0:
        return None
    if is_peft_model(policy):
        # a copy an earlier trainer left on this model would be stale: it is renewed, never reused
        if not adapters_are_identity(policy) or has_reference_adapter(policy):
            add_reference_adapter(policy)
        return None
    reference = load_policy(model, init_kwargs) if isinstance(model, str) else copy.deepcopy(policy)
    reference.eval()
    reference.requires_grad_(False)
    return reference


@contextlib.contextmanager
def reference_mode(policy: nn.Module, reference: nn.Module | None) -> Iterator[nn.Module]:
    """Yield the module to compute reference log-probs with: the separate ``reference``, or the PEFT
    policy with its reference adapter selected (if it has one), else with its adapters disabled."""
    if reference is not None:
        yield reference
        return
    if not is_peft_model(policy):
        raise RuntimeError("no reference model: beta > 0 needs one, or a PEFT policy with adapters to disable")
    if has_reference_adapter(policy):
        with reference_adapter_selected(policy):
            yield policy
        return
    with policy.disable_adapter():  # type: ignore[operator]
        yield policy


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


@torch.no_grad()
def check_decodable(model: nn.Module) -> None:
    """Refuse, at start-up, a model whose forward returns no cache: the sampler decodes with it
    (a one-token forward; e.g. RecurrentGemma keeps its state inside its modules)."""
    from rloo.generation.kv_cache import returned_cache

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        returned_cache(model, model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True))
    finally:
        model.train(was_training)


def prepare_policy(
    model: str | PreTrainedModel,
    *,
    init_kwargs: Mapping[str, Any] | None,
    peft_config: Any,
    no_dropout: bool,
    gradient_checkpointing: bool,
    beta: float,
    checkpointing_kwargs: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, nn.Module | None]:
    """``(policy, reference)``: the policy loaded, dropout off, PEFT-wrapped and checkpointed
    as asked, and the frozen reference :func:`build_reference` gives (None when not needed)."""
    if peft_config is not None and not hasattr(peft_config, "peft_type"):
        raise ValueError(
            f"peft_config must be a peft config such as peft.LoraConfig(r=16, lora_alpha=32, ...), got a "
            f"{type(peft_config).__name__}; a run file's `peft:` mapping is converted for you"
        )
    policy: nn.Module = load_policy(model, init_kwargs)
    check_decodable(policy)
    if no_dropout:
        disable_dropout(policy)
    if is_quantized(policy):  # QLoRA: adapters over frozen quantized weights
        prepare_quantized(policy, peft_config, adapted=is_peft_model(policy))
    if is_peft_model(policy):
        train_adapters(policy, peft_config, gradient_checkpointing)
    elif peft_config is not None:
        policy = apply_peft(policy, peft_config, gradient_checkpointing)
    if gradient_checkpointing:
        enable_gradient_checkpointing(policy, checkpointing_kwargs)
    return policy, build_reference(model, policy, beta, init_kwargs)
