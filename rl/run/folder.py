"""The run folder (``trainer.run_dir``) as a job sees it: one folder, the same on every host.

A multi-host job writes one run folder: process 0 its logs, every process its checkpoint
shards. If the hosts do not share the folder (a local path on each VM of a TPU slice, a
mount missing on one node), each writes its own half of every checkpoint and a resume
restores garbage or nothing. :func:`check_shared` proves the folder is shared before the
first step: process 0 writes a token with a random nonce, every other process must read the
same nonce back, and the job stops with an error naming ``trainer.run_dir`` when one cannot.

Paths go through ``etils.epath`` (what orbax reads and writes with), so the run folder may
be on object storage (``gs://bucket/run``, with the ``gcs`` extra: gcsfs) as well as on a file
system every host mounts (NFS, Filestore, a GCS FUSE mount). Checkpoints go straight to it;
the run log, whose files grow by appending, which object stores cannot do, is written in a
local folder and copied there (:mod:`rl.run.mirror`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from etils import epath

from rl.run.config import ConfigError

TOKEN = ".run_dir_token"  # process 0's nonce, rewritten at every start


def is_url(run_dir: str | os.PathLike) -> bool:
    """Is `run_dir` on object storage (``gs://...``, ``s3://...``)?"""
    return "://" in str(run_dir)


def run_path(run_dir: str) -> epath.Path:
    """`run_dir` as an absolute path, or as the object-storage URL it is; ConfigError naming
    ``trainer.run_dir`` when the storage's package is missing or the URL cannot be read."""
    if not is_url(run_dir):
        return epath.Path(run_dir).expanduser().absolute()
    path = epath.Path(str(run_dir).rstrip("/"))
    scheme = str(run_dir).split("://")[0]
    try:
        path.exists()
    except ImportError as e:  # epath reaches gs:// through gcsfs, s3:// through s3fs
        package = {"gs": "gcsfs (pip install 'rubricrl[gcs]')", "s3": "s3fs"}.get(scheme, e.name)
        raise ConfigError(f"trainer.run_dir={run_dir}: {scheme}:// needs the package "
                          f"{package}: {e}") from e
    except Exception as e:  # no credentials, no such bucket, no network: before any compute
        raise ConfigError(f"trainer.run_dir={run_dir}: cannot be read: "
                          f"{type(e).__name__}: {e}") from e
    return path


def local_mirror(url: str) -> Path:
    """The local folder that holds the run log of a run folder on object storage (the same
    for every start of that URL on one machine; :mod:`rl.run.mirror` fills it from the URL
    on a machine that lacks it)."""
    digest = hashlib.sha256(str(url).rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "rl-run-log" / digest


def move_folder(src: epath.Path, dst: epath.Path) -> None:
    """Move the folder `src` to `dst`: a rename on a file system; on object storage, which has
    no folders to rename, each file copied and then the source removed."""
    if not is_url(src):
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
        return
    _copy_tree(src, dst)
    src.rmtree()


def _copy_tree(src: epath.Path, dst: epath.Path) -> None:
    for entry in src.iterdir():  # folder by folder: object stores refuse ``**``
        if entry.is_dir():
            _copy_tree(entry, dst / entry.name)
        else:
            entry.copy(dst / entry.name)


def check_shared(folder: epath.Path, exchange: Any, wait_s: float = 30.0) -> None:
    """Every process of the job sees `folder` as the same folder, or ConfigError on every
    process naming ``trainer.run_dir`` and the processes that do not. Process 0 creates the
    folder and writes :data:`TOKEN` with a fresh nonce; each other process reads it for up to
    `wait_s` seconds (a network file system may show a new file late). Nothing is deleted.
    `exchange`: the job's ``rl.run.multihost.Exchange``."""

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
