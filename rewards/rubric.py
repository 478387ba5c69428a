"""Rubric data model, dataset loaders and padding to arrays (SPEC section 4).

A rubric is a checklist of criteria ``i`` with weights ``w_i``.  A negative weight marks a
*pitfall*: the criterion text describes an undesirable behaviour, and a judge saying "met" means
the behaviour is present.  ProRubric additionally partitions the criteria into ``K`` protocol
dimensions (``1 <= K <= 5``; the bundler aims at 2..5, ``K = 1`` is the authors' ablation), each
with an optional failure clause, an optional paragraph ``description`` (the one criterion the
ProRubric authors' judge sees for the dimension) and a weight (default ``sum_{i in I_d} |w_i|``);
see ``rewards.aggregate.prorubric``.

Supported row formats (``load_rubrics(path, fmt)``; ``fmt=None`` detects it from the first row):

* ``healthbench``: ``{prompt: [{role, content}], rubrics: [{criterion, points, tags}],
  example_tags, prompt_id}``; the reference answer is ``ideal_completions_data.ideal_completion``
  (official rows; ``ideal_completions_data`` may be null), else a top-level ``ideal_completion``
  or ``reference_answer``.
* ``rar`` (Rubrics-as-Rewards): ``{question, reference_answer, rubric: [{title, description,
  weight}]}``.  ``weight`` is a number, or in some releases a string label mapped by
  ``RAR_WEIGHT_LABELS``: Essential -> 5, Important -> 3, Optional -> 1, Pitfall -> -2 (case and a
  trailing "criteria"/"criterion" ignored; numeric strings such as ``"-1"`` are numbers).  The
  criterion text is ``description`` (``title`` when the description is empty); the title is kept
  in ``Criterion.title``.  Rows carry no id: ``prompt_id`` is ``row["id"]`` when present, else
  ``"rar-"`` + the first 16 hex digits of the SHA-1 of the question (stable across files).
* ``rubrichub``: ``{prompt, data_source, ability, reward_model: {rubrics: [{criterion,
  points}]}}``, or RubricHub v1's own rows with the checklist at the top level
  (``Rubrics: [{criterion, points}]``); ``prompt`` is a string or a list of ``{role, content}``
  messages; ``prompt_id`` is ``row["prompt_id"]``, ``row["extra_info"]["index"]``, or a content
  hash as for RaR.
* ``prorubric_train`` and ``prorubric_public``: the ProRubric authors' training rows and public
  export, dimensions included (``rewards.rubric_formats``; both can also be written).
* ``native``: this library's own serialisation (``rubric_to_dict``), which also carries the
  dimensions and failure clauses.

Files are JSON Lines (one row per line, blank lines skipped), a single JSON list, or Parquet
(by the ``.parquet`` suffix).  ``save_rubrics(rubrics, path, fmt)`` writes ``native`` (JSON
Lines) or either ProRubric format (JSON Lines, or Parquet for a ``.parquet`` path).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from core.files import NotUtf8Error, read_utf8, write_atomic
from core.registry import Registry

MIN_DIMS = 1  # a valid rubric may have one dimension (the authors' K = 1 arm)
MAX_DIMS = 5

#: RaR string weight labels -> numeric weight (used only when the weight is not a number).
RAR_WEIGHT_LABELS: Mapping[str, float] = {
    "essential": 5.0,
    "important": 3.0,
    "optional": 1.0,
    "pitfall": -2.0,
}


class RubricError(ValueError):
    """A rubric (or a row of a rubric file) is invalid.

    ``prompt_id`` and ``field`` name what is wrong; ``where`` (file and row index) is set by the
    loaders.
    """

    def __init__(self, prompt_id: str | None, field: str, message: str, where: str = ""):
        self.prompt_id = prompt_id
        self.field = field
        self.where = where
        self.message = message
        loc = f"{where}: " if where else ""
        super().__init__(f"{loc}rubric {prompt_id!r}: field {field!r}: {message}")


@dataclass(frozen=True)
class Message:
    """One chat message of a prompt."""

    role: str
    content: str


@dataclass(frozen=True)
class Criterion:
    """One checklist item.

    ``weight > 0``: desirable behaviour, "met" earns the weight.  ``weight < 0``: pitfall, "met"
    means the undesirable behaviour is present.  ``weight == 0`` is allowed (it gates a
    ProRubric dimension but carries no weight).
    """

    text: str
    weight: float
    tags: tuple[str, ...] = ()
    title: str = ""

    @property
    def is_pitfall(self) -> bool:
        return self.weight < 0


@dataclass(frozen=True)
class Dimension:
    """A protocol dimension: a named bundle of criterion indices, with an optional failure clause
    (a sentence such as "delays emergency referral" that, when it fires, fails the dimension).

    ``description`` is the dimension written as one criterion: a short paragraph saying what a
    good answer achieves and what makes it fail (the ProRubric authors' judge sees only this
    text, never the atomic items; empty when the bundler wrote none).  ``weight`` is the
    dimension's weight ``W_d``; ``None`` means the authors' default ``sum_{i in I_d} |w_i|``
    (``Rubric.dimension_weights``).  Names need not be unique (the authors' data repeats them).
    """

    name: str
    criteria: tuple[int, ...]
    failure: str | None = None
    description: str = ""
    weight: float | None = None


@dataclass(frozen=True)
class Rubric:
    """A prompt with its checklist, and (for ProRubric) its partition into dimensions.

    Invariants (checked on construction, violations raise ``RubricError``): ``prompt_id`` is
    non-empty; there is at least one criterion; no criterion text is empty; every weight is
    finite and at least one is positive; ``reference_answer`` is text or None; if
    ``dimensions`` is non-empty then ``1 <= K <= 5`` dimensions, names are non-empty, weights
    finite or None, and every criterion index lies in exactly one dimension.
    """

    prompt_id: str
    prompt: str | tuple[Message, ...]
    criteria: tuple[Criterion, ...]
    dimensions: tuple[Dimension, ...] = ()
    reference_answer: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # Normalise containers so that lists passed by callers become tuples (frozen-safe).
        object.__setattr__(self, "criteria", tuple(self.criteria))
        object.__setattr__(self, "dimensions", tuple(self.dimensions))
        if not isinstance(self.prompt, str):
            object.__setattr__(self, "prompt", tuple(self.prompt))
        pid = self.prompt_id
        if not isinstance(pid, str) or not pid:
            raise RubricError(pid, "prompt_id", "must be a non-empty string")
        if not self.criteria:
            raise RubricError(pid, "criteria", "at least one criterion is required")
        for i, c in enumerate(self.criteria):
            if not isinstance(c.text, str) or not c.text.strip():
                raise RubricError(pid, f"criteria[{i}].text", "criterion text is empty")
            if not isinstance(c.weight, int | float) or not math.isfinite(c.weight):
                raise RubricError(
                    pid, f"criteria[{i}].weight", f"not a finite number: {c.weight!r}"
                )
        if not any(c.weight > 0 for c in self.criteria):
            raise RubricError(pid, "criteria.weight", "no criterion has a positive weight")
        seen: dict[str, int] = {}
        for i, c in enumerate(self.criteria):  # one item counted twice would double its weight
            key = " ".join(c.text.split()).casefold()
            if key in seen:
                raise RubricError(pid, f"criteria[{i}].text",
                                  f"duplicate of criteria[{seen[key]}]: {c.text[:80]!r}")
            seen[key] = i
        ref = self.reference_answer
        if ref is not None and not isinstance(ref, str):
            raise RubricError(
                pid, "reference_answer", f"expected a string or None, got {type(ref).__name__}"
            )
        if self.dimensions:
            _check_dimensions(pid, self.dimensions, len(self.criteria))

    # --- derived views -------------------------------------------------------------------
    @property
    def num_criteria(self) -> int:
        return len(self.criteria)

    @property
    def num_dims(self) -> int:
        return len(self.dimensions)

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(float(c.weight) for c in self.criteria)

    def dim_index(self) -> tuple[int, ...]:
        """Dimension of each criterion (``-1`` for all when the rubric is not bundled)."""
        out = [-1] * len(self.criteria)
        for k, d in enumerate(self.dimensions):
            for i in d.criteria:
                out[i] = k
        return tuple(out)

    def dimension_weights(self) -> tuple[float, ...]:
        """``W_d`` per dimension: its own weight, else ``sum_{i in I_d} |w_i|`` (ProRubric
        authors' release builder)."""
        return tuple(
            float(d.weight) if d.weight is not None
            else float(sum(abs(self.criteria[i].weight) for i in d.criteria))
            for d in self.dimensions
        )

    def with_dimensions(self, dimensions: Sequence[Dimension]) -> Rubric:
        """A copy with ``dimensions`` attached (criterion texts are never rewritten)."""
        return Rubric(
            prompt_id=self.prompt_id,
            prompt=self.prompt,
            criteria=self.criteria,
            dimensions=tuple(dimensions),
            reference_answer=self.reference_answer,
            meta=self.meta,
        )

    def prompt_text(self) -> str:
        """The prompt as plain text (the last user message for chat prompts)."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m.content for m in self.prompt if m.role == "user"]
        return users[-1] if users else (self.prompt[-1].content if self.prompt else "")


def _check_dimensions(pid: str, dims: tuple[Dimension, ...], n: int) -> None:
    k = len(dims)
    if not MIN_DIMS <= k <= MAX_DIMS:
        raise RubricError(
            pid, "dimensions", f"K={k} dimensions, need {MIN_DIMS} <= K <= {MAX_DIMS}"
        )
    owner: dict[int, int] = {}
    for kk, d in enumerate(dims):
        if not isinstance(d.name, str) or not d.name.strip():
            raise RubricError(pid, f"dimensions[{kk}].name", "dimension name is empty")
        if not isinstance(d.description, str):
            raise RubricError(pid, f"dimensions[{kk}].description", "must be text")
        if d.weight is not None and (
            isinstance(d.weight, bool) or not isinstance(d.weight, int | float)
            or not math.isfinite(d.weight)
        ):
            raise RubricError(pid, f"dimensions[{kk}].weight", f"not a finite number: {d.weight!r}")
        if not d.criteria:
            raise RubricError(pid, f"dimensions[{kk}].criteria", "dimension has no criteria")
        if d.failure is not None and not (isinstance(d.failure, str) and d.failure.strip()):
            raise RubricError(
                pid, f"dimensions[{kk}].failure", "failure clause must be None or text"
            )
        for i in d.criteria:
            if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n:
                raise RubricError(
                    pid, f"dimensions[{kk}].criteria", f"criterion index {i!r} not in [0, {n})"
                )
            if i in owner:
                raise RubricError(
                    pid,
                    f"dimensions[{kk}].criteria",
                    f"criterion {i} is already in dimension {owner[i]}",
                )
            owner[int(i)] = kk
    missing = sorted(set(range(n)) - set(owner))
    if missing:
        raise RubricError(pid, "dimensions", f"criteria {missing} are in no dimension")


# --------------------------------------------------------------------------------------------
# Row parsers
# --------------------------------------------------------------------------------------------

RowParser = Callable[[Mapping[str, Any]], Rubric]

#: Row format name -> parser ``row -> Rubric`` (raises ``RubricError``).
RUBRIC_FORMATS: Registry[RowParser] = Registry("rubric format")


def _req(row: Mapping[str, Any], key: str, pid: str | None, typ: type | tuple[type, ...]) -> Any:
    if not isinstance(row, Mapping):
        raise RubricError(pid, "<row>", f"row is a {type(row).__name__}, not an object")
    if key not in row:
        raise RubricError(pid, key, "missing")
    val = row[key]
    if not isinstance(val, typ):
        raise RubricError(pid, key, f"expected {_tname(typ)}, got {type(val).__name__}")
    return val


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _number(val: Any, pid: str | None, fld: str) -> float:
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise RubricError(pid, fld, f"expected a number, got {val!r}")
    if not math.isfinite(val):
        raise RubricError(pid, fld, f"not a finite number: {val!r}")
    return float(val)


def _tags(val: Any, pid: str | None, fld: str) -> tuple[str, ...]:
    if val is None:
        return ()
    if isinstance(val, str):
        return (val,)
    if not isinstance(val, list | tuple) or not all(isinstance(t, str) for t in val):
        raise RubricError(pid, fld, f"expected a list of strings, got {val!r}")
    return tuple(val)


def _messages(val: Any, pid: str | None, fld: str) -> tuple[Message, ...]:
    if not isinstance(val, list | tuple) or not val:
        raise RubricError(pid, fld, "expected a non-empty list of {role, content} messages")
    out = []
    for j, m in enumerate(val):
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise RubricError(pid, f"{fld}[{j}]", "expected {role: str, content: str}")
        out.append(Message(role=m["role"], content=m["content"]))
    return tuple(out)


def _content_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:16]}"


def _build(pid: str, **kw: Any) -> Rubric:
    return Rubric(prompt_id=pid, **kw)


def _healthbench_reference(row: Mapping[str, Any], pid: str) -> str | None:
    """The first non-empty of ``ideal_completions_data.ideal_completion`` (official HealthBench
    rows; ``ideal_completions_data`` is null where a row has none), top-level
    ``ideal_completion`` and ``reference_answer``.  Each must be text or null (``RubricError``
    naming the field otherwise)."""
    data = row.get("ideal_completions_data")
    if data is not None and not isinstance(data, Mapping):
        raise RubricError(pid, "ideal_completions_data",
                          f"expected an object or null, got {type(data).__name__}")
    candidates = (
        ("ideal_completions_data.ideal_completion", (data or {}).get("ideal_completion")),
        ("ideal_completion", row.get("ideal_completion")),
        ("reference_answer", row.get("reference_answer")),
    )
    for fld, val in candidates:
        if val is not None and not isinstance(val, str):
            raise RubricError(pid, fld, f"expected a string or null, got {type(val).__name__}")
    return next((val for _, val in candidates if val), None)


@RUBRIC_FORMATS.register("healthbench")
def parse_healthbench(row: Mapping[str, Any]) -> Rubric:
    """HealthBench row -> ``Rubric`` (points -> weight, tags kept, example_tags -> meta)."""
    pid = _req(row, "prompt_id", None, str)
    prompt = _messages(_req(row, "prompt", pid, list), pid, "prompt")
    items = _req(row, "rubrics", pid, list)
    crits = []
    for i, r in enumerate(items):
        if not isinstance(r, Mapping):
            raise RubricError(pid, f"rubrics[{i}]", "expected an object")
        text = r.get("criterion")
        if not isinstance(text, str):
            raise RubricError(pid, f"rubrics[{i}].criterion", "missing or not a string")
        if "points" not in r:
            raise RubricError(pid, f"rubrics[{i}].points", "missing")
        w = _number(r["points"], pid, f"rubrics[{i}].points")
        crits.append(
            Criterion(text=text, weight=w, tags=_tags(r.get("tags"), pid, f"rubrics[{i}].tags"))
        )
    meta = {"example_tags": list(_tags(row.get("example_tags"), pid, "example_tags"))}
    ref = _healthbench_reference(row, pid)
    return _build(pid, prompt=prompt, criteria=tuple(crits), reference_answer=ref, meta=meta)


def rar_weight(val: Any, pid: str | None = None, fld: str = "weight") -> float:
    """RaR weight: a number, a numeric string, or a label (``RAR_WEIGHT_LABELS``)."""
    if isinstance(val, int | float) and not isinstance(val, bool):
        return _number(val, pid, fld)
    if isinstance(val, str):
        s = val.strip()
        try:
            return _number(float(s), pid, fld)
        except ValueError:
            pass
        key = re.sub(r"\s*(criteria|criterion)\s*$", "", s.lower()).strip()
        if key in RAR_WEIGHT_LABELS:
            return RAR_WEIGHT_LABELS[key]
    known = ", ".join(k.capitalize() for k in RAR_WEIGHT_LABELS)
    raise RubricError(pid, fld, f"weight {val!r} is neither a number nor one of {known}")


@RUBRIC_FORMATS.register("rar")
def parse_rar(row: Mapping[str, Any]) -> Rubric:
    """RaR row -> ``Rubric`` (see the module docstring for ids and string weights)."""
    rid = row.get("id") if isinstance(row, Mapping) else None
    question = _req(row, "question", rid if isinstance(rid, str) else None, str)
    pid = rid if isinstance(rid, str) and rid else _content_id("rar", question)
    items = _req(row, "rubric", pid, list)
    crits = []
    for i, r in enumerate(items):
        if not isinstance(r, Mapping):
            raise RubricError(pid, f"rubric[{i}]", "expected an object")
        title = r.get("title") or ""
        desc = r.get("description") or ""
        if not isinstance(title, str) or not isinstance(desc, str):
            raise RubricError(pid, f"rubric[{i}].description", "title/description must be text")
        if "weight" not in r:
            raise RubricError(pid, f"rubric[{i}].weight", "missing")
        w = rar_weight(r["weight"], pid, f"rubric[{i}].weight")
        text = desc if desc.strip() else title
        if not text.strip():
            raise RubricError(pid, f"rubric[{i}].description", "criterion text is empty")
        crits.append(Criterion(text=text, weight=w, title=title))
    ref = row.get("reference_answer")
    if ref is not None and not isinstance(ref, str):
        raise RubricError(pid, "reference_answer", "expected a string")
    meta = {k: row[k] for k in ("question_source", "source") if k in row}
    return _build(pid, prompt=question, criteria=tuple(crits), reference_answer=ref, meta=meta)


def _rubrichub_items(row: Mapping[str, Any], pid: str) -> tuple[list[Any], str]:
    """RubricHub's checklist and the field it came from: ``reward_model.rubrics`` (the verl
    layout) when present, else the top-level ``Rubrics`` (RubricHub v1's own files).  Either
    may be a JSON string of the list."""
    rm = row.get("reward_model")
    if rm is not None and not isinstance(rm, Mapping):
        raise RubricError(pid, "reward_model", f"expected an object, got {type(rm).__name__}")
    if (rm is None or rm.get("rubrics") is None) and "Rubrics" in row:
        items, where = row["Rubrics"], "Rubrics"
    elif rm is not None:
        items, where = rm.get("rubrics"), "reward_model.rubrics"
    else:
        raise RubricError(pid, "reward_model", "missing (and no top-level Rubrics either)")
    if isinstance(items, str):  # some exports store the list as a JSON string
        try:
            items = json.loads(items)
        except json.JSONDecodeError as e:
            raise RubricError(pid, where, f"invalid JSON string: {e}") from None
    if not isinstance(items, list):
        raise RubricError(pid, where, "missing or not a list")
    return items, where


@RUBRIC_FORMATS.register("rubrichub")
def parse_rubrichub(row: Mapping[str, Any]) -> Rubric:
    """RubricHub row -> ``Rubric`` (data_source, ability -> meta)."""
    pid0 = row.get("prompt_id") if isinstance(row, Mapping) else None
    if not isinstance(pid0, str) or not pid0:
        extra = row.get("extra_info") if isinstance(row, Mapping) else None
        idx = extra.get("index") if isinstance(extra, Mapping) else None
        pid0 = f"rubrichub-{idx}" if idx is not None else None
    raw_prompt = _req(row, "prompt", pid0, (str, list))
    if isinstance(raw_prompt, str):
        prompt: str | tuple[Message, ...] = raw_prompt
        ptext = raw_prompt
    else:
        prompt = _messages(raw_prompt, pid0, "prompt")
        ptext = json.dumps([[m.role, m.content] for m in prompt], ensure_ascii=False)
    pid = pid0 or _content_id("rubrichub", ptext)
    items, where = _rubrichub_items(row, pid)
    crits = []
    for i, r in enumerate(items):
        fld = f"{where}[{i}]"
        if not isinstance(r, Mapping):
            raise RubricError(pid, fld, "expected an object")
        if not isinstance(r.get("criterion"), str):
            raise RubricError(pid, f"{fld}.criterion", "missing or not a string")
        if "points" not in r:
            raise RubricError(pid, f"{fld}.points", "missing")
        w = _number(r["points"], pid, f"{fld}.points")
        crits.append(Criterion(text=r["criterion"], weight=w, tags=_tags(r.get("tags"), pid, fld)))
    meta = {k: row[k] for k in ("data_source", "ability") if k in row}
    return _build(pid, prompt=prompt, criteria=tuple(crits), meta=meta)


def rubric_to_dict(r: Rubric) -> dict[str, Any]:
    """``Rubric`` -> a JSON-serialisable dict (the ``native`` format)."""
    return {
        "prompt_id": r.prompt_id,
        "prompt": r.prompt
        if isinstance(r.prompt, str)
        else [{"role": m.role, "content": m.content} for m in r.prompt],
        "criteria": [
            {"text": c.text, "weight": c.weight, "tags": list(c.tags), "title": c.title}
            for c in r.criteria
        ],
        "dimensions": [
            {"name": d.name, "criteria": list(d.criteria), "failure": d.failure,
             "description": d.description, "weight": d.weight}
            for d in r.dimensions
        ],
        "reference_answer": r.reference_answer,
        "meta": dict(r.meta),
    }


@RUBRIC_FORMATS.register("native")
def rubric_from_dict(row: Mapping[str, Any]) -> Rubric:
    """The ``native`` format (``rubric_to_dict``) -> ``Rubric``, dimensions included."""
    pid = _req(row, "prompt_id", None, str)
    raw_prompt = _req(row, "prompt", pid, (str, list))
    prompt = raw_prompt if isinstance(raw_prompt, str) else _messages(raw_prompt, pid, "prompt")
    crits = []
    for i, c in enumerate(_req(row, "criteria", pid, list)):
        fld = f"criteria[{i}]"
        if not isinstance(c, Mapping) or not isinstance(c.get("text"), str):
            raise RubricError(pid, f"{fld}.text", "missing or not a string")
        w = _number(c.get("weight"), pid, f"{fld}.weight")
        title = c.get("title") or ""
        crits.append(Criterion(c["text"], w, _tags(c.get("tags"), pid, f"{fld}.tags"), title))
    dims = []
    for k, d in enumerate(row.get("dimensions") or []):
        fld = f"dimensions[{k}]"
        if not isinstance(d, Mapping) or not isinstance(d.get("criteria"), list):
            raise RubricError(pid, f"{fld}.criteria", "missing or not a list")
        weight = d.get("weight")
        if weight is not None:
            weight = _number(weight, pid, f"{fld}.weight")
        description = d.get("description") or ""
        if not isinstance(description, str):
            raise RubricError(pid, f"{fld}.description", "must be text")
        dims.append(Dimension(str(d.get("name", "")), tuple(d["criteria"]), d.get("failure"),
                              description, weight))
    meta = row.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise RubricError(pid, "meta", "expected an object")
    return _build(
        pid,
        prompt=prompt,
        criteria=tuple(crits),
        dimensions=tuple(dims),
        reference_answer=row.get("reference_answer"),
        meta=dict(meta),
    )


def detect_format(row: Mapping[str, Any]) -> str:
    """Guess the row format from its keys (raises ``RubricError`` when nothing matches)."""
    if isinstance(row, Mapping):
        rm = row.get("reward_model")
        if "Rubrics" in row or (isinstance(rm, Mapping) and "rubrics" in rm):
            return "rubrichub"
        if "atomic_rubric" in row and "id" in row:
            return "prorubric_public"
        extra = row.get("extra_info")
        if "prompt" in row and isinstance(extra, Mapping) and "rubric" in extra:
            return "prorubric_train"  # verl rows: a reward_model without rubrics is no matter
        if "reward_model" in row:
            return "rubrichub"
        if "rubrics" in row and "prompt" in row:
            return "healthbench"
        if "rubric" in row and "question" in row:
            return "rar"
        if "criteria" in row and "prompt_id" in row:
            return "native"
    keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
    raise RubricError(
        None, "<format>", f"cannot detect the rubric format from keys {keys}; pass fmt="
    )


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[Any]:
    """Rows of a JSON Lines file, a JSON list file, or (by its ``.parquet`` suffix) a Parquet
    file (each row a dict, nested structs as dicts, missing struct fields as None)."""
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        return _read_parquet_rows(p)
    try:
        text = read_utf8(p)
    except NotUtf8Error as e:
        raise RubricError(None, "<encoding>", str(e), where=str(p)) from None
    stripped = text.lstrip()
    if not stripped:
        raise RubricError(None, "<file>", "the file is empty: no rubrics", where=str(p))
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise RubricError(None, "<json>", f"invalid JSON list: {e}", where=str(p)) from None
        if not isinstance(rows, list):
            raise RubricError(None, "<json>", "expected a JSON list", where=str(p))
        return rows
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            where = f"{p}: row {len(rows)} (line {lineno})"
            raise RubricError(None, "<json>", f"invalid JSON: {e}", where=where) from None
    return rows


def _read_parquet_rows(p: Path) -> list[dict[str, Any]]:
    import pyarrow as pa  # imported here: only Parquet files need it
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(p).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise RubricError(None, "<parquet>", f"not a readable Parquet file: {e}",
                          where=str(p)) from None
    if not rows:
        raise RubricError(None, "<file>", "the file is empty: no rubrics", where=str(p))
    return rows


def parse_rows(rows: Iterable[Any], fmt: str | None = None, source: str = "<rows>") -> list[Rubric]:
    """Parse rows with the named format (detected from the first row when ``fmt`` is None).

    Errors are ``RubricError`` whose ``where`` names ``source`` and the row index.  Duplicate
    prompt ids within one source are rejected.
    """
    rows = list(rows)
    if fmt is None and rows:
        try:
            fmt = detect_format(rows[0])
        except RubricError as e:
            e.where = f"{source}: row 0"
            raise RubricError(e.prompt_id, e.field, e.message, e.where) from None
    parser: RowParser | None = None
    if fmt is not None:
        if fmt not in RUBRIC_FORMATS:
            known = ", ".join(RUBRIC_FORMATS.names())
            raise ValueError(f"unknown rubric format {fmt!r}; known formats: {known}")
        parser = RUBRIC_FORMATS.get(fmt)
    out: list[Rubric] = []
    seen: dict[str, int] = {}
    for idx, row in enumerate(rows):
        where = f"{source}: row {idx}"
        assert parser is not None
        try:
            r = parser(row)
        except RubricError as e:
            raise RubricError(e.prompt_id, e.field, e.message, where) from None
        if r.prompt_id in seen:
            raise RubricError(
                r.prompt_id, "prompt_id", f"duplicate of row {seen[r.prompt_id]}", where
            )
        seen[r.prompt_id] = idx
        out.append(r)
    return out


def load_rubrics(path: str | Path, fmt: str | None = None) -> list[Rubric]:
    """Load a rubric file (JSON Lines, JSON list or ``.parquet``) in format ``fmt``.

    ``fmt`` is one of ``RUBRIC_FORMATS.names()`` (``healthbench``, ``native``,
    ``prorubric_public``, ``prorubric_train``, ``rar``, ``rubrichub``), or None to detect it
    from the first row.  An unknown format is a
    ``ValueError`` listing the known ones; a bad row is a ``RubricError`` naming the file, the
    row index, the prompt id (when known) and the field.
    """
    if fmt is not None and fmt not in RUBRIC_FORMATS:
        known = ", ".join(RUBRIC_FORMATS.names())
        raise ValueError(f"unknown rubric format {fmt!r}; known formats: {known}")
    return parse_rows(read_rows(path), fmt=fmt, source=str(path))


RowWriter = Callable[[Rubric], dict[str, Any]]

#: Row format name -> writer ``Rubric -> row`` (the inverse of the parser of that name).
RUBRIC_WRITERS: Registry[RowWriter] = Registry("rubric writer")
RUBRIC_WRITERS.register("native")(rubric_to_dict)

#: Format name -> ``rows -> pyarrow.Table`` for the formats that can be written as Parquet.
PARQUET_TABLES: Registry[Callable[[list[dict[str, Any]]], Any]] = Registry("parquet layout")


def save_rubrics(rubrics: Iterable[Rubric], path: str | Path, fmt: str = "native") -> None:
    """Write rubrics as rows of format ``fmt`` (``RUBRIC_WRITERS``), atomically (``core.files``).

    A ``.parquet`` path is written as Parquet (the ProRubric formats only, ``PARQUET_TABLES``),
    any other path as JSON Lines.  A rubric the format cannot hold is a ``RubricError`` naming
    it; nothing is written then.
    """
    if fmt not in RUBRIC_WRITERS:
        raise ValueError(f"no writer for rubric format {fmt!r}; known: "
                         f"{', '.join(RUBRIC_WRITERS.names())}")
    writer = RUBRIC_WRITERS.get(fmt)
    rows = []
    for idx, r in enumerate(rubrics):
        try:
            rows.append(writer(r))
        except RubricError as e:
            raise RubricError(e.prompt_id, e.field, e.message, f"{path}: rubric {idx}") from None
    if Path(path).suffix.lower() != ".parquet":
        write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        return
    if fmt not in PARQUET_TABLES:
        raise ValueError(f"rubric format {fmt!r} is written as JSON Lines only; Parquet: "
                         f"{', '.join(PARQUET_TABLES.names())}")
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(PARQUET_TABLES.get(fmt)(rows), buf)
    write_atomic(path, buf.getvalue())


# --------------------------------------------------------------------------------------------
# Padding to arrays
# --------------------------------------------------------------------------------------------


class RubricArrays(NamedTuple):
    """A batch of rubrics padded to ``[P, C]`` / ``[P, K]`` (a pytree: passes through jit/vmap).

    ``weights`` float32 [P, C] (0 in padding); ``mask`` bool [P, C] (True = real criterion);
    ``dim_index`` int32 [P, C] (dimension of each criterion, -1 for padding and for rubrics
    without dimensions); ``dim_mask`` bool [P, K] (True = real dimension).
    """

    weights: np.ndarray
    mask: np.ndarray
    dim_index: np.ndarray
    dim_mask: np.ndarray


def to_arrays(
    rubrics: Sequence[Rubric],
    max_criteria: int | None = None,
    max_dims: int | None = None,
    require_dims: bool = False,
) -> RubricArrays:
    """Pad ``rubrics`` into ``RubricArrays``.

    ``C = max_criteria`` (default: the largest checklist) and ``K = max_dims`` (default: the
    largest number of dimensions, at least 1 so shapes are never empty).  A rubric longer than
    ``max_criteria`` or with more dimensions than ``max_dims`` is a ``RubricError``.  Rubrics
    without dimensions get ``dim_index = -1``, which the AND-product aggregators treat as
    "in no dimension"; pass ``require_dims=True`` to reject them instead.
    """
    rubrics = list(rubrics)
    n_c = max((r.num_criteria for r in rubrics), default=1)
    n_k = max((r.num_dims for r in rubrics), default=1)
    c = n_c if max_criteria is None else int(max_criteria)
    k = max(n_k, 1) if max_dims is None else int(max_dims)
    p = len(rubrics)
    weights = np.zeros((p, c), np.float32)
    mask = np.zeros((p, c), bool)
    dim_index = np.full((p, c), -1, np.int32)
    dim_mask = np.zeros((p, k), bool)
    for row, r in enumerate(rubrics):
        if r.num_criteria > c:
            raise RubricError(
                r.prompt_id, "criteria", f"{r.num_criteria} criteria > max_criteria={c}"
            )
        if r.num_dims > k:
            raise RubricError(r.prompt_id, "dimensions", f"{r.num_dims} dimensions > max_dims={k}")
        if require_dims and not r.dimensions:
            raise RubricError(r.prompt_id, "dimensions", "rubric has no dimensions (not bundled)")
        n = r.num_criteria
        weights[row, :n] = r.weights
        mask[row, :n] = True
        dim_index[row, :n] = r.dim_index()
        dim_mask[row, : r.num_dims] = True
    return RubricArrays(weights=weights, mask=mask, dim_index=dim_index, dim_mask=dim_mask)
