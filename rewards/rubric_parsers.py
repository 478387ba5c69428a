"""Row parsers of the public rubric datasets and of this library's own rows, and the field
readers every row parser shares (``rewards.rubric_formats`` uses them too).

Each parser turns one row (a dict) into a ``Rubric``, raising ``RubricError`` that names the
field at fault; ``rewards.rubric_io`` lists them in its format table and reads the files.

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
* ``native``: this library's own serialisation (``rubric_to_dict``), which also carries the
  dimensions and failure clauses.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from rewards.rubric import (
    RAR_WEIGHT_LABELS,
    Criterion,
    Dimension,
    Message,
    Rubric,
    RubricError,
)

# --------------------------------------------------------------------------------------------
# Field readers (shared with rewards.rubric_formats)
# --------------------------------------------------------------------------------------------


def required_field(row: Mapping[str, Any], key: str, pid: str | None,
                   typ: type | tuple[type, ...]) -> Any:
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


def finite_number(val: Any, pid: str | None, fld: str) -> float:
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise RubricError(pid, fld, f"expected a number, got {val!r}")
    if not math.isfinite(val):
        raise RubricError(pid, fld, f"not a finite number: {val!r}")
    return float(val)


def tag_list(val: Any, pid: str | None, fld: str) -> tuple[str, ...]:
    if val is None:
        return ()
    if isinstance(val, str):
        return (val,)
    if not isinstance(val, list | tuple) or not all(isinstance(t, str) for t in val):
        raise RubricError(pid, fld, f"expected a list of strings, got {val!r}")
    return tuple(val)


def message_list(val: Any, pid: str | None, fld: str) -> tuple[Message, ...]:
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

# --------------------------------------------------------------------------------------------
# Row formats
# --------------------------------------------------------------------------------------------


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


def parse_healthbench(row: Mapping[str, Any]) -> Rubric:
    """HealthBench row -> ``Rubric`` (points -> weight, tags kept, example_tags -> meta)."""
    pid = required_field(row, "prompt_id", None, str)
    prompt = message_list(required_field(row, "prompt", pid, list), pid, "prompt")
    items = required_field(row, "rubrics", pid, list)
    crits = []
    for i, r in enumerate(items):
        if not isinstance(r, Mapping):
            raise RubricError(pid, f"rubrics[{i}]", "expected an object")
        text = r.get("criterion")
        if not isinstance(text, str):
            raise RubricError(pid, f"rubrics[{i}].criterion", "missing or not a string")
        if "points" not in r:
            raise RubricError(pid, f"rubrics[{i}].points", "missing")
        w = finite_number(r["points"], pid, f"rubrics[{i}].points")
        crits.append(
            Criterion(text=text, weight=w, tags=tag_list(r.get("tags"), pid, f"rubrics[{i}].tags"))
        )
    meta = {"example_tags": list(tag_list(row.get("example_tags"), pid, "example_tags"))}
    ref = _healthbench_reference(row, pid)
    return _build(pid, prompt=prompt, criteria=tuple(crits), reference_answer=ref, meta=meta)


def rar_weight(val: Any, pid: str | None = None, fld: str = "weight") -> float:
    """RaR weight: a number, a numeric string, or a label (``RAR_WEIGHT_LABELS``)."""
    if isinstance(val, int | float) and not isinstance(val, bool):
        return finite_number(val, pid, fld)
    if isinstance(val, str):
        s = val.strip()
        try:
            return finite_number(float(s), pid, fld)
        except ValueError:
            pass
        key = re.sub(r"\s*(criteria|criterion)\s*$", "", s.lower()).strip()
        if key in RAR_WEIGHT_LABELS:
            return RAR_WEIGHT_LABELS[key]
    known = ", ".join(k.capitalize() for k in RAR_WEIGHT_LABELS)
    raise RubricError(pid, fld, f"weight {val!r} is neither a number nor one of {known}")


def parse_rar(row: Mapping[str, Any]) -> Rubric:
    """RaR row -> ``Rubric`` (see the module docstring for ids and string weights)."""
    rid = row.get("id") if isinstance(row, Mapping) else None
    question = required_field(row, "question", rid if isinstance(rid, str) else None, str)
    pid = rid if isinstance(rid, str) and rid else _content_id("rar", question)
    items = required_field(row, "rubric", pid, list)
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


def parse_rubrichub(row: Mapping[str, Any]) -> Rubric:
    """RubricHub row -> ``Rubric`` (data_source, ability -> meta)."""
    pid0 = row.get("prompt_id") if isinstance(row, Mapping) else None
    if not isinstance(pid0, str) or not pid0:
        extra = row.get("extra_info") if isinstance(row, Mapping) else None
        idx = extra.get("index") if isinstance(extra, Mapping) else None
        pid0 = f"rubrichub-{idx}" if idx is not None else None
    raw_prompt = required_field(row, "prompt", pid0, (str, list))
    if isinstance(raw_prompt, str):
        prompt: str | tuple[Message, ...] = raw_prompt
        ptext = raw_prompt
    else:
        prompt = message_list(raw_prompt, pid0, "prompt")
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
        w = finite_number(r["points"], pid, f"{fld}.points")
        crits.append(Criterion(text=r["criterion"], weight=w,
                               tags=tag_list(r.get("tags"), pid, fld)))
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


def rubric_from_dict(row: Mapping[str, Any]) -> Rubric:
    """The ``native`` format (``rubric_to_dict``) -> ``Rubric``, dimensions included."""
    pid = required_field(row, "prompt_id", None, str)
    raw_prompt = required_field(row, "prompt", pid, (str, list))
    prompt = raw_prompt if isinstance(raw_prompt, str) else message_list(raw_prompt, pid, "prompt")
    crits = []
    for i, c in enumerate(required_field(row, "criteria", pid, list)):
        fld = f"criteria[{i}]"
        if not isinstance(c, Mapping) or not isinstance(c.get("text"), str):
            raise RubricError(pid, f"{fld}.text", "missing or not a string")
        w = finite_number(c.get("weight"), pid, f"{fld}.weight")
        title = c.get("title") or ""
        crits.append(Criterion(c["text"], w, tag_list(c.get("tags"), pid, f"{fld}.tags"), title))
    dims = []
    for k, d in enumerate(row.get("dimensions") or []):
        fld = f"dimensions[{k}]"
        if not isinstance(d, Mapping) or not isinstance(d.get("criteria"), list):
            raise RubricError(pid, f"{fld}.criteria", "missing or not a list")
        weight = d.get("weight")
        if weight is not None:
            weight = finite_number(weight, pid, f"{fld}.weight")
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

