"""Where a model computes: its parameters' device, or, for FSDP2 shards offloaded to CPU memory, their mesh's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rloo.generation import device as device_module
from rloo.generation.device import model_device
from rloo.tiny import build_tiny_llama


class Shards(torch.nn.Module):
    """Stands in for a model whose parameters are DTensors of a mesh of ``mesh_type`` held on ``held``."""

    def __init__(self, held: str, mesh_type: str) -> None:
        super().__init__()
        self.shard = SimpleNamespace(device=torch.device(held), device_mesh=SimpleNamespace(device_type=mesh_type))

    def parameters(self, recurse: bool = True) -> Any:
        yield self.shard


def test_a_plain_model_computes_where_its_parameters_are() -> None:
    assert model_device(build_tiny_llama(12)) == torch.device("cpu")
    assert model_device(Shards("cpu", "cpu")) == torch.device("cpu")  # sharded over CPU processes (gloo)


def test_offloaded_shards_compute_on_their_meshs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: the sampler put its inputs where the first parameter was, the CPU, beside the GPU's activations
    monkeypatch.setattr(
        device_module.torch, "get_device_module", lambda kind: SimpleNamespace(current_device=lambda: 3)
    )
    assert model_device(Shards("cpu", "cuda")) == torch.device("cuda", 3)
    assert model_device(Shards("cuda", "cuda")) == torch.device("cuda")  # not offloaded: the shard's own device
