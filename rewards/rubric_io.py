"""Loading and saving rubric files: the format tables, format detection, and the files.

Row formats (``load_rubrics(path, fmt)``; ``fmt=None`` detects it from the first row):
``healthbench``, ``rar``, ``rubrichub`` and ``native`` (``rewards.rubric_parsers``), and the
ProRubric authors' ``prorubric_train`` and ``prorubric_public`` (``rewards.rubric_formats``).
The tables below name every one of them, explicitly; nothing registers itself by being imported.
To read or write a format of your own, add it from your code:
``RUBRIC_FORMATS.register("mine")(parse_mine)`` (and ``RUBRIC_WRITERS`` / ``PARQUET_TABLES``
for writing).

Files are JSON Lines (one row per line, blank lines skipped), a single JSON list, or Parquet
(by the ``.parquet`` suffix).  ``save_rubrics(rubrics, path, fmt)`` writes ``native`` (JSON
Lines) or either ProRubric format (JSON Lines, or Parquet for a ``.parquet`` path).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from core.files import NotUtf8Error, read_utf8, write_atomic
from core.registry import Registry
from rewards.rubric import Rubric, RubricError
from rewards.rubric_formats import (
    PUBLIC_FORMAT,
    TRAIN_FORMAT,
    parse_prorubric_public,
    parse_prorubric_train,
    prorubric_public_row,
    prorubric_train_row,
    public_table,
    train_table,
)
from rewards.rubric_parsers import (
    parse_healthbench,
    parse_rar,
    parse_rubrichub,
    rubric_from_dict,
    rubric_to_dict,
)

# --------------------------------------------------------------------------------------------
# Format tables
# --------------------------------------------------------------------------------------------

RowParser = Callable[[Mapping[str, Any]], Rubric]
RowWriter = Callable[[Rubric], dict[str, Any]]

#: Row format name -> parser ``row -> Rubric`` (raises ``RubricError``).
RUBRIC_FORMATS: Registry[RowParser] = Registry("rubric format")
RUBRIC_FORMATS.register("healthbench")(parse_healthbench)
RUBRIC_FORMATS.register("rar")(parse_rar)
RUBRIC_FORMATS.register("rubrichub")(parse_rubrichub)
RUBRIC_FORMATS.register("native")(rubric_from_dict)
RUBRIC_FORMATS.register(TRAIN_FORMAT)(parse_prorubric_train)
RUBRIC_FORMATS.register(PUBLIC_FORMAT)(parse_prorubric_public)

#: Row format name -> writer ``Rubric -> row`` (the inverse of the parser of that name).
RUBRIC_WRITERS: Registry[RowWriter] = Registry("rubric writer")
RUBRIC_WRITERS.register("native")(rubric_to_dict)
RUBRIC_WRITERS.register(TRAIN_FORMAT)(prorubric_train_row)
RUBRIC_WRITERS.register(PUBLIC_FORMAT)(prorubric_public_row)

#: Format name -> ``rows -> pyarrow.Table`` for the formats that can be written as Parquet.
PARQUET_TABLES: Registry[Callable[[list[dict[str, Any]]], Any]] = Registry("parquet layout")
PARQUET_TABLES.register(TRAIN_FORMAT)(train_table)
PARQUET_TABLES.register(PUBLIC_FORMAT)(public_table)


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

