"""A local folder whose files are copied whole to a run folder on object storage.

The run log (``metrics.jsonl``, ``samples.jsonl``, the TensorBoard events, ...) grows by
appending, and object stores (``gs://``) hold immutable objects: an append is a rewrite of
the whole object. So a run whose ``trainer.run_dir`` is a URL writes its log in a local
folder (:func:`rl.run.folder.local_mirror`) and :class:`RunMirror` copies the files that
changed to the URL: every :data:`SYNC_EVERY_S` seconds while training, after every checkpoint
and when the run ends. A resume on another machine first copies the URL's log down
(:meth:`RunMirror.pull`). Checkpoints do not pass through here: orbax writes them to the URL
itself.

A failed copy (the store unreachable for a while) is retried :data:`TRIES` times, counted
(``failures``) and logged; the files stay in the local folder and the next copy sends them.
Only the final copy, at the end of the run, raises when it cannot finish, naming the local
folder that still holds the log.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from etils import epath

from rl.run.folder import is_url

log = logging.getLogger(__name__)

SYNC_EVERY_S = 30.0  # the longest a step's record waits in the local folder
TRIES = 3
SKIP = ("checkpoints",)  # written to the URL by orbax itself (checkpoints/, checkpoints_corrupt/)


class RunMirror:
    def __init__(self, local: Path, remote: epath.Path):
        self.local, self.remote = Path(local), remote
        self.failures = 0  # copies that failed after every retry
        self._sent: dict[str, tuple[int, int]] = {}  # relative path: (size, mtime_ns) sent
        self._last = 0.0

    def pull(self) -> None:
        """Make the local folder a copy of the URL's run log (at every start: a resume may
        run on another machine, and a fresh start on this one must not inherit files of an
        earlier run of the URL)."""
        if self.local.exists():
            shutil.rmtree(self.local)
        self.local.mkdir(parents=True)
        if not self.remote.exists():
            return
        for rel in _files(self.remote):
            target = self.local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((self.remote / rel).read_bytes())
            self._sent[rel] = _state(target)

    def sync(self, force: bool = False) -> None:
        """Copy the files that changed since the last copy, and remove from the URL those
        deleted here; at most every SYNC_EVERY_S seconds unless `force`. A failure is retried,
        then counted and logged (`force`: raised)."""
        if not force and time.monotonic() - self._last < SYNC_EVERY_S:
            return
        self._last = time.monotonic()
        for attempt in range(1, TRIES + 1):
            try:
                self._copy()
                return
            except Exception as e:  # network and storage errors alike
                if attempt < TRIES:
                    time.sleep(0.5 * 2 ** attempt)
                    continue
                self.failures += 1
                if force:
                    raise OSError(f"the run log could not be copied to {self.remote} "
                                  f"({type(e).__name__}: {e}); it is whole in {self.local}"
                                  ) from e
                log.warning("the run log could not be copied to %s (%s: %s; %d failed "
                            "copies); it stays in %s and the next copy sends it", self.remote,
                            type(e).__name__, e, self.failures, self.local)

    def _copy(self) -> None:
        now = {rel: _state(self.local / rel) for rel in _files(self.local)}
        for rel, state in now.items():
            if self._sent.get(rel) != state:
                if not is_url(self.remote):  # object stores have no folders to make
                    (self.remote / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.remote / rel).write_bytes((self.local / rel).read_bytes())
                self._sent[rel] = state
        for rel in [r for r in self._sent if r not in now]:  # truncated away or deleted here
            (self.remote / rel).unlink(missing_ok=True)
            del self._sent[rel]


def _files(folder: Path | epath.Path, prefix: str = "") -> list[str]:
    """The run log's files under `folder`, as paths relative to it: not the checkpoints
    (orbax writes those to the URL itself), not hidden ones (the run folder's token, the
    temporary files of atomic writes). Folder by folder: object stores refuse ``**``."""
    out: list[str] = []
    for entry in folder.iterdir():
        rel = f"{prefix}{entry.name}"
        if entry.name.startswith(".") or (not prefix and entry.name.startswith(SKIP)):
            continue
        if entry.is_dir():
            out += _files(entry, rel + "/")
        else:
            out.append(rel)
    return out


def _state(f: Path) -> tuple[int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns
