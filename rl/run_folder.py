"""The run folder (``trainer.run_dir``) as a job sees it: one folder, the same on every host.

A multi-host job writes one run folder: process 0 its logs, every process its checkpoint
shards. If the hosts do not share the folder (a local path on each VM of a TPU slice, a
mount missing on one node), each writes its own half of every checkpoint and a resume
restores garbage or nothing. :func:`check_shared` proves the folder is shared before the
first step: process 0 writes a token with a random nonce, every other process must read the
same nonce back, and the job stops with an error naming ``trainer.run_dir`` when one cannot.

Paths go through ``etils.epath`` (what orbax reads and writes with). An object-store URL
(``gs://...``) is refused for now, by name: the run log appends to its files, which object
stores cannot; a shared file system mounted on every host (NFS, Filestore, a GCS FUSE
mount) works.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from etils import epath

from rl.config import ConfigError

TOKEN = ".run_dir_token"  # process 0's nonce, rewritten at every start


def run_path(run_dir: str) -> epath.Path:
    """`run_dir` as an absolute path; ConfigError naming ``trainer.run_dir`` for a URL."""
    if "://" in str(run_dir):
        raise ConfigError(
            f"trainer.run_dir={run_dir}: run folders on object storage are not supported yet "
            f"(the run log appends to its files); use a folder of a file system every host "
            f"mounts (NFS, Filestore, a GCS FUSE mount)")
    return epath.Path(run_dir).expanduser().absolute()


def check_shared(folder: epath.Path, exchange: Any, wait_s: float = 30.0) -> None:
    """Every process of the job sees `folder` as the same folder, or ConfigError on every
    process naming ``trainer.run_dir`` and the processes that do not. Process 0 creates the
    folder and writes :data:`TOKEN` with a fresh nonce; each other process reads it for up to
    `wait_s` seconds (a network file system may show a new file late). Nothing is deleted.
    `exchange`: the job's ``rl.multihost.Exchange``."""

    def write() -> str:
        nonce = secrets.token_hex(16)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TOKEN).write_text(nonce)
        return nonce

    nonce = exchange.from_leader(write, "process 0's run folder token")
    seen = exchange.rank == 0 or _reads(folder / TOKEN, nonce, wait_s)
    blind = [i for i, ok in enumerate(exchange.gather(seen, "view of the run folder")) if not ok]
    if blind:
        raise ConfigError(
            f"trainer.run_dir={folder}: process(es) {blind} do not see the folder process 0 "
            f"writes (its token {TOKEN} with this start's nonce did not appear there within "
            f"{wait_s:.0f} s). Every host of a job must write one shared folder: use a path on a "
            f"file system all hosts mount")


def _reads(path: epath.Path, nonce: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if path.read_text().strip() == nonce:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
