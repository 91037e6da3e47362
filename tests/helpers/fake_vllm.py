"""An in-process stand-in for ``rloo vllm-serve`` that misbehaves on demand (issue 42: the vLLM server under faults).

It speaks the protocol (``/health/`` with a start-up id, ``/update_weights/``, ``/generate/``) and answers it for
real: a copy of the model, loaded with the weights it is sent, samples the completions and scores their tokens,
so the trainer's weight-sync probe passes only when the weights really arrived. A "restart" gives it a new
start-up id and the weights it started with, as a restarted server has the ones on disk. Faults are queued
per endpoint: ``drop`` (close the connection without an answer), ``restart`` (drop and restart),
``sleep:S``, ``not_json``, ``truncate`` (a Content-Length longer than the body), or a callable that rewrites a
well-formed answer. A thread of this process serves it: no other process starts (the fast tier's rule).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from safetensors.torch import load
from torch import nn

Fault = str | Callable[[dict[str, Any]], Any]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:  # a dropped connection is the point
        pass


class FakeVLLM:
    """``with FakeVLLM(model) as server:`` serves on a free port of 127.0.0.1; ``server.url``."""

    def __init__(self, model: nn.Module) -> None:
        self.initial = copy.deepcopy(model.state_dict())
        self.model = copy.deepcopy(model).eval()
        self.instance = uuid.uuid4().hex
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.updates = 0
        self.generate_calls = 0
        self.lock = threading.Lock()
        self.up = True
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                fake.handle(self, None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.handle(self, body)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeVLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def fail(self, path: str, *faults: Fault) -> None:
        """Queue ``faults`` for the next requests to ``path`` ("/generate/", "/health/", "/update_weights/")."""
        self.faults[path].extend(faults)

    def restart(self) -> None:
        """A new start-up id and the weights it started with (what a restarted server holds)."""
        with self.lock:
            self.instance = uuid.uuid4().hex
            self.model.load_state_dict(self.initial)

    def holds(self, model: nn.Module) -> bool:
        """Whether the served weights equal ``model``'s."""
        mine = self.model.state_dict()
        return all(torch.equal(mine[name], tensor.detach().cpu()) for name, tensor in model.state_dict().items())

    # ------------------------------------------------------------------ serving
    def handle(self, request: BaseHTTPRequestHandler, body: bytes | None) -> None:
        path = request.path
        fault = self.faults[path].popleft() if self.faults[path] else None
        if not self.up or fault in ("drop", "restart"):
            if fault == "restart":
                self.restart()
            request.close_connection = True
            request.connection.close()  # no answer: the client sees the connection closed
            return
        if isinstance(fault, str) and fault.startswith("sleep:"):
            time.sleep(float(fault.split(":")[1]))
        if fault == "not_json":
            return self.send(request, b"<html>502 Bad Gateway</html>")
        answer = self.answer(path, body)
        if callable(fault):
            answer = fault(answer)
        data = json.dumps(answer).encode()
        if fault == "truncate":
            return self.send(request, data[: len(data) // 2], length=len(data))
        self.send(request, data)

    def send(self, request: BaseHTTPRequestHandler, data: bytes, length: int | None = None) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data) if length is None else length))
        request.end_headers()
        request.wfile.write(data)
        request.wfile.flush()
        if length is not None:
            request.close_connection = True

    def answer(self, path: str, body: bytes | None) -> Any:
        if path == "/health/":
            return {"status": "ok", "instance": self.instance}
        assert body is not None
        if path == "/update_weights/":
            tensors = load(body)
            with self.lock:
                self.model.load_state_dict(tensors, strict=False)
                self.updates += 1
            return {"tensors": len(tensors)}
        if path == "/generate/":
            self.generate_calls += 1
            with self.lock:
                return generate(self.model, json.loads(body))
        return {"status": True}


@torch.no_grad()
def generate(model: nn.Module, request: dict[str, Any]) -> dict[str, Any]:
    """``n`` completions of each prompt, sampled (or greedy at temperature 0) with their tokens' log-probs of
    ``log_softmax(logits / T)``; seeded per prompt when the request has ``seeds``."""
    n, steps = int(request.get("n", 1)), int(request.get("max_tokens", 16))
    temperature = float(request.get("temperature", 1.0))
    stops = set(request.get("generation_kwargs", {}).get("stop_token_ids", []))
    seeds = request.get("seeds")
    ids_out, logprobs_out = [], []
    for p, prompt in enumerate(request["prompts"]):
        for j in range(n):
            generator = torch.Generator().manual_seed(int(seeds[p]) + j if seeds else p * n + j)
            ids, logprobs = list(prompt), []
            for _ in range(steps):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                scaled = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
                token = (
                    int(scaled.argmax())
                    if temperature == 0
                    else int(torch.multinomial(scaled.exp(), 1, generator=generator))
                )
                ids.append(token)
                logprobs.append([float(scaled[token])])
                if token in stops:
                    break
            ids_out.append(ids[len(prompt) :])
            logprobs_out.append(logprobs)
    return {"completion_ids": ids_out, "logprobs": logprobs_out}
