"""``vllm_mode="colocate"``: vLLM inside the training process (TRL's default mode), with the server's interface.

:class:`LocalEngine` answers what :class:`rloo.generation.vllm.client.VLLMClient` answers (``generate``,
``update_weights``), from an engine in this process: the same request handling as ``rloo vllm-serve``
(:func:`rloo.generation.vllm.server.generate`), weights straight into vLLM's in-place reload with no
serialization. The engine is built at the first call, from the policy's own folder (``name_or_path``; a
policy built in memory is saved to a temporary folder first) and dtype, with the config's colocate
fields (``vllm_gpu_memory_utilization``, ``vllm_tensor_parallel_size``, ``vllm_max_model_length``,
``vllm_model_impl``, ``vllm_enable_sleep_mode``).

vLLM must be importable in the training process: it pins torch and ``transformers<5.20``, so this runs in
an environment made for both (``make vllm`` makes ``.venv-vllm`` with rloo's dependencies in it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch import Tensor, nn

from rloo.generation.vllm.client import Generated, generate_request, generated


class LocalEngine:
    """A vLLM engine in this process, built for the policy at the first call."""

    def __init__(self, args: Any) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "RLOOConfig.vllm_mode='colocate' runs vLLM in the training process, and vLLM is not installed "
                "here: train from .venv-vllm (make vllm; it pins transformers<5.20), or start `rloo vllm-serve "
                "--model MODEL` and set vllm_mode='server'"
            )
        import torch

        if args.vllm_enable_sleep_mode and not torch.cuda.is_available():
            raise ValueError(
                "RLOOConfig.vllm_enable_sleep_mode=True frees vLLM's GPU memory between generations and needs a "
                "CUDA GPU; on a CPU remove it"
            )
        self.args = args
        self.sleeps = bool(args.vllm_enable_sleep_mode)
        self.llm: Any = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def start(self, model: nn.Module) -> None:
        """Build the engine for ``model`` (its folder, its dtype) unless it is built."""
        if self.llm is not None:
            return
        from rloo.generation.vllm.server import build_engine, parser

        path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        if not _is_folder(path):  # a hub id or a model built in memory: vLLM reads a folder
            self._folder = tempfile.TemporaryDirectory(prefix="rloo-vllm-")
            model.save_pretrained(self._folder.name)  # type: ignore[operator]
            path = self._folder.name
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        flags = ["--model", path, "--dtype", dtype, "--seed", str(self.args.seed)]
        flags += ["--gpu_memory_utilization", str(self.args.vllm_gpu_memory_utilization)]
        flags += ["--tensor_parallel_size", str(self.args.vllm_tensor_parallel_size)]
        flags += ["--vllm_model_impl", self.args.vllm_model_impl]
        if self.args.vllm_max_model_length is not None:
            flags += ["--max_model_len", str(self.args.vllm_max_model_length)]
        self.llm = build_engine(parser().parse_args(flags), enable_sleep_mode=self.sleeps)
        if self.sleeps:  # asleep until the first call wakes it
            self.llm.sleep(level=1)

    def check_server(self, total_timeout: float = 0.0, interval: float = 1.0, notify: Any = None) -> None:
        """Nothing to wait for: the engine is in this process."""

    def instance(self) -> str | None:
        """Never restarted: the engine lives as long as this process."""
        return None

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], *, seeds: Sequence[int] | None = None, **settings: Any
    ) -> Generated:
        """:meth:`rloo.generation.vllm.client.VLLMClient.generate`, answered by the engine in this process."""
        from rloo.generation.vllm.server import generate

        with self.awake():
            answer = generate(self.llm, generate_request(prompt_ids, seeds, **settings))
            return generated(answer, len(prompt_ids) * int(settings.get("n", 1)), "the colocated vLLM engine")

    def update_weights(self, named: Iterable[tuple[str, Tensor]]) -> int:
        from rloo.generation.vllm.server import load_weights

        with self.awake():
            return load_weights(self.llm, ((name, tensor.detach()) for name, tensor in named))

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """With ``vllm_enable_sleep_mode``: the engine woken for the call and put back to sleep after it
        (level 1: weights offloaded, KV cache freed), so training has the GPU memory between generations."""
        if self.sleeps:
            self.llm.wake_up()
        try:
            yield
        finally:
            if self.sleeps:
                self.llm.sleep(level=1)


def _is_folder(path: str) -> bool:
    from pathlib import Path

    return (Path(path) / "config.json").is_file()
