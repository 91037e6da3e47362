"""Running untrusted Python from completions: :func:`run_in_sandbox` and the ``code_execution`` reward.

Each execution is a fresh interpreter (``python -I``, the base installation, not the venv)
under `bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``, the Debian
package ``bubblewrap``): the sandbox Flatpak uses, small, audited and kept up to date.
Namespaces, mounts and capabilities are easy to get subtly wrong, so we configure a tool
that exists for this rather than writing our own. What the code gets:

- new network, PID, IPC, UTS (and cgroup) namespaces: no network at all (not even to
  127.0.0.1 of the host), and no host process to see or signal: its parent is bwrap's
  reaper, PID 1 of the namespace, which ignores signals from inside; killing the outer
  bwrap (the wall-clock timeout does) ends every process of the namespace;
- a root that holds only read-only binds of ``/usr`` (``/lib``, ``/lib64``, ``/bin`` as
  there), the Python installation (``sys.base_prefix``), a private ``/proc`` and ``/dev``,
  then made read-only; its working directory ``/sandbox`` is an empty tmpfs of
  ``disk_mb`` holding a read-only ``solution.py``. stdin, stdout and stderr are files of a
  per-execution host folder (removed afterwards) it cannot name;
- no environment variables (``--clearenv``), a new session (no terminal to inject into),
  no capabilities, ``no_new_privs``;
- rlimits (soft = hard, so it cannot raise them) set by a tiny runner before the code runs:
  CPU seconds, address space, processes, file size (so a giant output kills the write, not
  our memory: at most ``output_bytes`` are read back), no core files.

The process limit (``RLIMIT_NPROC``) counts every process of a user, and never applies to
root. So as root the sandbox runs as its own unprivileged uid, leased per execution from
60000 up (as the IOI's ``isolate`` gives each box a uid; a lock file per uid keeps
concurrent executions, in this process or another, apart): a fork bomb meets its limit
without touching other executions, and the uid's leftovers are reaped before the lease is
returned. Not as root, bwrap makes a user namespace, whose processes are counted apart.

Fail closed: where bubblewrap is missing or cannot run here (a container without user
namespaces, say), running model-written code is refused when the reward or tool is built, with
:class:`SandboxUnavailable` saying how to get a sandbox. "Works" is a probe, once per process:
bwrap starts a program with this module's own arguments, which checks that it sees no host file,
no network but its own loopback and no process but its own. ``sandbox="none"`` is the explicit
opt-out, and it is unsafe: the rlimits alone apply, in a fresh temporary folder with an empty
environment, and the code can read and write your files, use the network and signal your
processes (as root, the process limit does not apply either); a warning says so once per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

SANDBOX_CHOICES = ("auto", "bwrap", "none")
FIRST_UID = 60000
UID_SLOTS = 1000
UNSAFE_RIGHTS = "it can read and write your files, use the network and signal your processes"
# how to get a working bubblewrap: the package, then what blocks its namespaces where it is installed
GET_A_SANDBOX = (
    "To get one, install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make sandbox` does it where it "
    "can); where it is installed but cannot run, allow it user namespaces: on Ubuntu 24.04 sysctl "
    "kernel.apparmor_restrict_unprivileged_userns=0 (or load AppArmor's bwrap-userns-restrict profile), on older "
    "Debian sysctl kernel.unprivileged_userns_clone=1, and in a Docker container --security-opt seccomp=unconfined "
    "--security-opt apparmor=unconfined (plus --cap-add SYS_ADMIN where it runs as root)."
)
_WARNED: set[str] = set()

# The probe (once per process): printed words name what bwrap failed to hide; nothing printed is isolated.
_PROBE = """import os, socket
seen = ["a host file"] if os.path.exists({marker!r}) else []
seen += [] if [name for _, name in socket.if_nameindex()] in ([], ["lo"]) else ["the host's network"]
seen += [] if len([p for p in os.listdir("/proc") if p.isdigit()]) <= 3 else ["host processes"]
print(", ".join(seen))
"""


class SandboxUnavailable(RuntimeError):
    """No working sandbox for model-written code and no explicit opt-out: refused when the reward or
    tool is built. The message says why, how to get one, and how to opt out (unsafe)."""


# Sets the limits, drops to the leased uid (root only), then runs solution.py as __main__.
_RUNNER = """import os, resource, runpy, sys
cpu, memory, processes, output, uid = map(int, sys.argv[1:6])
for kind, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory), (resource.RLIMIT_CORE, 0),
                    (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_FSIZE, output)):
    resource.setrlimit(kind, (value, value))
if uid >= 0:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
del cpu, memory, processes, output, uid, kind, value
sys.argv = ["solution.py"]
runpy.run_path("solution.py", run_name="__main__")
"""


@dataclass(frozen=True)
class SandboxLimits:
    """What one execution may use. Exceeding any of them fails the execution."""

    timeout: float = 5.0
    """Wall-clock seconds, enforced by the parent, which then kills the whole sandbox."""
    cpu_seconds: int = 5
    """CPU seconds of each process (``RLIMIT_CPU``)."""
    memory_mb: int = 512
    """Address space of each process in MiB (``RLIMIT_AS``); at least 64."""
    max_processes: int = 32
    """Processes and threads the code may run at once, itself included (``RLIMIT_NPROC``)."""
    output_bytes: int = 1 << 20
    """Largest stdout (and stderr) file; writing more fails and the execution's status is
    ``output_limit``. An expected output must be shorter than this to ever match."""
    disk_mb: int = 16
    """Size of the working directory, a tmpfs (bwrap only; it is memory)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            is_int = isinstance(value, int) and not isinstance(value, bool)
            floor = 64 if field.name == "memory_mb" else 1
            if field.name == "timeout":
                bad = isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
                need = "a positive, finite number of seconds"
            else:
                bad, need = not is_int or value < floor, f"an integer >= {floor}"
            if bad:
                raise ValueError(f"sandbox limit {field.name}={value!r} is invalid; give {need}")


@dataclass(frozen=True)
class SandboxResult:
    """One execution: ``status`` is ``ok`` (exit 0), ``error`` (non-zero exit, a signal, a
    limit such as CPU or memory), ``timeout`` (killed at the wall-clock limit) or
    ``output_limit`` (stdout or stderr reached ``output_bytes``). ``stdout``/``stderr`` hold at
    most ``output_bytes`` each (UTF-8, undecodable bytes replaced); ``isolated`` is False when
    only the rlimits applied (no bubblewrap)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    isolated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_in_sandbox(
    code: str, stdin: str = "", limits: SandboxLimits | None = None, sandbox: str = "auto"
) -> SandboxResult:
    """Run Python ``code`` with ``stdin`` under ``limits`` and return what happened.

    ``sandbox``: ``auto`` (the default) or ``bwrap``: under bubblewrap, or :class:`SandboxUnavailable`
    where it does not work here; ``none``: UNSAFE, the rlimits alone, with a warning. Nothing the
    code does raises here; a broken set-up (no sandbox, no temporary folder, no free uid) does.
    """
    limits = limits if limits is not None else SandboxLimits()
    return _execute(code, stdin, limits, sandbox_backend(sandbox))


def sandbox_backend(
    sandbox: str = "auto", what: str = "model-written code", opt_out: str = 'sandbox="none"'
) -> str | None:
    """The bwrap executable ``sandbox`` runs under, or ``None`` for ``sandbox="none"`` (unsafe, warned once).

    Without a working bubblewrap, ``auto`` and ``bwrap`` raise :class:`SandboxUnavailable`: its message
    names ``what`` would run, why there is no sandbox, how to get one, and ``opt_out`` (the unsafe way on).
    """
    if sandbox not in SANDBOX_CHOICES:
        raise ValueError(f"sandbox={sandbox!r} is not one of {', '.join(SANDBOX_CHOICES)}")
    if sandbox == "none":
        _warn_unsafe()
        return None
    problem = bwrap_problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"refusing to run {what} without a sandbox: {problem}. {GET_A_SANDBOX} Or opt out, UNSAFE: {opt_out} "
            f"runs model-written code with your user's rights ({UNSAFE_RIGHTS})."
        )
    return shutil.which("bwrap")


def bwrap_problem() -> str | None:
    """``None`` where bubblewrap works here (probed once per process), else why not."""
    bwrap = shutil.which("bwrap")
    return "bubblewrap (bwrap) is not installed" if bwrap is None else _probe(bwrap)


def _warn_unsafe() -> None:
    if _WARNED:
        return
    _WARNED.add("none")
    root = " As root, the process-count limit does not apply, so a fork bomb is not contained." if _root() else ""
    warnings.warn(
        f"sandbox='none': model-written code runs UNSANDBOXED with your user's rights, with rlimits only: "
        f"{UNSAFE_RIGHTS}.{root} Use it only where nothing on this machine needs protecting.",
        RuntimeWarning,
        stacklevel=3,
    )


def _root() -> bool:
    return os.geteuid() == 0


@functools.cache
def _probe(bwrap: str) -> str | None:
    """``None`` if ``bwrap`` starts a program here with our arguments and the program sees nothing of the
    host (a marker file, the network, other processes), checked once per process; else why not."""
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-probe-") as folder:
        Path(folder).chmod(0o755)  # as root the program runs as a leased uid: it must be able to see the marker
        marker = Path(folder) / "host-file"
        marker.write_text("visible")
        marker.chmod(0o644)
        try:
            result = _execute(_PROBE.format(marker=str(marker)), "", SandboxLimits(timeout=60), bwrap)
        except OSError as error:
            return f"{bwrap} failed to start: {error}"
    if not result.ok:
        return f"{bwrap} cannot run here ({result.stderr.strip()[-300:] or result.status})"
    seen = result.stdout.strip()
    return None if not seen else f"{bwrap} runs here but does not isolate: the sandboxed program saw {seen}"


# ---------------------------------------------------------------------------- one execution


def _execute(code: str, stdin: str, limits: SandboxLimits, bwrap: str | None) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-") as folder, _uid_for(bwrap) as uid:
        host = Path(folder)
        (host / "work").mkdir()
        solution = host / "work" / "solution.py"
        solution.write_bytes(code.encode("utf-8", errors="replace"))
        solution.chmod(0o644)  # readable by the leased uid whatever our umask
        (host / "stdin").write_bytes(stdin.encode("utf-8", errors="replace"))
        interpreter = os.path.realpath(sys.executable)
        processes = limits.max_processes + (1 if bwrap is not None and uid < 0 else 0)  # bwrap's reaper counts
        runner = [interpreter, "-I", "-c", _RUNNER, str(limits.cpu_seconds), str(limits.memory_mb << 20)]
        runner += [str(processes), str(limits.output_bytes + 1), str(uid)]
        command = runner if bwrap is None else [*_bwrap_args(bwrap, host, limits, uid), *runner]
        start = time.monotonic()
        with open(host / "stdin", "rb") as i, open(host / "stdout", "wb") as o, open(host / "stderr", "wb") as e:
            process = subprocess.Popen(
                command, stdin=i, stdout=o, stderr=e, env={}, cwd=host / "work", start_new_session=True
            )
        timed_out = _wait(process, limits.timeout)
        if timed_out and uid >= 0:
            _wait_until_gone(uid)
        seconds = time.monotonic() - start
        out, out_full = _read(host / "stdout", limits.output_bytes)
        err, err_full = _read(host / "stderr", limits.output_bytes)
    status = "timeout" if timed_out else "output_limit" if out_full or err_full else "ok"
    if status == "ok" and process.returncode != 0:
        status = "error"
    return SandboxResult(status, None if timed_out else process.returncode, out, err, bwrap is not None, seconds)


def _bwrap_args(bwrap: str, host: Path, limits: SandboxLimits, uid: int) -> list[str]:
    """As root, every namespace but the user one, so the runner can drop to the leased ``uid``
    with the two capabilities it keeps for that; otherwise a user namespace, no capabilities."""
    if uid >= 0:
        isolation = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        isolation += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        isolation = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    args = [bwrap, *isolation, "--die-with-parent", "--new-session", "--clearenv"]
    for path in ("/usr", "/lib", "/lib64", "/bin"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    bound = ["/usr"]
    for path in (os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))):
        if not any(path == b or path.startswith(b + "/") for b in bound):
            # bwrap would create the missing parents (/root, ...) 0700: unreadable after the uid drop
            parents = list(reversed(Path(path).parents))[1:]
            args += [arg for parent in parents for arg in ("--perms", "0755", "--dir", str(parent))]
            args += ["--ro-bind", path, path]
            bound.append(path)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.disk_mb << 20), "--perms", "01777"]
    args += ["--tmpfs", "/sandbox", "--ro-bind", str(host / "work" / "solution.py"), "/sandbox/solution.py"]
    return [*args, "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/sandbox"]


def _wait(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds; on expiry kill the process group (bwrap: the sandbox). True if killed."""
    try:
        process.wait(timeout)
        return False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return True


def _read(path: Path, limit: int) -> tuple[str, bool]:
    """At most ``limit`` bytes of ``path`` as text, and whether the file went past ``limit``."""
    with open(path, "rb") as file:
        data = file.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


# ---------------------------------------------------------------------------- uids (as root)


@contextlib.contextmanager
def _uid_for(bwrap: str | None) -> Iterator[int]:
    """A leased uid for a root bwrap sandbox, else -1 (the code keeps our uid)."""
    if bwrap is None or not _root():
        yield -1
        return
    folder = Path(tempfile.gettempdir()) / "rloo-sandbox-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.geteuid():
        raise RuntimeError(f"{folder} is not a folder of ours; remove it")
    for uid in range(FIRST_UID, FIRST_UID + UID_SLOTS):
        fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"all {UID_SLOTS} sandbox uids from {FIRST_UID} are in use; run fewer executions at once")


def processes_of(uids: range) -> list[int]:
    """PIDs of the processes whose real uid is in ``uids``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, StopIteration):
                status = Path(f"/proc/{entry}/status").read_text()
                uid = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]
                if int(uid) in uids:
                    pids.append(int(entry))
    return pids


def _wait_until_gone(uid: int, seconds: float = 10.0) -> None:
    """After a kill, wait until no process of ``uid`` is left (the kernel ends the namespace's
    processes asynchronously), so the next lease of the uid starts at zero processes."""
    deadline = time.monotonic() + seconds
    while processes_of(range(uid, uid + 1)) and time.monotonic() < deadline:
        time.sleep(0.01)
