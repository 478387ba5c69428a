"""Writing files so that a kill at any moment leaves either the old content or the new one.

Every file the library rewrites (metrics on resume) or creates as a cache (the search world,
judge and bundling caches) goes through `write_atomic`: the bytes go to a temporary file in the
same folder, are flushed to disk, and the temporary file is renamed over the target
(`os.replace` is atomic on POSIX and Windows within one file system).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> None:
    """Replace `path` with `data` atomically; the folder is created if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode(encoding) if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class NotUtf8Error(ValueError):
    """A text file that is not UTF-8; the message names the file, the byte and the line."""


def read_utf8(path: str | Path) -> str:
    """The text of `path`, which must be UTF-8 (`NotUtf8Error` naming where it is not)."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise NotUtf8Error(f"{path}: not UTF-8 at byte {e.start} (line {line}); re-save the "
                           "file as UTF-8") from None
