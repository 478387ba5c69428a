"""The documentation site: `make docs`'s strict build passes (every page in the nav exists, every
link and anchor resolves, every API page renders), and the config reference it generates reads
each key's meaning from where conf/ states it, refusing a key that has none."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is in the dev extra")
def test_the_site_builds_strictly(tmp_path):
    out = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict",
                          "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                         text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    # a key from each kind of source: a typed section, a task option, a method key, rl.sft
    for key in ("trainer.max_steps", "task.max_turns", "algo.rubric_lambda", "sft.examples"):
        assert f"<code>{key}</code>" in page, key
    # the build's own hook and Python caches are not published with the pages
    assert not list((tmp_path / "site").rglob("*.py")), list((tmp_path / "site").rglob("*.py"))
    assert not list((tmp_path / "site").rglob("__pycache__"))


YAML = """\
# An option's header: what it is
# (two lines)
name: demo           # the option's name
size: 4              # rows per step, continued
                     # on the next line
# a block comment covers the uncommented keys right below it
a: 1
b: 2

c: 3
nested:              # a mapping: its keys are documented one by one
  rank: 0            # the rank
  targets: [x, y]
wired: ${algo.size}
"""


def test_meanings_come_from_trailing_comments_blocks_and_wiring(tmp_path):
    hooks = _hooks()
    (tmp_path / "demo.yaml").write_text(YAML)
    doc = hooks.read_yaml_doc(tmp_path / "demo.yaml")
    meanings = {k.path: k.meaning for k in doc.keys if not k.parent}
    assert doc.header == "An option's header: what it is (two lines)"
    assert meanings == {
        "name": "the option's name",
        "size": "rows per step, continued on the next line",
        "a": "a block comment covers the uncommented keys right below it",
        "b": "a block comment covers the uncommented keys right below it",
        "c": None,  # after a blank line the block no longer applies
        "nested.rank": "the rank",
        "nested.targets": None,  # the parent's comment is the mapping's, not its keys'
        "wired": None,
    }
    assert [k.value for k in doc.keys if k.path in ("size", "nested.targets", "wired")] == [
        "4", "[x, y]", "${algo.size}"]


def test_a_key_without_a_meaning_is_named_with_its_file_and_line(tmp_path):
    hooks = _hooks()
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    page, missing = hooks.config_reference(conf)
    assert missing == []
    assert ("| `algo.rewarder_options.k_consol` | — | `${algo.k_consol}` | = `algo.k_consol` "
            "(wired from the key above) |") in page
    assert "| `trainer.resume` | false or true or \"auto\" | `false` |" in page  # rl/run/config.py
    assert "| `task.topk` | int | `3` | documents returned per search |" in page  # the YAML's
    with (conf / "trainer" / "default.yaml").open("a") as f:
        f.write("new_option: 3\n")
    _, missing = hooks.config_reference(conf)
    lines = (conf / "trainer" / "default.yaml").read_text().count("\n")
    assert missing == [f"{conf / 'trainer' / 'default.yaml'}:{lines}: new_option"]
