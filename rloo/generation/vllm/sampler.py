"""Rollouts sampled on vLLM (``use_vllm=True``: a server, or an engine in this process): the sampler's seam.

:class:`VLLMSampler` is a :class:`~rloo.generation.rollout.SamplingEngine`: called where rloo's own sampler
(:func:`rloo.generation.rollout.generate_rollouts`) is, with its arguments, it returns the same
:class:`~rloo.generation.rollout.Rollout`. Before a batch it sends the policy's weights when the policy has
taken an optimizer step since the last send (as TRL syncs: when it generates), then checks the sync
(:mod:`rloo.generation.sync_check`): the server greedily continues a fixed probe prompt and rloo's own forward
scores those tokens; a gap beyond :data:`PROBE_TOLERANCE` stops the run with a message.

Faults (issue 42; tests/generation/test_vllm_faults.py): a server that goes away mid-batch (killed, restarted, an
answer cut short) is waited for up to ``vllm_server_timeout``, sent the weights again and probed, and the batch
asked again, at most :data:`RECONNECTS` times a batch and only where one training process uses the server (several
would each have to agree when to resend: they stop, naming the newest checkpoint). A server restarted between two
calls of one step answers ``/health/`` with another start-up id and is sent the weights again. A server slower than
``vllm_server_timeout`` or answering something malformed stops the run, naming the setting or what was wrong.

Randomness: with ``sampling_seed`` each prompt gets its own vLLM seed, derived from the seed and its group
id, so a run samples the same completions wherever the server is (and however the prompts are batched);
vLLM gives a request's n samples the seeds ``seed .. seed + n - 1``, so the groups' seeds are ``n`` apart.

Log-probs: the server's are those of the distribution each token was drawn from
(:mod:`rloo.generation.vllm.server`); the rollout keeps them as ``sampling_logprobs`` when that is the
distribution rloo scores, ``log_softmax(logits / T)`` (``SamplingParams.plain``: no penalty, no truncation),
else zeros. The loss's ratio is against rloo's own log-probs of the batch; these weigh it for the engines'
mismatch (:mod:`rloo.algo.importance`) and measure the gap.
"""

from __future__ import annotations

import functools
import itertools
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rloo.config.fields.vllm import server_url
from rloo.generation.device import is_peft_model
from rloo.generation.multimodal import VisionInputs
from rloo.generation.rollout import Rollout, SamplingEngine, rollout_from
from rloo.generation.sampling import SamplingParams
from rloo.generation.sync_check import ProbeTolerance, check_weight_sync, probe_logprobs
from rloo.generation.vllm.client import ServerLost, ServerTimeout, VLLMClient, VLLMServerError

# the most the server's and rloo's log-probs of the probe's tokens may differ after a sync (nats): another
# engine's kernels, in float32; in bf16/fp16 (autocast or half weights) rounding alone reaches ~0.016 on an
# H100 (BENCHMARKS.md); a sync that did not take differs by nats once the policy has moved
PROBE_TOLERANCE = ProbeTolerance(full=0.02, half=0.1)
_REFUSAL = (
    "the vLLM server's weights disagree with the policy's after the sync: its log-probs of a probe prompt's "
    "greedy tokens differ from rloo's by up to {gap:.3g} nats (tolerance {tolerance:g}). Check that the server "
    "serves the same model architecture and dtype as the trainer (rloo vllm-serve --model PATH --dtype float32 "
    "for a float32 run); training stopped so as not to learn from another policy's samples"
)
PROBE_TOKENS = 4
RECONNECTS = 3  # times one batch waits for a lost server to come back (then the run stops, to be resumed)
_SEED_STRIDE = 1_000_003  # a prime: sampling seeds of different runs stay apart


def vllm_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The policy's weights under the names vLLM's loader reads (a causal LM's own ``state_dict`` names);
    a PEFT policy's adapters merged into its base weights (peft's merge, undone after the copy)."""
    if not is_peft_model(model):
        return _once(model.state_dict().items())
    model.merge_adapter()  # type: ignore[operator]
    try:
        named = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name or "rloo_reference" in name:
                continue
            clean = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            named[clean] = tensor.detach().clone()
        return _once(named.items())
    finally:
        model.unmerge_adapter()  # type: ignore[operator]


def vllm_adapter(model: nn.Module, max_rank: int | None) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """A PEFT policy's active LoRA adapter as vLLM loads one: ``(weights under PEFT's saved names, its
    adapter_config as a dict)``; None where the server takes no adapter (``max_rank`` None) or vLLM's LoRA
    cannot apply this one (not plain LoRA: DoRA, ``modules_to_save``, per-module ranks; a rank above the
    server's), which then gets the merged weights (:func:`vllm_state_dict`)."""
    if max_rank is None or not is_peft_model(model):
        return None
    from peft import get_peft_model_state_dict

    peft: Any = model
    name: str = peft.active_adapter
    config: Any = peft.peft_config[name]
    plain = config.peft_type == "LORA" and not getattr(config, "use_dora", False)
    plain = plain and not config.modules_to_save and not getattr(config, "rank_pattern", None)
    if not plain or int(config.r) > max_rank or getattr(config, "alpha_pattern", None):
        return None
    weights = get_peft_model_state_dict(model, adapter_name=name)
    return {key: value.detach() for key, value in weights.items()}, config.to_dict()


def _once(named: Any) -> dict[str, Tensor]:
    """Each tensor detached; a tied weight's second name gets a copy (safetensors refuses shared memory,
    and vLLM's layer-wise reload waits for every name its checkpoint format has)."""
    out, seen = {}, set()
    for name, tensor in named:
        out[name] = tensor.detach().clone() if tensor.data_ptr() in seen else tensor.detach()
        seen.add(tensor.data_ptr())
    return out


class VLLMSampler(SamplingEngine):
    """A :class:`~rloo.generation.rollout.SamplingEngine`: samples rollouts for the policy it is called with, on
    the server at ``base_url``, or (``client``) on another engine with the client's interface (colocate:
    :class:`rloo.generation.vllm.colocate.LocalEngine`)."""

    def __init__(self, base_url: str, timeout: float, client: Any = None) -> None:
        self.client = client if client is not None else VLLMClient(base_url, timeout)
        # one server for every process (the first sends the weights), or an engine per process (colocate)
        self.shared = client is None
        self.timeout = timeout
        self.ready = False
        # what was last sent: the model (weakly: an id could be reused by another model) and its step
        self._sent_model: Callable[[], nn.Module | None] = lambda: None
        self.synced_step: int | None = None
        self.probe: list[int] | None = None
        self.last_gap: float | None = None
        self.instance: str | None = None  # the server's start-up id when the weights were last sent
        self.adapter_refused = False  # the server refused the LoRA adapter: merged weights from then on

    def sync(self, model: nn.Module, step: int) -> None:
        """Send ``model``'s weights unless they were sent at this ``step`` (to this server: one process alone
        asks its start-up id, so a server restarted since is sent them again), then check them on the probe.
        Several data-parallel processes share the server: the first sends and checks, and none samples
        before it has (a collective: every process calls this at each generation batch)."""
        if self._sent_model() is model and self.synced_step == step and not self._restarted():
            return
        if any(type(p).__name__ == "DTensor" for p in model.parameters()):
            raise NotImplementedError(
                "use_vllm with FSDP2-sharded parameters is not built yet: train data-parallel (plain torchrun / "
                "accelerate launch) or without use_vllm"
            )
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        world = torch.distributed.get_world_size() if distributed else 1
        failure: str | None = None
        if not self.shared or not distributed or torch.distributed.get_rank() == 0:
            try:
                self.instance = self.client.instance()  # asked first: a restart after it shows at the next call
                if not self._sent_adapter(model):
                    self.client.update_weights(vllm_state_dict(model).items())
                if self.probe is not None:
                    self.check(model)
            except (RuntimeError, ConnectionError) as error:
                if world == 1:
                    raise
                failure = str(error)
        if world > 1 and self.shared:
            box = [failure]
            torch.distributed.broadcast_object_list(box, src=0)  # also the barrier: the weights are in
            if box[0] is not None:
                raise RuntimeError(box[0])
        self._sent_model, self.synced_step = weakref.ref(model), step

    def _sent_adapter(self, model: nn.Module) -> bool:
        """Send a LoRA policy's adapter alone to a server that takes adapters (:func:`vllm_adapter`); False when
        the merged weights must go instead, as for good once the server refused the adapter (warned: a target
        module or rank vLLM's LoRA does not take)."""
        adapter = vllm_adapter(model, self.client.max_lora_rank()) if self.shared and not self.adapter_refused else None
        if adapter is None:
            return False
        try:
            self.client.load_adapter(*adapter)
        except VLLMServerError as error:
            if isinstance(error, ServerLost | ServerTimeout):
                raise
            self.adapter_refused = True
            _warn(f"{error}: the policy's weights go to the server merged from now on (the bytes of the whole model)")
            return False
        return True

    def _alone(self) -> bool:
        """The only process using the server (no collective to keep in step): it may ask, wait and resend."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return self.shared and (not distributed or torch.distributed.get_world_size() == 1)

    def _restarted(self) -> bool:
        """The server answers with another start-up id than when the weights were sent (one process alone)."""
        return self._alone() and self.instance is not None and self.client.instance() != self.instance

    def _reconnect(self, lost: ServerLost, attempt: int, step: int, warn: Callable[[str], None]) -> None:
        """After a request found the server gone: wait for it (``vllm_server_timeout``), and have the weights
        sent and checked again before the batch is asked again; at most :data:`RECONNECTS` times a batch, and
        only where one process uses the server (several would each have to agree when to resend)."""
        stopped = f"the run stopped at step {step}; once the server is back, resume from the newest checkpoint"
        if not self._alone():
            raise ServerLost(f"{lost}. With several training processes on one server {stopped}") from None
        if attempt > RECONNECTS:
            raise ServerLost(f"{lost}, again after {RECONNECTS} reconnects in this batch: {stopped}") from None
        warn(
            f"{lost}. Waiting up to {self.timeout:g} s (vllm_server_timeout) for it to answer again, then sending "
            f"the policy's weights again and checking them before sampling step {step} again (reconnect {attempt} "
            f"of {RECONNECTS})"
        )
        try:
            self.client.check_server(self.timeout)
        except ServerLost as gone:
            raise ServerLost(f"{gone}. {stopped[0].upper()}{stopped[1:]}") from None
        self.synced_step = None  # a restarted server holds the weights it loaded from disk

    @torch.no_grad()
    def check(self, model: nn.Module) -> float:
        """The largest gap between the server's and ``model``'s log-probs of the probe's greedy tokens;
        raises when it is beyond :data:`PROBE_TOLERANCE` (the sync did not take)."""
        assert self.probe is not None
        answer = self.client.generate([self.probe], n=1, max_tokens=PROBE_TOKENS, temperature=0.0)
        tokens, served = answer.completion_ids[0], answer.logprobs[0]
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            ours = probe_logprobs(model, torch.tensor(self.probe + tokens, device=device), len(self.probe))
        finally:
            model.train(was_training)
        half = torch.is_autocast_enabled(device.type) or next(model.parameters()).dtype != torch.float32
        self.last_gap = check_weight_sync(ours, torch.tensor(served), PROBE_TOLERANCE.at(half), _REFUSAL)
        return self.last_gap

    def __call__(
        self,
        model: nn.Module,
        prompt_ids: Sequence[Sequence[int]],
        group_ids: Sequence[int],
        *,
        num_generations: int,
        max_new_tokens: int,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        generator: torch.Generator | None = None,
        sampling_seed: int | None = None,
        stop: Callable[[Sequence[Tensor], Tensor], Tensor] | None = None,
        vision: VisionInputs | None = None,
        all_done: Callable[[bool], bool] | None = None,
        compact_at: float | None = None,
        step: int = 0,
    ) -> Rollout:
        """:class:`~rloo.generation.rollout.SamplingEngine`'s contract, sampled on the server (``step``: the
        weights are sent when it changes; ``all_done`` and ``compact_at`` concern rloo's decode loop only)."""
        if vision is not None:
            raise NotImplementedError("image prompts with use_vllm are not built yet: train them without vLLM")
        if not self.ready:
            self.client.check_server(self.timeout, notify=_warn)
            if hasattr(self.client, "start"):
                self.client.start(model)  # an engine in this process, built for this policy
            self.ready = True
        if self.probe is None:
            self.probe = list(prompt_ids[0])[-32:]
        k = num_generations
        seeds = None
        if sampling_seed is not None:
            seeds = [(sampling_seed * _SEED_STRIDE + group * k) % 2**31 for group in group_ids]
        elif generator is not None:
            seeds = torch.randint(0, 2**31 - k, (len(prompt_ids),), generator=generator).tolist()
        greedy = params.temperature == 0
        for attempt in itertools.count(1):
            try:
                self.sync(model, step)
                answer = self.client.generate(
                    prompt_ids,
                    n=k,
                    max_tokens=max_new_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k if params.top_k else -1,
                    min_p=params.min_p or 0.0,
                    repetition_penalty=params.repetition_penalty,
                    seeds=None if greedy else seeds,
                    generation_kwargs=engine_stops(eos_token_ids, stop),
                )
                break
            except ServerLost as lost:
                if lost.unresolvable:
                    raise
                self._reconnect(lost, attempt, step, _warn)
        return rollout_from(
            answer.completion_ids,
            answer.logprobs,
            prompt_ids,
            group_ids,
            k,
            max_new_tokens,
            eos_token_ids,
            pad_token_id,
            next(model.parameters()).device,
            keep_logprobs=params.plain,
            stop=stop,
        )


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def engine_stops(eos_token_ids: Sequence[int], stop: Any) -> dict[str, Any]:
    """What ends a completion on the engine: the EOS ids, and (``stop``: rloo's ``StopStrings``) its stop
    strings, kept in the text as rloo keeps them; :func:`rloo.generation.rollout.rollout_from` then cuts by rloo's own
    rule."""
    stops: dict[str, Any] = {"stop_token_ids": list(eos_token_ids)}
    strings = getattr(stop, "strings", None)
    if strings:
        stops.update(stop=list(strings), include_stop_str_in_output=True)
    return stops


def server_sampler(args: Any) -> VLLMSampler:
    """The sampler on the ``rloo vllm-serve`` server a config names (``vllm_mode="server"``)."""
    return sampler_for(server_url(args), float(args.vllm_server_timeout))


@functools.cache
def sampler_for(base_url: str, timeout: float) -> VLLMSampler:
    """One sampler per server in a process (it remembers what it last sent)."""
    return VLLMSampler(base_url, timeout)


_COLOCATED: dict[tuple[Any, ...], VLLMSampler] = {}


def colocated_sampler(args: Any) -> VLLMSampler:
    """The sampler on this process's own engine (one per colocate setting: an engine is built once)."""
    from rloo.generation.vllm.colocate import LocalEngine

    key = (
        args.seed,
        args.vllm_gpu_memory_utilization,
        args.vllm_tensor_parallel_size,
        args.vllm_model_impl,
        args.vllm_max_model_length,
        args.vllm_enable_sleep_mode,
    )
    if key not in _COLOCATED:
        _COLOCATED[key] = VLLMSampler("colocate", 0.0, client=LocalEngine(args))
    return _COLOCATED[key]
