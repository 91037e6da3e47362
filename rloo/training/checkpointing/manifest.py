"""A checkpoint's manifest: every file with its size and SHA-256, verified before resuming.

A checkpoint whose files were edited, truncated or lost is detected, and the message names
the file; :func:`newest_good_checkpoint` finds the checkpoint to resume from instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` (relative path -> size and hash) in ``folder/manifest.json``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (folder / MANIFEST).write_text(json.dumps(entries, indent=1))


def manifest_problem(folder: Path) -> str | None:
    """What is wrong with ``folder`` against its manifest (the first problem found), or None."""
    path = folder / MANIFEST
    if not path.is_file():
        return f"it has no {MANIFEST}"
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError:
        return f"its {MANIFEST} is unreadable"
    for name, expected in entries.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected.get("bytes") or _sha256(file) != expected.get("sha256"):
            return f"{name} does not match its checksum (edited or truncated)"
    return None


def newest_good_checkpoint(checkpoints: Iterable[Path]) -> Path | None:
    """The newest of ``checkpoints`` (oldest first) that passes its manifest."""
    for folder in reversed(list(checkpoints)):
        if manifest_problem(folder) is None:
            return folder
    return None
