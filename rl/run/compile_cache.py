"""The persistent XLA compilation cache that the command lines (rl.train, rl.eval, rl.sft)
turn on: compiled programs are kept on disk and reused by later processes."""

from __future__ import annotations

from pathlib import Path


def use_compile_cache(path: str | Path | None, max_bytes: int = 1 << 30) -> None:
    """Store compiled programs under `path` and look them up there before compiling (None or
    "": off). Call before the first compilation. A rollout compiles one program per batch
    shape; on CPU a warm cache took a 2-step search_qa run of the shipped model from 45 s to
    33 s. Programs compiled in under a second are not stored (JAX's default threshold). The
    cache runs code from its folder: keep it where only you can write. It is kept under
    `max_bytes` by deleting the least recently used programs (unless the environment variable
    JAX_COMPILATION_CACHE_MAX_SIZE sets another bound)."""
    if not path:
        return
    import jax

    folder = Path(path).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    if jax.config.values["jax_compilation_cache_max_size"] == -1:  # JAX's default: no bound
        jax.config.update("jax_compilation_cache_max_size", max_bytes)
