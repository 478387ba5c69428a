"""The shipped world cache survives a kill mid-write: a later run never reads a partial file
(issue 22: a run killed in its first 2 s left test.jsonl with 19 of 200 questions, and every
later run silently used those 19)."""

import json
import os
from pathlib import Path

import pytest

import core.files
from rl.tasks.search.datasets import load_qa
from rl.tasks.search.task import shipped_world
from rl.tasks.search.world import world_problem, world_settings, write_world

SIZES = {"train": 30, "dev": 10, "test": 25}
ARGS = dict(seed=1, n_entities=300, n_train=30, n_dev=10, n_test=25)


def _world(cache_dir):
    shipped_world.cache_clear()  # one process caches the paths; a later run starts afresh
    return shipped_world(str(cache_dir), *ARGS.values())


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even `except Exception`)."""


def test_kill_while_writing_a_split_leaves_no_partial_file_and_the_next_run_rebuilds(
        tmp_path, monkeypatch):
    real_fsync = os.fsync
    written = []

    def fsync_then_die(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        written.append(name)
        if ".test.jsonl.tmp-" in name:  # half the bytes are in the temp file: die now
            raise Killed()
        real_fsync(fd)

    monkeypatch.setattr(core.files.os, "fsync", fsync_then_die)
    with pytest.raises(Killed):
        _world(tmp_path)
    monkeypatch.setattr(core.files.os, "fsync", real_fsync)
    (out,) = tmp_path.iterdir()
    assert any(".test.jsonl.tmp-" in w for w in written)
    assert not (out / "test.jsonl").exists()  # never a partial file under the real name
    assert not (out / "manifest.json").exists()
    assert world_problem(out, world_settings(1, 300, SIZES)) is not None
    paths = _world(tmp_path)
    assert [_rows(paths[s]) for s in SIZES] == [30, 10, 25]
    assert len(load_qa(paths["test"])) == 25


def test_truncated_split_of_an_old_cache_is_detected_and_rebuilt(tmp_path, caplog):
    paths = _world(tmp_path)
    out = paths["test"].parent
    lines = paths["test"].read_text(encoding="utf-8").splitlines(keepends=True)
    paths["test"].write_text("".join(lines[:19]), encoding="utf-8")  # the 19 rows
    # the old manifest had no checksums and no format
    (out / "manifest.json").write_text(json.dumps({"seed": 1, "n_entities": 300,
                                                   "sizes": SIZES}), encoding="utf-8")
    assert "format" in world_problem(out, world_settings(1, 300, SIZES))
    with caplog.at_level("WARNING"):
        paths = _world(tmp_path)
    assert "unusable" in caplog.text and str(out) in caplog.text
    assert _rows(paths["test"]) == 25


def test_truncated_split_under_a_current_manifest_is_detected(tmp_path):
    paths = write_world(tmp_path, seed=1, n_entities=300, sizes=SIZES)
    assert world_problem(tmp_path, world_settings(1, 300, SIZES)) is None
    with open(paths["test"], "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    problem = world_problem(tmp_path, world_settings(1, 300, SIZES))
    assert "test.jsonl" in problem and "expected 25" in problem
    assert "sizes" in world_problem(tmp_path, world_settings(1, 300, {**SIZES, "test": 26}))


def test_a_complete_cache_is_reused_not_rewritten(tmp_path):
    paths = _world(tmp_path)
    stamp = {n: p.stat().st_mtime_ns for n, p in paths.items()}
    again = _world(tmp_path)
    assert {n: p.stat().st_mtime_ns for n, p in again.items()} == stamp


def test_bm25_index_cache_whose_meta_disagrees_with_the_corpus_is_rebuilt(tmp_path):
    from rl.tasks.search.corpus import Doc, write_corpus
    from rl.tasks.search.retriever import BM25Retriever

    docs = [Doc(id=str(i), title=f"T{i}", text=f"word{i} text") for i in range(5)]
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    BM25Retriever.build(corpus, tmp_path / "bm25")
    (entry,) = (tmp_path / "bm25").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "num_docs": 3}))  # a stale index
    assert not BM25Retriever.build(corpus, tmp_path / "bm25").loaded_from_cache
    assert BM25Retriever.build(corpus, tmp_path / "bm25").loaded_from_cache


KILL_SCRIPT = """
import sys
from rl.tasks.search.task import shipped_world
shipped_world(sys.argv[1], 1, 2000, 1000, 100, 200)
"""


@pytest.mark.parametrize("after_s", [0.0, 0.15, 0.4])
def test_kill_9_while_the_world_is_written_then_a_later_run_reads_only_complete_files(
        tmp_path, after_s):
    """The issue's reproduction: SIGKILL a run while it writes the shipped world (200 test
    questions), then start again: never fewer than 200 (a later run rebuilds)."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)],
                            cwd=Path(__file__).resolve().parents[4])
    deadline = time.monotonic() + 60
    while not any(tmp_path.rglob("*.jsonl*")) and time.monotonic() < deadline:
        time.sleep(0.005)  # the world is being written: its first file appeared
    time.sleep(after_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (out,) = tmp_path.iterdir()
    settings = world_settings(1, 2000, {"train": 1000, "dev": 100, "test": 200})
    if world_problem(out, settings) is None:  # the kill came after the manifest: complete
        assert _rows(out / "test.jsonl") == 200
    shipped_world.cache_clear()
    paths = shipped_world(str(tmp_path), 1, 2000, 1000, 100, 200)
    assert [_rows(paths[s]) for s in ("train", "dev", "test")] == [1000, 100, 200]
    assert len(load_qa(paths["test"])) == 200
