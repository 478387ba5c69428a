import os

import pytest

from core.files import write_atomic


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "a.jsonl"
    write_atomic(p, "one\n")
    write_atomic(p, "two\n")
    assert p.read_text() == "two\n"
    assert os.listdir(p.parent) == ["a.jsonl"]


def test_write_atomic_failure_keeps_old_content(tmp_path, monkeypatch):
    p = tmp_path / "a.txt"
    write_atomic(p, b"old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(p, "new")
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.txt"]
