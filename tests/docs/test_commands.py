"""Every command the README and the documentation show still means something: each hydra
command line (``python -m rl.train|rl.eval|rl.sft|rl.plan ...``) composes with its overrides
and passes the run configuration's checks (a renamed key, a removed option or a bad value
fails here), each other module it runs exists, each example script exists (the tests under
tests/examples run them), each ``make`` target is in the Makefile and each pip extra in
pyproject.toml. Running them all is not possible here (pods, model folders, LLM servers): this
is the check that they are not stale."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
HYDRA_CONFIGS = {"rl.train": "config", "rl.eval": "config", "rl.smoke": "config",
                 "rl.sft": "sft", "rl.plan": "plan"}
_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each command line of the pages' bash blocks (continuations joined,
    comments dropped)."""
    out = []
    for page in PAGES:
        for block in _BLOCK.findall(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    out.append((str(page.relative_to(ROOT)), line))
    return out


def _hydra_overrides(args: list[str]) -> list[str]:
    """The overrides of a command line as one run of it: a multirun's first value of each
    sweep, without hydra's own keys (its launchers and sweepers are plugins) and placeholders."""
    out = []
    for arg in args:
        if arg in ("-m", "--multirun", "...") or "=" not in arg or arg.startswith("hydra"):
            continue
        key, value = arg.split("=", 1)
        if re.match(r"(interval|choice|range)\(", value):
            continue
        if "," in value and not value.startswith(("[", "{")):
            value = value.split(",")[0]
        out.append(f"{key}={value}")
    return out


def _check_hydra_command(module: str, args: list[str]) -> None:
    from rl.run.config import check, eval_config, parse, parse_plan
    from rl.run.resolve import resolved_config

    overrides = _hydra_overrides(args)
    if not any(o.startswith("trainer.run_dir=") for o in overrides):
        overrides.append("trainer.run_dir=x")  # hydra's output folder only exists under hydra
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(HYDRA_CONFIGS[module], overrides=overrides)
    resolved = resolved_config(cfg)  # as the commands resolve it (a preset's ${needs:...})
    if module == "rl.plan":
        run, _ = parse_plan(resolved)
    else:  # rl.sft's own section is read by rl.sft
        run = parse({k: v for k, v in resolved.items() if k != "sft"})
    check(run)
    if module == "rl.eval":
        eval_config(resolved["eval"])


COMMANDS = shown_commands()


def test_the_pages_show_commands():
    modules = {c.split("python -m ")[1].split()[0] for _, c in COMMANDS if "python -m " in c}
    assert {"rl.train", "rl.eval", "rl.sft", "rl.plan", "rl.export"} <= modules


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_a_shown_command_is_not_stale(page, command):
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    # shell variables of the multi-host examples stand for a process's rank
    words = shlex.split(re.sub(r"\$\w+|\$\{\w+\}", "0", command.split(";")[-1]))
    if "python" in words and "-m" in words and words.index("-m") == words.index("python") + 1:
        module = words[words.index("-m") + 1]
        args = words[words.index("-m") + 2:]
        assert importlib.util.find_spec(module) is not None, f"{page}: no module {module}"
        if module in HYDRA_CONFIGS:
            _check_hydra_command(module, args)
    elif "python" in words and words[words.index("python") + 1].startswith("examples/"):
        script = words[words.index("python") + 1]
        assert (ROOT / script).is_file(), f"{page}: no script {script}"
    elif words[0] == "make":
        assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), f"{page}: no target"
    elif words[:2] == ["pip", "install"]:
        for extra in re.findall(r"\.\[([\w,-]+)\]", command):
            for name in extra.split(","):
                assert name in extras, f"{page}: no extra {name}"


@pytest.mark.parametrize("args", [["algo.no_such_key=1"], ["algo=no_such_algo"],
                                  ["algo=grpo", "algo.consistency_filter=prof"]])
def test_a_stale_command_fails_the_check(args):
    from hydra.errors import HydraException

    from rl.run.config import ConfigError

    with pytest.raises((HydraException, ConfigError)):
        _check_hydra_command("rl.train", args)
