"""The fused LM head against the plain float32 path: ``log_softmax(h @ W^T / T).gather`` and the entropy,
their gradients in ``hidden``, ``weight`` and ``bias``, by hand and as properties, with the torch fold and
with the Triton kernels run by Triton's interpreter; no float32 ``(n, V)`` tensor; the seam that picks
the head kernel."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import rloo.forward.fused_head as fused_head
from rloo.forward.fused_head import KERNEL_VARIABLE, fused_logprobs, head_kernel
from rloo.forward.lm_head import chunked_head_logprobs
from rloo.forward.logprobs import TokenLogprobs, TokenScore, completion_logprobs
from tests.generation.test_model_families import PROMPTS, build
from tests.helpers.models import make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
LN2 = math.log(2.0)
TRITON_TESTS = 5  # the tests of the Triton kernels: the four of either fold, and the property


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module")
def interpreted_triton() -> None:
    """The Triton kernels as Triton's interpreter runs them, on CPU tensors. ``triton.jit`` (which
    ``triton.language``'s own reductions use) reads ``TRITON_INTERPRET`` at import, and triton cannot be
    imported twice in a process: these tests run in a process of their own started with it set
    (:func:`test_the_triton_kernels_in_triton_s_interpreter`)."""
    if not interpreting():
        pytest.skip("run with TRITON_INTERPRET=1 by test_the_triton_kernels_in_triton_s_interpreter")
    pytest.importorskip("triton", reason="triton is not installed (the dev extra installs it on Linux)")


@pytest.mark.system
def test_the_triton_kernels_in_triton_s_interpreter() -> None:
    """This file's ``triton`` tests, in a process started with ``TRITON_INTERPRET=1``: every one passes."""
    if interpreting():
        pytest.skip("the process this test starts")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (the dev extra installs it on Linux)")
    command = [
        sys.executable,
        "-m",
        "pytest",
        __file__,
        "-o",
        "addopts=",
        "-q",
        "-k",
        "triton",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(command, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(rf"\b{TRITON_TESTS} passed, 1 skipped\b", done.stdout), done.stdout[-1000:]


@pytest.fixture(params=["torch", "triton"])
def fold(request: pytest.FixtureRequest) -> str:
    """The torch fold, and the Triton kernels in Triton's interpreter."""
    if request.param == "triton":
        request.getfixturevalue("interpreted_triton")
    return str(request.param)


def plain(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain float32 path: the full logits, log-softmaxed; the entropy ``-sum_v p_v log p_v``."""
    logits = hidden.float() @ weight.float().t() + (0.0 if bias is None else bias.float())
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, ids.unsqueeze(1)).squeeze(1), -(logp.exp() * logp).sum(dim=-1)


def leaves(*tensors: torch.Tensor | None) -> list[Any]:
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]


def grads_of(
    fn: Any, tensors: list[Any], weights: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """``fn(*tensors)``'s log-probs and entropies, and the gradients of ``sum(w1 logp + w2 H)``."""
    logprobs, entropy = fn(*tensors)
    ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    return logprobs.detach(), entropy.detach(), [None if t is None else t.grad for t in tensors]


def test_by_hand(fold: str) -> None:
    """``z = h W^T / T = [0, ln 2, 0]``: ``p = [1/4, 1/2, 1/4]``, ``H = 3/2 ln 2``; the target at the last
    vocabulary index, in a tile of its own (vocab tile 2 of V = 3), a token tile of 1 (n = 2).
    ``d log p_y / dlogits = (onehot(y) - p) / T``: for ``y = 2``, ``[-1/2, -1, 3/2]``, and
    ``grad_h = that @ W = [-1/2 + 3/2, -1] = [1, -1]``; for ``y = 1``, ``[-1/2, 1, -1/2] @ W = [-1, 1]``."""
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    hidden, ids = torch.tensor([[0.0, LN2 / 2], [0.0, LN2 / 2]], requires_grad=True), torch.tensor([2, 1])
    logprobs, entropy = fused_logprobs(hidden, weight, None, ids, 0.5, True, fold=fold, token_tile=1, vocab_tile=2)
    assert entropy is not None
    torch.testing.assert_close(logprobs, torch.tensor([-2 * LN2, -LN2]), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, torch.tensor([1.5 * LN2] * 2), rtol=0, atol=1e-6)
    logprobs.sum().backward()
    torch.testing.assert_close(hidden.grad, torch.tensor([[1.0, -1.0], [-1.0, 1.0]]), rtol=0, atol=1e-6)


def test_the_entropy_gradient_is_minus_p_times_z_less_its_mean(fold: str) -> None:
    """``dH/dz_v = -p_v (z_v - sum_u p_u z_u)``: at ``z = [0, ln 2, 0]``, ``sum p z = ln 2 / 2``, so
    ``dH/dz = [ln 2 / 8, -ln 2 / 4, ln 2 / 8]``; with ``T = 1`` and ``W = I`` that is ``grad_h``."""
    hidden = torch.tensor([[0.0, LN2, 0.0]], requires_grad=True)
    _, entropy = fused_logprobs(hidden, torch.eye(3), None, torch.tensor([0]), 1.0, True, True, fold=fold)
    assert entropy is not None
    entropy.sum().backward()
    torch.testing.assert_close(hidden.grad, torch.tensor([[LN2 / 8, -LN2 / 4, LN2 / 8]]), rtol=0, atol=1e-6)


def shapes(min_tile: int = 1) -> st.SearchStrategy[tuple[int, int, int, int, int, float, bool, int]]:
    """Tokens, hidden size, vocabulary, tiles (rarely dividing them), temperature, bias, seed."""
    return st.tuples(
        st.integers(1, 24),
        st.integers(1, 6),
        st.integers(2, 70),
        st.integers(min_tile, 9),
        st.integers(min_tile, 40),
        st.sampled_from([1.0, 0.7, 1.6]),
        st.booleans(),
        st.integers(0, 2**16),
    )


def check_against_plain(fold: str, case: tuple[int, int, int, int, int, float, bool, int]) -> None:
    n, d, v, token_tile, vocab_tile, temperature, with_bias, seed = case
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, d, generator=gen) * 2, torch.randn(v, d, generator=gen)
    bias = torch.randn(v, generator=gen) if with_bias else None
    ids = torch.randint(0, v, (n,), generator=gen)
    ids[-1] = v - 1  # a target at the last vocabulary index, in the last (partial) tile
    weights = (torch.randn(n, generator=gen), torch.randn(n, generator=gen))

    def fused(h: Any, w: Any, b: Any) -> Any:
        return fused_logprobs(h, w, b, ids, temperature, True, True, fold, token_tile, vocab_tile)  # type: ignore[arg-type]

    ours = grads_of(fused, leaves(hidden, weight, bias), weights)
    theirs = grads_of(lambda h, w, b: plain(h, w, b, ids, temperature), leaves(hidden, weight, bias), weights)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-5)
    for mine, other in zip(ours[2], theirs[2], strict=True):
        if other is not None:
            torch.testing.assert_close(mine, other, rtol=1e-5, atol=1e-5)


@given(shapes())
def test_torch_fold_equals_the_plain_path(case: tuple[int, int, int, int, int, float, bool, int]) -> None:
    check_against_plain("torch", case)


@pytest.mark.usefixtures("interpreted_triton")
@settings(max_examples=12)  # the interpreter runs each program in numpy: fewer, larger tiles
@given(shapes(min_tile=4))
def test_triton_kernels_equal_the_plain_path(case: tuple[int, int, int, int, int, float, bool, int]) -> None:
    check_against_plain("triton", case)


def test_large_logits_keep_the_entropy_exact(fold: str) -> None:
    """Logits near 60 with a tiny entropy: ``logsumexp(z) - sum p z`` would cancel to 1e-4 in float32; the
    fold's sums kept relative to the running max do not."""
    hidden = torch.tensor([[60.0, 50.0, 45.0, 60.0 - 1e-3]])
    _, entropy = fused_logprobs(hidden, torch.eye(4), None, torch.tensor([0]), 1.0, True, fold=fold, vocab_tile=3)
    _, expected = plain(hidden.double(), torch.eye(4).double(), None, torch.tensor([0]), 1.0)
    assert entropy is not None
    assert abs(float(entropy[0]) - float(expected[0])) < 1e-6


def test_bf16_inputs_are_within_bf16_rounding(fold: str) -> None:
    """bf16 hidden states and weight: bf16 GEMM tiles, float32 statistics, float32 gradients rounded to bf16
    at the end; against the plain path on the same (bf16-valued) inputs in float32."""
    gen = torch.Generator().manual_seed(0)
    hidden, weight, bias = torch.randn(13, 16, generator=gen), torch.randn(50, 16, generator=gen) / 4, None
    ids = torch.randint(0, 50, (13,), generator=gen)
    weights = (torch.randn(13, generator=gen), torch.randn(13, generator=gen))

    def fused(h: Any, w: Any, b: Any) -> Any:
        return fused_logprobs(h, w, b, ids, 0.7, True, True, fold, 8, 16)  # type: ignore[arg-type]

    bf16 = leaves(hidden.bfloat16(), weight.bfloat16(), bias)
    ours = grads_of(fused, bf16, weights)
    theirs = grads_of(lambda h, w, b: plain(h, w, b, ids, 0.7), leaves(*(t.float() for t in bf16[:2]), None), weights)
    assert ours[0].dtype == torch.float32 and ours[2][1].dtype == torch.bfloat16
    torch.testing.assert_close(ours[0], theirs[0], rtol=0.02, atol=0.05)
    torch.testing.assert_close(ours[1], theirs[1], rtol=0.02, atol=0.05)
    for mine, other in zip(ours[2][:2], theirs[2][:2], strict=True):
        torch.testing.assert_close(mine.float(), other, rtol=0.02, atol=0.05)


def test_an_entropy_read_as_a_metric_sends_no_gradient() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(5, 4, generator=gen, requires_grad=True), torch.randn(9, 4, generator=gen)
    ids = torch.randint(0, 9, (5,), generator=gen)
    logprobs, entropy = fused_logprobs(hidden, weight, None, ids, 1.0, True, False, "torch", 2, 4)
    assert entropy is not None and not entropy.requires_grad
    logprobs.sum().backward()
    expected = leaves(hidden)[0]
    plain(expected, weight, None, ids, 1.0)[0].sum().backward()
    torch.testing.assert_close(hidden.grad, expected.grad, rtol=1e-5, atol=1e-6)
    assert fused_logprobs(hidden, weight, None, ids, with_entropy=False)[1] is None


class Float32Outputs(TorchDispatchMode):
    """The shapes of the float32 tensors every op dispatched while active returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.shapes.append(tuple(t.shape))
        return out


def float32_logits_sized(run: Any, n: int, vocab: int) -> list[tuple[int, ...]]:
    """The float32 tensors of ``n * vocab`` elements or more that ``run()`` (a forward and backward) makes."""
    with Float32Outputs() as recorded:
        run()
    return [shape for shape in recorded.shapes if math.prod(shape) >= n * vocab]


def test_no_float32_tensor_of_the_full_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 inputs as on a GPU (48 tokens, V = 200, tiles of 32 x 64): the fused head's float32 tensors are
    tiles and per-token statistics, never ``(n, V)``; the chunked head's score makes that copy (the check
    can fail). The weight's float32 gradient is ``(V, D)``, smaller: D = 16 < n."""
    gen = torch.Generator().manual_seed(2)
    n, d, vocab = 48, 16, 200
    hidden = torch.randn(n, d, generator=gen).bfloat16().requires_grad_(True)
    head = torch.nn.Linear(d, vocab, bias=False).bfloat16()
    ids = torch.randint(0, vocab, (n,), generator=gen)

    def fused() -> None:
        logprobs, entropy = fused_logprobs(hidden, head.weight, None, ids, 0.7, True, True, "torch", 32, 64)
        assert entropy is not None
        (logprobs.sum() + entropy.sum()).backward()

    def chunked() -> None:
        monkeypatch.setenv(KERNEL_VARIABLE, "chunked")
        score = TokenScore(0.7, True, True)
        mask = torch.ones(1, n, dtype=torch.long)
        logprobs, entropy = chunked_head_logprobs(head, head, hidden[None], ids[None], mask, score, True)
        assert entropy is not None
        (logprobs.sum() + entropy.sum()).backward()

    assert float32_logits_sized(fused, n, vocab) == []
    assert (1, n, vocab) in float32_logits_sized(chunked, n, vocab)


def test_the_head_kernel_by_device_variable_and_head(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, head = torch.device("cpu"), torch.nn.Linear(4, 7)
    monkeypatch.delenv(KERNEL_VARIABLE, raising=False)
    assert head_kernel(head, cpu, None) == "fused"  # a CPU's default: measured faster
    # CUDA's default stays the chunked head until a GPU run has measured the fused one
    assert head_kernel(torch.nn.Linear(4, 7, device="meta"), torch.device("meta"), None) == "chunked"
    monkeypatch.setenv(KERNEL_VARIABLE, "fused")
    assert head_kernel(head, cpu, None) == "fused"
    assert head_kernel(head, cpu, 30.0) == "chunked"  # a soft-capped head (Gemma2/3)

    class Scaled(torch.nn.Linear):  # a head that does more than its product (LoRA, a quantized head)
        pass

    assert head_kernel(Scaled(4, 7), cpu, None) == "chunked"
    assert head_kernel(head, torch.device("meta"), None) == "chunked"  # the weight elsewhere (offloaded)
    monkeypatch.setenv(KERNEL_VARIABLE, " Chunked ")
    assert head_kernel(head, cpu, None) == "chunked"
    monkeypatch.setenv(KERNEL_VARIABLE, "liger")
    with pytest.raises(ValueError, match=r"RLOO_LM_HEAD_KERNEL='liger': expected one of \['chunked', 'fused'\]"):
        head_kernel(head, cpu, None)


def test_a_cpu_training_pass_takes_tiles_of_at_most_its_grad_tile_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU a log-prob pass's tile is as many tokens as the budget allows its two buffers (the tile and
    its exponentials), a training pass's at most ``CPU_GRAD_TOKEN_TILE`` of them (its head runs on the
    forward's saved activations: the step's peak)."""
    monkeypatch.delenv(KERNEL_VARIABLE, raising=False)
    monkeypatch.setattr(fused_head, "CPU_GRAD_TOKEN_TILE", 8)
    tiles: list[tuple[int, int]] = []
    real = fused_head.fused_logprobs

    def record(*args: Any) -> Any:
        tiles.append(args[-2:])
        return real(*args)

    monkeypatch.setattr(fused_head, "fused_logprobs", record)
    head, ids = torch.nn.Linear(4, 10), torch.randint(0, 10, (40,))
    hidden = torch.randn(40, 4)
    score = TokenScore(1.0, False, False)
    with torch.no_grad():
        expected = fused_head.fused_head_logprobs(head, hidden, ids, score, None, 2 * 10 * 32)
    logprobs = fused_head.fused_head_logprobs(head, hidden.requires_grad_(True), ids, score, None, 2 * 10 * 32)
    assert tiles == [(32, 10), (8, 10)]  # two buffers of 32 tokens in the budget, then the training cap's 8
    assert expected is not None and logprobs is not None
    torch.testing.assert_close(logprobs[0], expected[0])  # the same log-probs either way
    assert fused_head.cpu_tiles(10, 10 * 4) == (16, 10)  # at least 16 tokens: the GEMM stays efficient


def pass_outputs(model: Any, rows: tuple[torch.Tensor, ...], layout: str) -> tuple[TokenLogprobs, list[torch.Tensor]]:
    """One training pass's log-probs, entropies (with the bonus's gradient) and weight gradients."""
    model.zero_grad()
    out = completion_logprobs(
        model, *rows, 0.8, with_entropy=True, entropy_requires_grad=True,
        share_prompts=layout == "shared", padding_free=layout == "packed",
    )  # fmt: skip
    assert out.entropy is not None
    mask = rows[3]
    weights = torch.linspace(-1.0, 1.0, mask.numel()).view_as(mask)
    ((out.logprobs * mask * weights).sum() + 0.1 * (out.entropy * mask).sum()).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(("family", "layout"), [("llama", "plain"), ("qwen2", "shared"), ("llama", "packed")])
def test_the_fused_head_gives_the_chunked_heads_pass(family: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layout's passes call the chunked head, whose seam hands them to the fused head: the same
    log-probs, entropies and gradients; and the fused head ran."""
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    gen = torch.Generator().manual_seed(3)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    width = max(map(len, prompts))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts]).repeat(2, 1)
    prompt_mask = (prompt_ids != tokenizer.pad_token_id).long()
    completion_ids = torch.randint(5, len(tokenizer), (8, 6), generator=gen)
    completion_mask = (torch.arange(6) < torch.tensor([6, 3, 5, 1, 6, 2, 4, 6]).unsqueeze(1)).long()
    rows = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    monkeypatch.setenv(KERNEL_VARIABLE, "chunked")
    chunked, chunked_grads = pass_outputs(model, rows, layout)
    calls = []
    monkeypatch.setattr(fused_head, "fused_logprobs", lambda *a, **k: calls.append(1) or fused_logprobs(*a, **k))
    monkeypatch.setenv(KERNEL_VARIABLE, "fused")
    fused, fused_grads = pass_outputs(model, rows, layout)
    assert calls, "the fused head ran"
    real = completion_mask.bool()
    assert chunked.entropy is not None and fused.entropy is not None
    torch.testing.assert_close(fused.logprobs[real], chunked.logprobs[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(fused.entropy[real], chunked.entropy[real], rtol=0, atol=1e-5)
    assert (fused.logprobs[~real] == 0).all()
    for mine, other in zip(fused_grads, chunked_grads, strict=True):
        torch.testing.assert_close(mine, other, rtol=0, atol=1e-5 * max(1.0, float(other.abs().max())))


def test_a_soft_capped_head_keeps_the_chunked_head(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("gemma2", tokenizer)
    assert model.config.final_logit_softcapping
    monkeypatch.setenv(KERNEL_VARIABLE, "fused")
    monkeypatch.setattr(fused_head, "fused_logprobs", lambda *a, **k: pytest.fail("the fused head has no soft-cap"))
    ids = torch.tensor([tokenizer.encode("1+2=")])
    completion = torch.tensor([[5, 6, 7]])
    out = completion_logprobs(model, ids, torch.ones_like(ids), completion, torch.ones_like(completion), 1.0)
    assert out.logprobs.shape == (1, 3)
