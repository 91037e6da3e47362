"""Weights from the trainer to a rollout worker over a torch.distributed group of two
(rloo.training.parallel.weight_sync): the flat buffers by hand, the backend choice, and a real gloo group
between two processes that moves two dtypes bit for bit."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

from rloo.config.fields.rollouts import available_worker_devices
from rloo.training.parallel import weight_sync
from rloo.training.parallel.weight_sync import Layout, Slot


def weights() -> dict[str, torch.Tensor]:
    return {
        "a": torch.arange(6, dtype=torch.float32).view(2, 3),
        "b": torch.tensor([0.5, -1.25], dtype=torch.bfloat16),
        "c": torch.tensor([[7.0]], dtype=torch.float32),
    }


def test_flatten_hand_example() -> None:
    """float32 weights a (2x3) and c (1x1) share one buffer (c at offset 6), bfloat16 b has its own: the dtypes
    in the order they first appear."""
    layout, flats = weight_sync.flatten(weights())
    assert layout == Layout(
        (
            (torch.float32, 7, (Slot("a", (2, 3), 0), Slot("c", (1, 1), 6))),
            (torch.bfloat16, 2, (Slot("b", (2,), 0),)),
        )
    )
    assert flats[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0] and flats[1].dtype == torch.bfloat16
    back = weight_sync.unflatten(layout, flats)
    assert set(back) == {"a", "b", "c"}
    assert all(torch.equal(back[name], value) and back[name].dtype == value.dtype for name, value in weights().items())


def test_flatten_of_no_weights_and_of_scalars() -> None:
    layout, flats = weight_sync.flatten({})
    assert layout == Layout(()) and flats == [] and weight_sync.unflatten(layout, flats) == {}
    layout, flats = weight_sync.flatten({"s": torch.tensor(3.0)})
    assert layout.buffers[0][2] == (Slot("s", (), 0),)
    assert weight_sync.unflatten(layout, flats)["s"].shape == ()


@pytest.mark.parametrize(
    ("trainer", "worker", "backend"),
    [
        ("cpu", "cpu", "gloo"),
        ("cuda:0", "cuda:0", "gloo"),  # one GPU shared: NCCL refuses two ranks on one device
        ("cuda:0", "cuda:1", "nccl"),
        ("cuda:1", "cuda:0", "nccl"),
        ("cuda:0", "cpu", "gloo"),
        ("cpu", "cuda:1", "gloo"),
    ],
)
def test_the_backend_is_nccl_only_between_two_gpus(trainer: str, worker: str, backend: str) -> None:
    assert weight_sync.sync_backend(trainer, worker) == backend


def receive_twice(port: int, prefix: str, layouts: Any, answers: Any) -> None:
    """A worker's end (in a spawned process): receive two versions, send back what arrived."""
    receiver = weight_sync.WeightReceiver(port, prefix, "gloo", "cpu")
    for _ in range(2):
        layout = layouts.get()
        answers.put({name: value.clone() for name, value in receiver.receive(layout).items()})


@pytest.mark.system
def test_weights_cross_a_gloo_group_bit_for_bit() -> None:
    """Two versions, float32 and bfloat16, posted without waiting and received in order by another process."""
    context = multiprocessing.get_context("spawn")
    store = weight_sync.host_store()
    layouts, answers = context.Queue(), context.Queue()
    process = context.Process(target=receive_twice, args=(store.port, "test/0/", layouts, answers), daemon=True)
    process.start()
    try:
        sender = weight_sync.WeightSender(store, "test/0/", "gloo", "cpu")
        assert sender.ready(process.is_alive, 0.5)
        first, second = weights(), {k: v * 2 for k, v in weights().items()}
        for version in (first, second):
            layout, flats = weight_sync.flatten(version)
            sender.send(flats)
            layouts.put(layout)
            got = answers.get(timeout=120)
            assert set(got) == set(version)
            assert all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in version.items())
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()


@pytest.mark.system
def test_a_worker_that_died_before_joining_is_reported_not_waited_for() -> None:
    context = multiprocessing.get_context("spawn")
    store = weight_sync.host_store()
    process = context.Process(target=int, daemon=True)  # exits at once, never joins the group
    process.start()
    process.join(timeout=60)
    sender = weight_sync.WeightSender(store, "dead/0/", "gloo", "cpu")
    assert sender.ready(process.is_alive, 0.2) is False


def test_worker_devices_the_machine_lacks_are_refused_at_start() -> None:
    assert available_worker_devices(()) is None
    assert available_worker_devices(("cpu", "cpu")) == ["cpu", "cpu"]
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=rf"names 'cuda:{have}', but this machine has {have} CUDA device\(s\)"):
        available_worker_devices(("cpu", f"cuda:{have}"))
