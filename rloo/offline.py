"""Loading a hub id on a machine that cannot reach the hub: one quick probe, then the local cache.

Without it, huggingface_hub retries each file of a model 5 times with back-off (1+2+4+8+8 s, and
a model asks for several files), so ``model="someorg/somemodel"`` with no network took about 80 s
to say "couldn't connect". The probe is one HEAD request to the hub's endpoint through
huggingface_hub's own session (its proxies and headers), done once per process; when it fails,
loads run as with ``HF_HUB_OFFLINE=1`` (a cached model still loads, a missing one fails at once
with the same message). Models, tokenizers, processors and reward models loaded by name go
through :func:`hub_or_cache`; datasets (``rloo.data.loading``) and a PEFT adapter's base model
named in its adapter_config.json do not yet.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

PROBE_TIMEOUT = 5.0  # seconds: a hub that answers at all answers well within this


@functools.cache
def hub_reachable() -> bool:
    """Whether the hub answered (any status: it is there) one HEAD request. Probed once per process."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT)
    except Exception:  # no DNS, no route, a proxy refusing, a timeout: out of reach
        return False
    return True


@contextlib.contextmanager
def hub_or_cache(name: str | os.PathLike[str]) -> Iterator[None]:
    """Load ``name`` (a local path or a hub id) inside: a hub id while the hub is out of reach is
    looked up in the local cache only (``HF_HUB_OFFLINE``'s behaviour, for this block only)."""
    from huggingface_hub import constants

    if Path(name).expanduser().exists() or constants.is_offline_mode() or hub_reachable():
        yield
        return
    previous, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous
