"""A hub id on a machine that cannot reach the hub: one probe, then the local cache (rloo.offline)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rloo import offline
from rloo.tiny import save_tiny_model
from rloo.training.setup.models import load_policy


def test_an_unreachable_hub_id_fails_at_once_with_one_clean_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without network, huggingface_hub retried each file 5 times with back-off (about 80 s in all)
    before rloo's "no network" message, which ended in ".." (issue 24)."""
    monkeypatch.setattr(offline, "hub_reachable", lambda: False)  # this machine, or CI, with or without network
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as raised:
        load_policy("someorg/somemodel", None)
    message = str(raised.value)
    assert message.startswith("could not load a causal LM from 'someorg/somemodel': ")
    assert "couldn't find them in the cached files" in message
    assert ".." not in message and message.endswith("or a hub id reachable from this machine.")
    assert not [record for record in caplog.records if "Retrying" in record.getMessage()]  # not one retry


def test_a_cached_hub_model_still_loads_while_the_hub_is_out_of_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someorg--tiny"
    save_tiny_model(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(offline, "hub_reachable", lambda: False)
    model = load_policy("someorg/tiny", {"cache_dir": str(tmp_path)})
    assert model.config.hidden_size == 32
    from huggingface_hub import constants

    assert constants.is_offline_mode() is False  # offline for the load only


def test_a_local_folder_never_probes_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> bool:
        raise AssertionError("a local folder needs no hub")

    monkeypatch.setattr(offline, "hub_reachable", probe)
    assert load_policy(str(save_tiny_model(tmp_path / "tiny")), None).config.hidden_size == 32
