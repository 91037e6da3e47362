"""Tiny, deterministic, offline models and tokenizers for tests, the demo and benchmarks.

Nothing here downloads: the tokenizer is built with the ``tokenizers`` library (one token
per character), the model is a random-init Llama. Llama is used on purpose: in
transformers 5 a folder saved as another architecture (e.g. Qwen2) may load that model's
own tokenizer class instead of ours and silently change tokenization.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

DEFAULT_CHARS = string.ascii_letters + string.digits + " +-=*/?.,:;!()<>[]{}'\"\n"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# A minimal chat template: enough for conversational prompts in tests and the demo.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)

# A chat template with tools (the Hermes format Qwen2.5/Qwen3 use): the tool names in a system line, an
# assistant turn's calls as <tool_call>{json}</tool_call>, each turn closed by EOS, tool results as <tool>
# lines. Each message is appended to the rendering of those before it, so tool results can be inserted
# as tokens after a sampled turn. Needs "_" among the tokenizer's characters (TOOL_CHARS).
TOOLS_LINE = "{% if tools %}<system>tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}.\n{% endif %}"
# what follows an assistant turn's content: its calls and EOS, the other roles' lines, the generation prompt
TOOL_TEMPLATE_TAIL = (
    "{% for c in m['tool_calls'] or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}</s>\n"
    "{% elif m['role'] == 'tool' %}<tool>{{ m['content'] }}\n"
    "{% else %}<{{ m['role'] }}>{{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOL_CHAT_TEMPLATE = (
    TOOLS_LINE
    + "{% for m in messages %}{% if m['role'] == 'assistant' %}<assistant>{{ m['content'] }}"
    + TOOL_TEMPLATE_TAIL
)
TOOL_CHARS = DEFAULT_CHARS + "_"


def build_char_tokenizer(
    chars: str = DEFAULT_CHARS, with_pad: bool = True, vocab_size: int | None = None
) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``chars`` plus the special tokens.

    Text made of ``chars`` round-trips exactly through encode/decode. With
    ``with_pad=False`` it has no pad token (to test the pad = eos fallback). ``vocab_size``
    pads the vocabulary with ``<extra_i>`` tokens (never produced by encoding, decoded as
    themselves) to give benchmarks a realistic softmax size.
    """
    unique = list(dict.fromkeys(chars))
    tokens = [*SPECIAL_TOKENS, *unique]
    if vocab_size is not None:
        tokens += [f"<extra_{i}>" for i in range(max(0, vocab_size - len(tokens)))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>" if with_pad else None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llama(
    vocab_size: int,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
    initializer_range: float = 0.02,
) -> LlamaForCausalLM:
    """A random-init Llama causal LM, deterministic for a given ``seed``; its weights drawn with standard deviation
    ``initializer_range`` (transformers' 0.02 leaves a tiny model's layers nearly silent: its output barely depends
    on a LoRA adapter's weights until they are large)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    if tokenizer is not None:
        config.pad_token_id = tokenizer.pad_token_id
        config.bos_token_id = tokenizer.bos_token_id
        config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def save_tiny_model(
    directory: str | Path,
    chars: str = DEFAULT_CHARS,
    vocab_size: int | None = None,
    chat_template: str = CHAT_TEMPLATE,
    **model_kwargs: Any,
) -> Path:
    """Write a tiny Llama and its character tokenizer to ``directory`` (a local "hub id"); ``chat_template``
    :data:`TOOL_CHAT_TEMPLATE` (with ``chars`` :data:`TOOL_CHARS`) for a model that may call tools."""
    path = Path(directory)
    tokenizer = build_char_tokenizer(chars, vocab_size=vocab_size)
    tokenizer.chat_template = chat_template
    model = build_tiny_llama(len(tokenizer), tokenizer=tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
