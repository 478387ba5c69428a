"""The ProRubric authors' row formats (GitHub ``Estrellajer/ProRubric``, ``data/``), read into
``Rubric`` and written back (``rewards.rubric_io``: ``load_rubrics(path, fmt)``,
``save_rubrics(rubrics, path, fmt)``, whose format tables name the functions below).

``prorubric_train``: the training rows their verl trainer reads (Parquet, or the same rows as
JSON Lines)::

    {prompt: [{role, content}], data_source,
     extra_info: {id, problem, rubric, rubric_atomic, rir_generation, rubric_correct,
                  self_golden, ...}}

``extra_info.rubric`` is what their reward judge scores.  In a ProRubric row it is the
dimensions ``[{criterion, weight}]`` (``criterion`` = the dimension paragraph with its failure
clause, ``weight`` = ``W_d``), the atomic checklist ``[{criterion, weight}]`` is in
``extra_info.rubric_atomic``, and ``extra_info.rir_generation`` is a JSON *string* (a dict is
accepted too) holding the generator's metadata: ``names`` (one per dimension),
``atomic_indices`` (one group of **1-based** indices into ``rubric_atomic`` per dimension),
``model_weights`` (the generator's own weights, which the packaging replaced by
``sum_{i in I_d} |w_i|``), ``repaired``, ``valid`` and more.  In an atomic (Rubric-RL) row
there is no ``rubric_atomic`` and ``extra_info.rubric`` is the atomic checklist.
``rubric_correct`` is the atomic checklist rendered as ``"i. [weight=w] criterion"`` lines (the
generator's anchor and the OPSD teacher's context); ``self_golden`` is a reference answer
("gold answer notes", usually ``""``); some rows (science) carry ``extra_info.reference_answer``.

``prorubric_public``: the public export (``export_public_release.py``)::

    {id, domain, prompt: str, atomic_rubric: [{criterion, weight}],
     dimensions: [{name, criterion, weight, atomic_indices}], repaired: bool, generator: str}

(an atomic export has only the first four fields).

Mapping (both formats): the atomic checklist -> ``Rubric.criteria``; dimension ``k`` ->
``Dimension(name, criteria = atomic_indices - 1, description = criterion, weight)``;
``self_golden`` (else ``extra_info.reference_answer``) -> ``reference_answer`` when not
empty.  Everything else goes to ``Rubric.meta`` so that writing back reproduces the row:
``data_source``, ``extra_info`` (the remaining fields verbatim: problem, rubric_correct,
self_golden, schema_version, ...), ``rir_generation`` (the remaining generator fields),
``repaired``, ``generator`` (``rir_generation.model``, or the public ``generator``),
``domain``.  ``Dimension.failure`` is not part of either schema (the authors write the failure
clause into the paragraph); the train writer keeps it in ``rir_generation.failure_clauses``.
Criterion tags and titles have no place in either schema and are not written.

Every bad row is a ``RubricError`` naming the file, the row and the field (for instance
``extra_info.rir_generation.atomic_indices[1]`` for an index out of range or used twice).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewards.rubric import Criterion, Dimension, Message, Rubric, RubricError
from rewards.rubric_parsers import finite_number, message_list, required_field

TRAIN_FORMAT = "prorubric_train"
PUBLIC_FORMAT = "prorubric_public"

#: ``extra_info`` fields the train parser turns into ``Rubric`` fields (the rest go to meta).
_TRAIN_DERIVED = ("id", "rubric", "rubric_atomic", "rir_generation")
#: ``rir_generation`` fields rebuilt on writing (from the dimensions and ``meta["repaired"]``).
_GENERATION_DERIVED = ("names", "atomic_indices", "repaired", "failure_clauses")


# --------------------------------------------------------------------------------------------
# Reading: shared pieces
# --------------------------------------------------------------------------------------------


def _checklist(items: Any, pid: str, fld: str) -> tuple[Criterion, ...]:
    """``[{criterion, weight}]`` (or a JSON string of it) -> criteria."""
    items = _json_value(items, pid, fld)
    if not isinstance(items, list) or not items:
        raise RubricError(pid, fld, "expected a non-empty list of {criterion, weight}")
    return tuple(_criterion(item, pid, f"{fld}[{i}]") for i, item in enumerate(items))


def _criterion(item: Any, pid: str, fld: str) -> Criterion:
    if not isinstance(item, Mapping):
        raise RubricError(pid, fld, "expected an object {criterion, weight}")
    text = item.get("criterion")
    if not isinstance(text, str) or not text.strip():
        raise RubricError(pid, f"{fld}.criterion", "missing, empty or not a string")
    return Criterion(text=text, weight=finite_number(item.get("weight"), pid, f"{fld}.weight"))


def _json_value(val: Any, pid: str, fld: str) -> Any:
    """``val``, parsed when it is a JSON string."""
    if not isinstance(val, str):
        return val
    try:
        return json.loads(val)
    except json.JSONDecodeError as e:
        raise RubricError(pid, fld, f"not valid JSON: {e}") from None


def _groups(groups: Sequence[Any], n: int, pid: str, group_fld: Callable[[int], str],
            coverage_fld: str) -> list[tuple[int, ...]]:
    """Groups of 1-based indices into ``n`` atomic items -> 0-based tuples.

    Every index must be an integer in ``[1, n]`` and used once over all groups, and every item
    must be in some group; ``group_fld(g)`` names group ``g`` in errors, ``coverage_fld`` the
    field blamed for an item in no group.
    """
    owner: dict[int, int] = {}
    out = []
    for g, group in enumerate(groups):
        if not isinstance(group, list) or not group:
            raise RubricError(pid, group_fld(g), "expected a non-empty list of 1-based indices")
        for i in group:
            _check_index(i, n, owner, g, pid, group_fld(g))
            owner[i] = g
        out.append(tuple(i - 1 for i in group))
    missing = [i for i in range(1, n + 1) if i not in owner]
    if missing:
        raise RubricError(pid, coverage_fld, f"atomic items {missing} (1-based) are in no "
                          "dimension")
    return out


def _check_index(i: Any, n: int, owner: Mapping[int, int], g: int, pid: str, fld: str) -> None:
    if isinstance(i, bool) or not isinstance(i, int):
        raise RubricError(pid, fld, f"index {i!r} is not an integer")
    if not 1 <= i <= n:
        raise RubricError(pid, fld, f"1-based index {i} not in [1, {n}]")
    if i in owner:
        where = "twice in this group" if owner[i] == g else f"already in dimension {owner[i]}"
        raise RubricError(pid, fld, f"index {i} used twice ({where})")


def _flag(val: Any, pid: str, fld: str) -> bool:
    """A yes/no field: a bool, ``"true"``/``"false"`` (any case) or null (= false)."""
    if val is None or isinstance(val, bool):
        return bool(val)
    if isinstance(val, str) and val.strip().lower() in ("true", "false"):
        return val.strip().lower() == "true"
    raise RubricError(pid, fld, f"expected true or false, got {val!r}")


def _text(val: Any, pid: str, fld: str) -> str | None:
    if val is not None and not isinstance(val, str):
        raise RubricError(pid, fld, f"expected a string or null, got {type(val).__name__}")
    return val


def _extra(extra: Mapping[str, Any], key: str, pid: str, typ: tuple[type, ...]) -> Any:
    """``extra_info[key]``, which must be present (not null) and of type ``typ``."""
    val = extra.get(key)
    if val is None:
        raise RubricError(pid, f"extra_info.{key}", "missing")
    if not isinstance(val, typ):
        raise RubricError(pid, f"extra_info.{key}",
                          f"expected {' or '.join(t.__name__ for t in typ)}, "
                          f"got {type(val).__name__}")
    return val


def _prompt(row: Mapping[str, Any], pid: str) -> str | tuple[Message, ...]:
    raw = required_field(row, "prompt", pid, (str, list))
    if isinstance(raw, str):
        if not raw.strip():
            raise RubricError(pid, "prompt", "empty")
        return raw
    return message_list(raw, pid, "prompt")


# --------------------------------------------------------------------------------------------
# prorubric_train
# --------------------------------------------------------------------------------------------


def parse_prorubric_train(row: Mapping[str, Any]) -> Rubric:
    """A training row (ProRubric or atomic) -> ``Rubric`` (module docstring)."""
    extra = required_field(row, "extra_info", None, Mapping)
    pid = extra.get("id")
    if not isinstance(pid, str) or not pid:
        raise RubricError(None, "extra_info.id", "missing, empty or not a string")
    prompt = _prompt(row, pid)
    meta: dict[str, Any] = {}
    if row.get("data_source") is not None:
        meta["data_source"] = _text(row["data_source"], pid, "data_source")
    if extra.get("rubric_atomic") is None:
        if extra.get("rir_generation") is not None:
            raise RubricError(pid, "extra_info.rubric_atomic", "missing: a row with "
                              "rir_generation keeps its atomic checklist in rubric_atomic")
        criteria = _checklist(_extra(extra, "rubric", pid, (list, str)), pid, "extra_info.rubric")
        dims: tuple[Dimension, ...] = ()
    else:
        criteria = _checklist(extra["rubric_atomic"], pid, "extra_info.rubric_atomic")
        dims, generation = _train_dimensions(extra, pid, len(criteria))
        meta.update(_generation_meta(generation, pid))
    meta["extra_info"] = {k: v for k, v in extra.items()
                          if k not in _TRAIN_DERIVED and v is not None}
    columns = {k: v for k, v in row.items()
               if k not in ("prompt", "data_source", "extra_info") and v is not None}
    if columns:
        meta["columns"] = columns
    return Rubric(prompt_id=pid, prompt=prompt, criteria=criteria, dimensions=dims,
                  reference_answer=_train_reference(extra, pid), meta=meta)


def _train_dimensions(
    extra: Mapping[str, Any], pid: str, n: int
) -> tuple[tuple[Dimension, ...], dict[str, Any]]:
    """``extra_info.rubric`` (the dimensions) + ``rir_generation`` -> dimensions, generation."""
    fld = "extra_info.rir_generation"
    generation = _json_value(_extra(extra, "rir_generation", pid, (str, Mapping)), pid, fld)
    if not isinstance(generation, Mapping):
        raise RubricError(pid, fld, f"expected a JSON object, got {type(generation).__name__}")
    paragraphs = _json_value(_extra(extra, "rubric", pid, (list, str)), pid, "extra_info.rubric")
    if not isinstance(paragraphs, list) or not paragraphs:
        raise RubricError(pid, "extra_info.rubric", "expected a non-empty list of dimensions")
    k = len(paragraphs)
    raw = generation.get("atomic_indices")
    if not isinstance(raw, list) or len(raw) != k:
        got = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise RubricError(pid, f"{fld}.atomic_indices",
                          f"expected one index group per dimension ({k}), got {got}")
    groups = _groups(raw, n, pid, lambda g: f"{fld}.atomic_indices[{g}]",
                     f"{fld}.atomic_indices")
    names = generation.get("names")
    if not isinstance(names, list) or len(names) != k:
        raise RubricError(pid, f"{fld}.names", f"expected {k} names, one per dimension")
    failures = _failures(generation.get("failure_clauses"), k, pid, f"{fld}.failure_clauses")
    dims = tuple(
        _dimension(paragraphs[d], names[d], groups[d], failures[d], pid,
                   f"extra_info.rubric[{d}]", f"{fld}.names[{d}]")
        for d in range(k)
    )
    return dims, dict(generation)


def _failures(val: Any, k: int, pid: str, fld: str) -> list[str | None]:
    """This library's failure clauses kept by the train writer (absent: none)."""
    if val is None:
        return [None] * k
    if not isinstance(val, list) or len(val) != k:
        raise RubricError(pid, fld, f"expected {k} entries, one per dimension")
    for d, f in enumerate(val):
        if f is not None and not (isinstance(f, str) and f.strip()):
            raise RubricError(pid, f"{fld}[{d}]", "a failure clause is null or text")
    return val


def _dimension(item: Any, name: Any, criteria: tuple[int, ...], failure: Any, pid: str,
               fld: str, name_fld: str) -> Dimension:
    """One ``{criterion, weight}`` dimension paragraph with its name and 0-based items."""
    paragraph = _criterion(item, pid, fld)
    if not isinstance(name, str) or not name.strip():
        raise RubricError(pid, name_fld, "dimension name missing, empty or not a string")
    return Dimension(name=name, criteria=criteria, failure=failure,
                     description=paragraph.text, weight=paragraph.weight)


def _generation_meta(generation: Mapping[str, Any], pid: str) -> dict[str, Any]:
    fld = "extra_info.rir_generation"
    rest = {k: v for k, v in generation.items() if k not in _GENERATION_DERIVED}
    meta: dict[str, Any] = {
        "rir_generation": rest,
        "repaired": _flag(generation.get("repaired"), pid, f"{fld}.repaired"),
    }
    model = _text(generation.get("model"), pid, f"{fld}.model")
    if model:
        meta["generator"] = model
    return meta


def _train_reference(extra: Mapping[str, Any], pid: str) -> str | None:
    """``self_golden`` when not empty, else ``reference_answer`` when not empty, else None."""
    golden = _text(extra.get("self_golden"), pid, "extra_info.self_golden")
    ref = _text(extra.get("reference_answer"), pid, "extra_info.reference_answer")
    return golden or ref or None


def _checklist_out(criteria: Sequence[Criterion]) -> list[dict[str, Any]]:
    return [{"criterion": c.text, "weight": float(c.weight)} for c in criteria]


def render_checklist(criteria: Sequence[Criterion]) -> str:
    """The checklist as ``"i. [weight=w] criterion"`` lines (1-based; ``w`` in ``%g``), the
    layout of the authors' ``rubric_correct`` field."""
    return "\n".join(f"{i}. [weight={float(c.weight):g}] {c.text.strip()}"
                     for i, c in enumerate(criteria, start=1))


def _paragraphs(r: Rubric) -> list[dict[str, Any]]:
    """``[{criterion: description, weight: W_d}]``; a dimension without a paragraph cannot be
    written (the authors' judge sees nothing else)."""
    for k, d in enumerate(r.dimensions):
        if not d.description.strip():
            raise RubricError(r.prompt_id, f"dimensions[{k}].description",
                              "empty: the ProRubric formats judge a dimension by its paragraph")
    return [{"criterion": d.description, "weight": w}
            for d, w in zip(r.dimensions, r.dimension_weights())]


def _one_based(d: Dimension) -> list[int]:
    return [int(i) + 1 for i in d.criteria]


def prorubric_train_row(r: Rubric) -> dict[str, Any]:
    """``Rubric`` -> a training row (the inverse of ``parse_prorubric_train``)."""
    meta = r.meta
    extra = {"id": r.prompt_id, **(meta.get("extra_info") or {})}
    extra.setdefault("problem", r.prompt_text())
    atomic = _checklist_out(r.criteria)
    if r.dimensions:
        extra["rubric"] = _paragraphs(r)
        extra["rubric_atomic"] = atomic
        extra["rir_generation"] = json.dumps(_generation_out(r), ensure_ascii=False)
    else:
        extra["rubric"] = atomic
    extra.setdefault("rubric_correct", render_checklist(r.criteria))
    _reference_out(extra, r.reference_answer)
    row: dict[str, Any] = {
        "prompt": [{"role": "user", "content": r.prompt}] if isinstance(r.prompt, str)
        else [{"role": m.role, "content": m.content} for m in r.prompt],
        "data_source": meta.get("data_source") or meta.get("domain") or "",
        "extra_info": extra,
    }
    row.update({k: v for k, v in (meta.get("columns") or {}).items() if k not in row})
    return row


def _generation_out(r: Rubric) -> dict[str, Any]:
    kept = dict(r.meta.get("rir_generation") or {})
    weights = list(r.dimension_weights())
    model_weights = kept.pop("model_weights", None)
    if not isinstance(model_weights, list) or len(model_weights) != len(weights):
        model_weights = weights
    repaired = bool(r.meta.get("repaired", False))
    out: dict[str, Any] = {
        "names": [d.name for d in r.dimensions],
        "model_weights": model_weights,
        "atomic_indices": [_one_based(d) for d in r.dimensions],
        "repaired": repaired,
        "valid": kept.pop("valid", not repaired),
    }
    out.update(kept)
    if "model" not in out and r.meta.get("generator"):
        out["model"] = r.meta["generator"]
    if any(d.failure is not None for d in r.dimensions):
        out["failure_clauses"] = [d.failure for d in r.dimensions]
    return out


def _reference_out(extra: dict[str, Any], reference: str | None) -> None:
    """Put ``reference`` where the reader finds it, keeping a kept ``self_golden`` /
    ``reference_answer`` that already gives it."""
    kept = extra.get("self_golden") or extra.get("reference_answer") or None
    if reference != kept:
        extra["self_golden"] = reference or ""
        if reference is None:
            extra.pop("reference_answer", None)
    extra.setdefault("self_golden", "")


# --------------------------------------------------------------------------------------------
# prorubric_public
# --------------------------------------------------------------------------------------------


def parse_prorubric_public(row: Mapping[str, Any]) -> Rubric:
    """A public export row (protocol or atomic) -> ``Rubric`` (module docstring)."""
    pid = required_field(row, "id", None, str)
    if not pid:
        raise RubricError(None, "id", "empty")
    criteria = _checklist(required_field(row, "atomic_rubric", pid, (list, str)), pid,
                          "atomic_rubric")
    raw_dims = _json_value(row.get("dimensions"), pid, "dimensions") or []
    if not isinstance(raw_dims, list):
        raise RubricError(pid, "dimensions", "expected a list of dimensions")
    dims = _public_dimensions(raw_dims, len(criteria), pid)
    meta: dict[str, Any] = {k: _text(row.get(k), pid, k) for k in ("domain", "generator")
                            if row.get(k) is not None}
    if "repaired" in row:
        meta["repaired"] = _flag(row["repaired"], pid, "repaired")
    return Rubric(prompt_id=pid, prompt=_prompt(row, pid), criteria=criteria, dimensions=dims,
                  meta=meta)


def _public_dimensions(raw: list[Any], n: int, pid: str) -> tuple[Dimension, ...]:
    """``[{name, criterion, weight, atomic_indices}]`` -> dimensions (1-based -> 0-based)."""
    for k, d in enumerate(raw):
        if not isinstance(d, Mapping):
            raise RubricError(pid, f"dimensions[{k}]",
                              "expected an object {name, criterion, weight, atomic_indices}")
    if not raw:
        return ()
    groups = _groups([d.get("atomic_indices") for d in raw], n, pid,
                     lambda g: f"dimensions[{g}].atomic_indices", "dimensions")
    return tuple(_dimension(d, d.get("name"), groups[k], None, pid, f"dimensions[{k}]",
                            f"dimensions[{k}].name") for k, d in enumerate(raw))


def prorubric_public_row(r: Rubric) -> dict[str, Any]:
    """``Rubric`` -> a public export row (the inverse of ``parse_prorubric_public``).

    ``prompt`` is the kept ``extra_info.problem`` when the rubric came from a training row,
    else ``Rubric.prompt_text()``; ``domain`` is ``meta["domain"]``, else
    ``meta["data_source"]``, else ``""``.
    """
    meta = r.meta
    problem = (meta.get("extra_info") or {}).get("problem")
    row: dict[str, Any] = {
        "id": r.prompt_id,
        "domain": meta.get("domain") or meta.get("data_source") or "",
        "prompt": problem if isinstance(problem, str) and problem else r.prompt_text(),
        "atomic_rubric": _checklist_out(r.criteria),
    }
    if r.dimensions:
        row["dimensions"] = [
            {"name": d.name, "criterion": p["criterion"], "weight": p["weight"],
             "atomic_indices": _one_based(d)}
            for d, p in zip(r.dimensions, _paragraphs(r))
        ]
        row["repaired"] = bool(meta.get("repaired", False))
        row["generator"] = meta.get("generator") or ""
    return row


# --------------------------------------------------------------------------------------------
# Parquet layouts
# --------------------------------------------------------------------------------------------


def train_table(rows: list[dict[str, Any]]) -> Any:
    """Training rows -> a pyarrow Table (types inferred, as the authors' builders do)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


def public_table(rows: list[dict[str, Any]]) -> Any:
    """Public rows -> a pyarrow Table with the export's column types (weights float64,
    indices int32); the atomic layout (four columns) when no row has dimensions."""
    import pyarrow as pa

    criterion = pa.struct([("criterion", pa.string()), ("weight", pa.float64())])
    dimension = pa.struct([("name", pa.string()), ("criterion", pa.string()),
                           ("weight", pa.float64()), ("atomic_indices", pa.list_(pa.int32()))])
    fields = [("id", pa.string()), ("domain", pa.string()), ("prompt", pa.string()),
              ("atomic_rubric", pa.list_(criterion))]
    if any("dimensions" in row for row in rows):
        fields += [("dimensions", pa.list_(dimension)), ("repaired", pa.bool_()),
                   ("generator", pa.string())]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))
