"""rl.run.provenance: what made a run, read from a git checkout built by the test."""

import subprocess

import jax

from rl.run import provenance as prov


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_the_commit_the_uncommitted_changes_and_untracked_files(tmp_path, monkeypatch):
    root = tmp_path / "lib"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.py").write_text("x = 1\n")
    _git(root, "add", "a.py")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(prov, "ROOT", root)
    clean = prov.code_state()
    assert clean["git"] == _git(root, "rev-parse", "HEAD") and clean["dirty"] is False
    assert clean["diff"] == "" and clean["untracked"] == []
    (root / "a.py").write_text("x = 2\n")
    (root / "new.py").write_text("")
    dirty = prov.code_state()
    assert dirty["dirty"] is True and dirty["untracked"] == ["new.py"]
    assert "-x = 1\n+x = 2" in dirty["diff"] and dirty["diff_truncated"] is False
    monkeypatch.setattr(prov, "MAX_DIFF", 10)
    cut = prov.code_state()
    assert len(cut["diff"]) == 10 and cut["diff_truncated"] is True


def test_not_a_checkout_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(prov, "ROOT", tmp_path)
    state = prov.code_state()
    assert state["git"] is None and str(tmp_path) in state["reason"]


def test_packages_devices_and_host():
    record = prov.provenance()
    assert record["packages"]["jax"] == jax.__version__
    assert record["devices"]["count"] == jax.device_count()
    assert record["devices"]["kind"] == jax.devices()[0].device_kind
    assert record["hosts"] == [{"process": 0, "hostname": record["hosts"][0]["hostname"],
                                "cpu": prov.cpu_model()}]
    assert record["command"]["python_version"].count(".") == 2
