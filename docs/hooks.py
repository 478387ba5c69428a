"""mkdocs hook: writes ``docs/reference/config.md``, every config key with its type, default and
meaning, from the one place they are stated: the YAML under ``conf/`` (the default and, as a
comment on the key's line or in the comment block right above it, the meaning) and the typed
sections of ``rl/run/config.py`` (the type).

A key without a meaning in any file of its group fails the build, naming the file, line and key,
so a new option cannot reach main undocumented. A key whose value is an interpolation of another
key (``rewarder_options.k_consol: ${algo.k_consol}``) is wiring, documented as "= that key".
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
OUT = ROOT / "docs" / "reference" / "config.md"
SKIPPED = ("defaults", "hydra")  # hydra's own keys, not the library's

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w-]*)\s*:(.*)$")
_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


@dataclasses.dataclass
class Key:
    """One key of one YAML file: its dotted path, the value as written, its meaning, its line."""

    path: str
    value: str
    meaning: str | None
    line: int
    parent: bool = False  # a block mapping whose children are keys of their own


@dataclasses.dataclass
class YamlDoc:
    """A YAML file read for documentation: its header comment, its keys, its `defaults`."""

    file: Path
    header: str
    keys: list[Key]
    defaults: list[str]


def _split_comment(rest: str) -> tuple[str, str | None, int]:
    """`rest` (what follows ``key:``) as (value, trailing comment or None, the comment's offset
    in `rest`); a ``#`` inside quotes is part of the value."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip(), rest[i + 1:].strip(), i
    return rest.strip(), None, -1


def read_yaml_doc(file: Path) -> YamlDoc:
    """The keys of `file` with their meanings (see the module docstring for where they come
    from). Comment lines aligned under a key's trailing comment continue it; a comment block
    applies to the run of uncommented keys right below it at one indentation."""
    header: list[str] = []
    keys: list[Key] = []
    defaults: list[str] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    block: tuple[str, int] | None = None  # (a comment block's text, the indentation it covers)
    continued: tuple[Key, int] | None = None  # (key with a trailing comment, the comment's column)
    in_header, in_defaults = True, False
    for number, line in enumerate(file.read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            in_header = in_header and not header
            pending, block, continued = [], None, None
            continue
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            column = len(line) - len(line.lstrip())
            if in_header:
                header.append(text)
            elif continued is not None and column == continued[1]:
                continued[0].meaning = f"{continued[0].meaning} {text}".strip()
            else:
                pending.append(text)
                block, continued = None, None
            continue
        in_header = False
        if stripped.startswith("- "):
            if in_defaults:
                defaults.append(stripped[2:].strip())
            continue
        match = _KEY.match(line)
        if match is None:
            continue
        indent, name, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        in_defaults = not stack and name == "defaults"
        path = ".".join([k for _, k in stack] + [name])
        value, comment, offset = _split_comment(rest)
        if comment is not None:
            meaning, block = comment, None
        elif pending:
            meaning, block = " ".join(pending), (" ".join(pending), indent)
        elif block is not None and block[1] == indent:
            meaning = block[0]
        else:
            meaning, block = None, None
        pending = []
        key = Key(path, value, meaning, number, parent=not value)
        keys.append(key)
        continued = (key, len(line) - len(rest) + offset) if comment is not None else None
        if not value:
            stack.append((indent, name))
    keys = [k for k in keys if k.path.split(".")[0] not in SKIPPED]
    for k in keys:  # a mapping key with no keys under it is a value (a block list)
        if k.parent and not any(o.path.startswith(k.path + ".") for o in keys):
            k.parent = False
    return YamlDoc(file, " ".join(header), keys, [d for d in defaults if d != "_self_"])


# ----------------------------------------------------------------------------------- types


def _type_name(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin is Literal:
        return " or ".join(str(a).lower() if isinstance(a, bool) else f'"{a}"'
                           if isinstance(a, str) else str(a) for a in typing.get_args(kind))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(kind))
    if origin is tuple:
        return f"list[{_type_name(typing.get_args(kind)[0])}]"
    if origin is Mapping or kind is Mapping or origin is dict:
        return "mapping"
    if kind is type(None):
        return "null"
    return getattr(kind, "__name__", str(kind))


def _hint(section: type | None, path: list[str]) -> str | None:
    """The annotated type of the dotted `path` inside the section dataclass `section`."""
    kind: Any = section
    for name in path:
        if not dataclasses.is_dataclass(kind):
            return None
        hints = typing.get_type_hints(kind)
        if name not in hints:
            return None
        kind = hints[name]
    return None if dataclasses.is_dataclass(kind) else _type_name(kind)


def _yaml_type(value: str) -> str:
    """The type of a default as written, for keys no dataclass types (task, judge, plan...)."""
    import yaml

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return "str"
    if parsed is None:
        return "—"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "mapping"}.get(type(parsed), type(parsed).__name__)


def _sections() -> dict[str, type]:
    from rl.run import config

    return {"trainer": config.TrainerConfig, "algo": config.AlgoConfig,
            "model": config.ModelSection, "mesh": config.MeshConfig,
            "optim": config.OptimSection, "eval": config.EvalSection}


# ------------------------------------------------------------------------------- the page


def _cell(text: str) -> str:
    """`text` as one Markdown table cell: pipes, stars, brackets and angle brackets shown as
    written (not as a column break, emphasis, a link or HTML)."""
    escapes = (("|", "\\|"), ("*", "\\*"), ("[", "\\["), ("<", "&lt;"), (">", "&gt;"),
               ("\n", " "))
    for raw, shown in escapes:
        text = text.replace(raw, shown)
    return text


def _meaning(key: Key, docs: list[YamlDoc]) -> str | None:
    """`key`'s meaning: its own, else the same key's in another file of its group; a key that
    only interpolates another is wiring."""
    if key.meaning:
        return key.meaning
    for doc in docs:
        for other in doc.keys:
            if other.path == key.path and other.meaning:
                return other.meaning
    match = _INTERPOLATION.match(key.value)
    return f"= `{match.group(1)}` (wired from the key above)" if match else None


def _table(prefix: str, doc: YamlDoc, group: list[YamlDoc], section: type | None,
           missing: list[str]) -> list[str]:
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key in doc.keys:
        if key.parent:
            continue
        meaning = _meaning(key, group)
        if meaning is None:
            missing.append(f"{doc.file}:{key.line}: {key.path}")
            meaning = ""
        full = f"{prefix}{key.path}"
        kind = _hint(section, full.split(".")[1:] if prefix else []) if section else None
        if _INTERPOLATION.match(key.value):
            kind = "—"  # its key's
        kind = kind or _yaml_type(key.value)
        shown = key.value.replace("|", "\\|")
        default = f"`{shown}`" if key.value else "(see below)"
        rows.append(f"| `{full}` | {_cell(kind)} | {default} | {_cell(meaning)} |")
    return rows


GROUPS = {  # group -> (the option hydra composes by default, one line on what it holds)
    "trainer": ("default", "the loop: steps, batch, rollout, checkpoints, evaluation, logging"),
    "optim": ("adamw", "the optimizer and its schedule"),
    "model": ("smollm2_135m", "which policy model, its precision and LoRA"),
    "algo": ("grpo", "the algorithm: group size, advantage, loss, KL, DAPO, the rewarder and "
                     "its method keys"),
    "task": ("arith", "the task: its data, reward and environment"),
    "judge": ("none", "the judge the rubric rewarders call"),
    "mesh": ("auto", "the device mesh and multi-process start-up"),
    "eval": ("default", "`python -m rl.eval`'s section"),
}


def config_reference(conf: Path = CONF) -> tuple[str, list[str]]:
    """The config reference page of the config folder `conf`, and the keys that have no
    meaning (file:line: key)."""
    sections = _sections()
    missing: list[str] = []
    out = [
        "# Config keys",
        "",
        "Every key `python -m rl.train` reads, with its type, default and meaning. This page is "
        "generated from the YAML under `conf/` (defaults and meanings) and the typed sections "
        "of `rl/run/config.py` (types) when the site is built, so it cannot drift from them.",
        "",
        "Set a key on the command line (`trainer.max_steps=50`), pick a group's option "
        "(`algo=arbor`, `task=search_qa`), or sweep (`-m algo.beta=0,0.05`). A group's option "
        "sets the keys of that group; options of `algo` start from another option (their "
        "`defaults`) and the tables below list only the keys an option adds or changes. A "
        "default of `???` must be given.",
        "",
    ]
    top = read_yaml_doc(conf / "config.yaml")
    out += ["## Top level (`conf/config.yaml`)", "", *_table("", top, [top], None, missing), ""]
    for group, (default, what) in GROUPS.items():
        files = sorted((conf / group).glob("*.yaml"))
        docs = [read_yaml_doc(f) for f in files]
        docs.sort(key=lambda d: d.file.stem != default)
        out += [f"## `{group}`: {what}", "",
                f"Options: {', '.join(f'`{group}={d.file.stem}`' for d in docs)} "
                f"(default `{default}`).", ""]
        for doc in docs:
            out.append(f"### `{group}={doc.file.stem}`" + (" (default)" if doc is docs[0] else ""))
            out.append("")
            if doc.header:
                out += [_cell(doc.header), ""]
            if doc.defaults:
                out += ["Starts from: " + ", ".join(f"`{d}`" for d in doc.defaults) + ".", ""]
            out += [*_table(f"{group}.", doc, docs, sections.get(group), missing), ""]
    authors = [read_yaml_doc(f) for f in sorted((conf / "authors").glob("*.yaml"))]
    if authors:
        out += ["## `authors`: settings an algorithm brings along", "",
                "Keys outside the `algo` section that an algorithm option sets because its "
                "authors train that way (`conf/authors/`, included by the option's "
                "`defaults`). The command line still overrides them.", ""]
        for doc in authors:
            out += [f"### `conf/authors/{doc.file.name}`", "", _cell(doc.header), "",
                    *_table("", doc, [doc], None, missing), ""]
    for name, command in (("plan", "python -m rl.plan"), ("sft", "python -m rl.sft")):
        doc = read_yaml_doc(conf / f"{name}.yaml")
        out += [f"## `{command}` (`conf/{name}.yaml`)", "", _cell(doc.header), "",
                *_table("", doc, [doc], None, missing), ""]
    return "\n".join(out), missing


def on_pre_build(config: Any, **kwargs: Any) -> None:
    """mkdocs: write the config reference before the pages are collected."""
    from mkdocs.exceptions import PluginError

    page, missing = config_reference()
    if missing:
        raise PluginError("config keys without a meaning (a comment on the key's line in conf/):"
                          "\n  " + "\n  ".join(missing))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    if not OUT.exists() or OUT.read_text() != page:
        OUT.write_text(page)
