"""``rloo vllm-serve``: a vLLM engine behind HTTP, for a trainer's rollouts (issue 26).

It speaks ``trl vllm-serve``'s protocol where TRL has one (``/health/``, which also answers the server's
start-up id, so a trainer notices a restart and sends its weights again; ``/get_world_size/``,
``/generate/`` with TRL's request and response fields, ``/reset_prefix_cache/``), so a client written
for either server reads the other's answers; weights move by an endpoint of ours, ``/update_weights/``,
whose body is a safetensors file of named tensors (the trainer's names, or an adapter's merged
weights), handed to vLLM's own reload (``collective_rpc("reload_weights", weights_iterator=...)``):
TRL's path, an NCCL communicator between trainer and server, does not exist on a CPU, and vLLM's CPU
backend prepacks linear weights, so writing parameters in place would change nothing. With
``--enable_lora true`` a LoRA policy's adapter goes alone, by ``/load_adapter/`` (a safetensors file of its
weights, its ``adapter_config.json`` in the metadata), loaded as a vLLM LoRA adapter every request then uses.

This module runs in vLLM's own environment (``make vllm``: vLLM pins torch and transformers), so it
imports vLLM, FastAPI, uvicorn, torch and safetensors only, never the rest of rloo.

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits
the token was drawn from (after penalties, temperature and top-k/top-p/min-p). Without penalty and
truncation that is ``log_softmax(logits / T)``, the distribution rloo's trainer scores, at any temperature:
the trainer measures the engines' gap on them and weighs the loss by it (importance sampling). vLLM's
default, raw log-probs, are at temperature 1 whatever the request's: compared with a trainer's at another
temperature they would mistake the temperature for an engine mismatch.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations (a local Request) at run time
import argparse
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

# vLLM's CPU build, in-process engine (no worker processes to leak), unpinned OpenMP threads
CPU_ENVIRONMENT = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
READY = "rloo vllm-serve: ready on"


def parser() -> argparse.ArgumentParser:
    """``trl vllm-serve``'s flags (the ones a single engine uses), with TRL's defaults."""
    p = argparse.ArgumentParser(prog="rloo vllm-serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="A model folder or hub id.")
    p.add_argument("--revision", default=None)
    p.add_argument("--tensor_parallel_size", type=int, default=1)
    p.add_argument("--data_parallel_size", type=int, default=1)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max_model_len", type=int, default=None)
    p.add_argument("--enable_prefix_caching", type=_bool, default=None)
    p.add_argument("--enforce_eager", type=_bool, default=False)
    p.add_argument("--kv_cache_dtype", default="auto")
    p.add_argument("--trust_remote_code", type=_bool, default=False)
    p.add_argument("--log_level", default="info")
    p.add_argument("--vllm_model_impl", default="vllm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--enable_lora",
        type=_bool,
        default=False,
        help="Take a LoRA policy's adapter as it trains (/load_adapter/), not its merged weights.",
    )
    p.add_argument("--max_lora_rank", type=int, default=64, help="The largest adapter rank --enable_lora takes.")
    return p


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_engine(args: argparse.Namespace, enable_sleep_mode: bool = False) -> Any:
    """The vLLM engine of ``args`` (on a machine without a GPU: the CPU backend's settings)."""
    import torch

    if not torch.cuda.is_available():
        for name, value in CPU_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    if args.data_parallel_size != 1:
        raise SystemExit("rloo vllm-serve: --data_parallel_size > 1 is not supported; start one server per GPU group")
    from vllm import LLM

    return LLM(
        model=args.model,
        revision=args.revision,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager or not torch.cuda.is_available(),
        kv_cache_dtype=args.kv_cache_dtype,
        trust_remote_code=args.trust_remote_code,
        model_impl=args.vllm_model_impl,
        seed=args.seed,
        logprobs_mode="processed_logprobs",
        **({"enable_sleep_mode": True} if enable_sleep_mode else {}),
        **({"enable_lora": True, "max_lora_rank": args.max_lora_rank, "max_loras": 1} if args.enable_lora else {}),
    )


def sampling_params(request: dict[str, Any]) -> Any:
    """vLLM ``SamplingParams`` from a ``/generate/`` request (TRL's fields; ``generation_kwargs`` override)."""
    from vllm import SamplingParams

    values = {
        "n": request.get("n", 1),
        "repetition_penalty": request.get("repetition_penalty", 1.0),
        "temperature": request.get("temperature", 1.0),
        "top_p": request.get("top_p", 1.0),
        "top_k": request.get("top_k", -1),
        "min_p": request.get("min_p", 0.0),
        "max_tokens": request.get("max_tokens", 16),
        "logprobs": request.get("logprobs", 0),
    }
    values.update(request.get("generation_kwargs") or {})
    return SamplingParams(**values)


def generate(llm: Any, request: dict[str, Any], adapter: Any = None) -> dict[str, Any]:
    """TRL's ``/generate/``: token-id (or text) prompts -> each completion's ids and the sampled tokens'
    log-probs; with ``seeds`` (ours: one per prompt), prompt ``i``'s ``n`` samples come from seed ``seeds[i]``;
    ``adapter``: the policy's LoRA adapter (a vLLM ``LoRARequest``), None for the weights alone."""
    prompts = request["prompts"]
    rows = [{"prompt_token_ids": p} if isinstance(p, list) else {"prompt": p} for p in prompts]
    seeds: Sequence[int] | None = request.get("seeds")
    if seeds is not None and len(seeds) != len(rows):
        raise ValueError(f"{len(seeds)} seeds for {len(rows)} prompts")
    n = int(request.get("n", 1))
    expanded = float(request.get("temperature", 1.0)) == 0.0 and n > 1
    if expanded:  # vLLM samples greedily with n = 1 only: each prompt n times instead
        rows = [row for row in rows for _ in range(n)]
        seeds = None if seeds is None else [seed for seed in seeds for _ in range(n)]
        request = {**request, "n": 1}
    base = sampling_params(request)
    params = base if seeds is None else [base.clone() for _ in rows]
    if seeds is not None:
        for one, seed in zip(params, seeds, strict=True):
            one.seed = int(seed)
    outputs = llm.generate(rows, sampling_params=params, use_tqdm=False, lora_request=adapter)
    completion_ids, logprobs, logprob_ids = [], [], []
    for output in outputs:
        for sample in output.outputs:
            completion_ids.append(list(sample.token_ids))
            steps = sample.logprobs or []  # per token: {token id: Logprob}, the sampled one among them
            chosen = [step[token].logprob for token, step in zip(sample.token_ids, steps, strict=False)]
            logprobs.append([[value] for value in chosen])
            logprob_ids.append([[token] for token in sample.token_ids[: len(chosen)]])
    return {
        "prompt_ids": [list(output.prompt_token_ids) for output in (outputs[::n] if expanded else outputs)],
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "logprob_token_ids": logprob_ids,
    }


def load_weights(llm: Any, named: Iterable[tuple[str, Any]]) -> int:
    """Named tensors into the engine through vLLM's in-place reload (the prefix cache then holds other
    weights' keys: reset); the count. The server's ``/update_weights/`` and the colocated engine both load so."""
    tensors = list(named)
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors)})
    llm.reset_prefix_cache()
    return len(tensors)


class Adapters:
    """The policy's LoRA adapter as the trainer last sent it (``/load_adapter/``): each version written to a
    folder of its own (vLLM loads adapters from disk) and loaded under a new id, the one before removed."""

    def __init__(self, llm: Any, max_rank: int | None) -> None:
        import tempfile

        self.llm, self.max_rank = llm, max_rank
        self.folder = tempfile.mkdtemp(prefix="rloo-adapters-")
        self.current: Any = None  # the LoRARequest generation uses
        self.version = 0  # adapters loaded so far: each gets a new id and folder

    def load(self, body: bytes) -> dict[str, int]:
        """A safetensors file of the adapter's weights (PEFT's names) whose metadata ``adapter_config`` is its
        ``adapter_config.json``: written, loaded into the engine, and used from the next request on (a file
        that fails is removed)."""
        import shutil

        if self.max_rank is None:
            raise ValueError("this server takes no adapters: start it with --enable_lora true")
        self.version += 1
        version = self.version
        path = os.path.join(self.folder, f"v{version}")
        os.makedirs(path)
        try:
            request, tensors = self._write(body, path, version)
            self.llm.llm_engine.add_lora(request)  # loaded now: a bad adapter fails this request, not a batch
        except Exception:
            shutil.rmtree(path, ignore_errors=True)
            raise
        old, self.current = self.current, request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()
        return {"tensors": tensors, "version": version}

    def _write(self, body: bytes, path: str, version: int) -> tuple[Any, int]:
        """The adapter's files in ``path``, checked: its ``LoRARequest`` and how many tensors it holds."""
        import json

        from safetensors import safe_open
        from vllm.lora.request import LoRARequest

        weights = os.path.join(path, "adapter_model.safetensors")
        with open(weights, "wb") as file:
            file.write(body)
        with safe_open(weights, "pt") as opened:
            config = json.loads((opened.metadata() or {}).get("adapter_config", "null") or "null")
            tensors = len(list(opened.keys()))
        if not isinstance(config, dict):
            raise ValueError("the adapter's safetensors metadata has no adapter_config (its adapter_config.json)")
        if self.max_rank is not None and int(config.get("r", 0)) > self.max_rank:
            raise ValueError(
                f"the adapter's rank r={config['r']} is above the server's --max_lora_rank {self.max_rank}"
            )
        with open(os.path.join(path, "adapter_config.json"), "w") as file:
            json.dump(config, file)
        return LoRARequest(f"rloo-policy-{version}", version, path), tensors

    def drop(self) -> None:
        """Full weights arrived (``/update_weights/``): they are the whole policy, generate without an adapter."""
        import shutil

        if self.current is not None:
            self.llm.llm_engine.remove_lora(self.current.lora_int_id)
            shutil.rmtree(self.current.lora_path, ignore_errors=True)
            self.current = None


def build_app(llm: Any, world_size: int, max_lora_rank: int | None = None) -> Any:
    from fastapi import FastAPI, HTTPException, Request

    app = FastAPI()
    lock = threading.Lock()  # one engine call at a time (handlers run in a thread pool)
    instance = uuid.uuid4().hex  # a restarted server has the weights on disk: the trainer sends its own again

    adapters = Adapters(llm, max_lora_rank)

    @app.get("/health/")
    def health() -> dict[str, Any]:
        return {"status": "ok", "instance": instance, "max_lora_rank": max_lora_rank}

    @app.get("/get_world_size/")
    def get_world_size() -> dict[str, int]:
        return {"world_size": world_size}

    @app.post("/generate/")
    def generate_endpoint(request: dict[str, Any]) -> dict[str, Any]:
        try:
            with lock:
                return generate(llm, request, adapters.current)
        except (ValueError, TypeError, KeyError) as error:
            raise HTTPException(status_code=400, detail=str(error)) from None
        except Exception as error:  # the engine failed: the trainer's message names why (a bare 500 before)
            traceback.print_exc()
            detail = f"the vLLM engine failed ({type(error).__name__}: {error}); the server's log has the traceback"
            raise HTTPException(status_code=500, detail=detail) from None

    @app.post("/update_weights/")
    async def update_weights_endpoint(request: Request) -> dict[str, int]:
        from safetensors.torch import load

        body = await request.body()
        try:
            with lock:
                adapters.drop()
                return {"tensors": load_weights(llm, load(body).items())}
        except (ValueError, KeyError, RuntimeError) as error:
            raise HTTPException(status_code=400, detail=f"weights not loaded: {error}") from None

    @app.post("/load_adapter/")
    async def load_adapter_endpoint(request: Request) -> dict[str, int]:
        body = await request.body()
        try:
            with lock:
                return adapters.load(body)
        except Exception as error:  # a malformed file, a rank or module vLLM refuses
            raise HTTPException(
                status_code=400, detail=f"adapter not loaded: {type(error).__name__}: {error}"
            ) from None

    @app.post("/reset_prefix_cache/")
    def reset_prefix_cache() -> dict[str, bool]:
        with lock:
            llm.reset_prefix_cache()
        return {"status": True}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    llm = build_engine(args)
    lora_rank = args.max_lora_rank if args.enable_lora else None
    app = build_app(llm, args.tensor_parallel_size * args.data_parallel_size, lora_rank)
    import uvicorn

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)
    server = uvicorn.Server(config)
    original = server.startup

    async def startup(*a: Any, **k: Any) -> None:
        await original(*a, **k)
        print(f"{READY} http://{args.host}:{args.port}", flush=True)

    server.startup = startup
    server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
