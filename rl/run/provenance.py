"""What made a run: the code, the packages, the devices, the hosts and the command line.

``rl.train`` appends one record per start or resume to ``provenance.jsonl`` in the run folder
(never rewritten, so a resumed run keeps the record of every start; process 0 writes it):

* ``code``: the library's git commit, whether the checkout had uncommitted changes, and
  those changes as ``git diff HEAD`` text (``diff``, up to :data:`MAX_DIFF` characters;
  ``diff_truncated`` says when it was cut) plus the untracked files' names; ``{"git": null}``
  with the reason when the library is not a git checkout (an installed wheel); always the
  installed distribution's version;
* ``packages``: the versions of :data:`PACKAGES` that are installed (absent ones omitted);
* ``devices``: platform, device kind, global and local device counts, process count;
* ``hosts``: per process, its host name and CPU model (gathered in a multi-process job: hosts
  with different CPUs are where host-side float results can differ);
* ``command``: the command line (``sys.argv``), the Python executable and version.
"""

from __future__ import annotations

import importlib.metadata as metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("jax", "jaxlib", "libtpu", "libtpu-nightly", "jax-cuda12-plugin", "jax-cuda13-plugin",
            "optax", "orbax-checkpoint", "flax", "transformers", "numpy", "hydra-core", "qwix",
            "tokenizers")
MAX_DIFF = 200_000  # characters of uncommitted changes kept in one record
ROOT = Path(__file__).resolve().parents[2]  # the library's checkout (or site-packages)
DISTRIBUTION = "rubricrl"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state() -> dict[str, Any]:
    """The library's commit and uncommitted changes (see the module docstring)."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    commit = _git("rev-parse", "HEAD")
    if commit is None or not (ROOT / ".git").exists():
        return {"version": version, "git": None,
                "reason": f"{ROOT} is not a git checkout (an installed package?)"}
    diff = _git("diff", "HEAD") or ""
    untracked = (_git("ls-files", "--others", "--exclude-standard") or "").split()
    return {"version": version, "git": commit.strip(), "dirty": bool(diff or untracked),
            "diff": diff[:MAX_DIFF], "diff_truncated": len(diff) > MAX_DIFF,
            "untracked": untracked}


def packages() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict[str, Any]:
    import jax

    return {"process": jax.process_index(), "hostname": socket.gethostname(),
            "cpu": cpu_model()}


def devices() -> dict[str, Any]:
    import jax

    first = jax.devices()[0]
    return {"platform": first.platform, "kind": first.device_kind,
            "count": jax.device_count(), "local_count": jax.local_device_count(),
            "processes": jax.process_count()}


def provenance(exchange: Any = None) -> dict[str, Any]:
    """This start's record; with a job's `exchange`, every process's host (each process must
    call it: the hosts are gathered)."""
    hosts = [host()] if exchange is None else exchange.gather(host(), "host description")
    return {"code": code_state(), "packages": packages(), "devices": devices(),
            "hosts": hosts,
            "command": {"argv": list(sys.argv), "python": sys.executable,
                        "python_version": platform.python_version()}}
