"""Run llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) on 127.0.0.1 for the
duration of a ``with`` block: used by the judge tests and the judge benchmark."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_llamacpp(model: str | Path, log_path: str | Path, timeout_s: float = 180,
                   n_threads: int | None = None, n_ctx: int = 2048) -> Iterator[str]:
    """Start the server on a free loopback port, wait (bounded) until /v1/models answers,
    yield its base URL (``http://127.0.0.1:PORT/v1``), and always stop it.

    Raises RuntimeError with the log's tail if the server exits or is not ready in time.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
           "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx)]
    if n_threads:
        cmd += ["--n_threads", str(n_threads), "--n_threads_batch", str(n_threads)]
    log_path = Path(log_path)
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"

    def tail() -> str:
        return log_path.read_text(errors="replace")[-3000:]

    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited ({proc.returncode}):\n{tail()}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp server not ready after {timeout_s:.0f}s:\n{tail()}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()
