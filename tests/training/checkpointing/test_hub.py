"""push_to_hub and the model card, against a local stand-in for the hub (never the network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rloo import RLOOConfig
from rloo.training.checkpointing import hub
from tests.helpers.models import trainer

pytestmark = pytest.mark.usefixtures("one_thread")


class FakeHub:
    """Records what HfApi would be asked to do, and the uploaded folder's files."""

    def __init__(self, token: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.files: dict[str, bytes] = {}

    def create_repo(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, *, folder_path: str, repo_id: str, **kwargs: Any) -> Any:
        self.calls.append(("upload_folder", {"repo_id": repo_id, **kwargs}))
        self.files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir() if p.is_file()}
        return f"https://hub.local/{repo_id}/commit/1"


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    stand_in = FakeHub()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda token=None: stand_in)
    return stand_in


def test_push_to_hub_uploads_the_final_model_with_a_model_card(tmp_path: Path, fake_hub: FakeHub) -> None:
    run = trainer(tmp_path, max_steps=2, hub_model_id="me/tiny-rloo", hub_private_repo=True)
    run.train()
    url = run.push_to_hub(dataset_name="local/sums")
    assert url == "https://hub.local/me/tiny-rloo/commit/1"
    assert fake_hub.calls[0] == (
        "create_repo",
        {"repo_id": "me/tiny-rloo", "private": True, "exist_ok": True, "token": None},
    )
    assert fake_hub.calls[1][1]["commit_message"] == "End of training"
    assert {"model.safetensors", "config.json", "README.md"} <= set(fake_hub.files)
    card = fake_hub.files["README.md"].decode()
    assert "datasets: [local/sums]" in card and "# tiny-rloo" in card and "@inproceedings{ahmadian2024back" in card
    assert "| `num_generations` | `4` |" in card and "| `train_loss` |" in card


def test_push_to_hub_at_the_end_of_training(tmp_path: Path, fake_hub: FakeHub) -> None:
    trainer(tmp_path, max_steps=1, push_to_hub=True).train()
    assert [name for name, _ in fake_hub.calls] == ["create_repo", "upload_folder"]
    assert fake_hub.calls[0][1]["repo_id"] == "run"  # output_dir's folder name


def test_a_hub_token_in_the_config_is_refused() -> None:
    with pytest.raises(ValueError, match="set HF_TOKEN or run `hf auth login`"):
        RLOOConfig(hub_token="hf_secret")


def test_the_model_card_without_metrics_or_base_model() -> None:
    card = hub.model_card("name", None, None, RLOOConfig(), {})
    assert "base_model" not in card and "(none logged)" in card
