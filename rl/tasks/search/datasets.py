"""QA dataset loaders into one :class:`QAExample` type.

Formats (registry ``QA_FORMATS``; ``load_qa(path, fmt=None)`` picks one):

* ``searchr1``  - Search-R1 parquet rows ``{data_source, prompt: [{role, content}],
  reward_model: {ground_truth: {target: [...]}}, extra_info}``; the question is the user
  content after its last "Question: " (the whole user content when absent).
* ``flashrag``  - FlashRAG jsonl ``{id, question, golden_answers, metadata?}``.
* ``hotpotqa``  - HotpotQA json: a list of ``{_id, question, answer, type, level, ...}``.
* ``2wikimultihopqa`` - 2WikiMultiHopQA json: a list of ``{_id, question, answer, type,
  evidences, ...}``.
* ``musique``   - MuSiQue jsonl ``{id, question, answer, answer_aliases, answerable, ...}``;
  unanswerable rows are kept with ``meta["answerable"] = False`` for the caller to filter.
* ``bamboogle`` - the original Bamboogle release, a csv with ``Question`` / ``Answer``
  columns. (FlashRAG's bamboogle jsonl is plain ``flashrag`` format.)

Auto-detection: ``.parquet`` -> searchr1, ``.csv`` -> bamboogle; ``.jsonl`` / ``.json`` by
the first row's keys (golden_answers -> flashrag; answerable / answer_aliases -> musique;
``evidences`` -> 2wikimultihopqa; ``level`` or ``supporting_facts`` without ``evidences`` ->
hotpotqa). Anything else needs an explicit ``fmt``.

A row without a usable question or answer raises :class:`DatasetError` naming the file and
where the row is (``line N`` of a jsonl or csv file, 1-based like an editor's; ``row i`` of a
json list or parquet table, 0-based); with ``skip_bad=True`` it is skipped, counted in
``QADataset.n_skipped`` and logged as a warning. A file that is not UTF-8 text is a
DatasetError naming it.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.files import write_atomic
from core.registry import Registry

log = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset file or row that cannot be read."""


class _BadRow(ValueError):
    pass


@dataclass(frozen=True)
class QAExample:
    """One question. ``meta`` (format-specific extras) is left out of equality and hashing,
    so examples can be set members / dict keys."""

    id: str
    question: str
    golds: tuple[str, ...]
    source: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class QADataset:
    """The examples of one file, plus how many bad rows were skipped (``skip_bad=True``) and
    their 0-based positions in the file's rows (for jsonl, 0-based line numbers)."""

    examples: tuple[QAExample, ...]
    path: str
    fmt: str
    n_skipped: int = 0
    skipped_rows: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[QAExample]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> QAExample:
        return self.examples[i]


@dataclass(frozen=True)
class QAFormat:
    """``read(path) -> rows`` (raises DatasetError for an unreadable file, returns a _BadRow
    instance in place of an unparsable row and None for a blank line) and
    ``parse(row, index) -> QAExample``; ``where(index)`` names a row's place in the file."""

    read: Callable[[Path], list[Any]]
    parse: Callable[[Any, int], QAExample]
    where: Callable[[int], str] = lambda i: f"row {i}"


def _line(i: int) -> str:
    return f"line {i + 1}"


QA_FORMATS: Registry[QAFormat] = Registry("qa format")


# ---------------------------------------------------------------- row helpers


def _question(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _BadRow("missing or empty question")
    return value.strip()


def _golds(values: Any) -> tuple[str, ...]:
    if isinstance(values, str | int | float) and not isinstance(values, bool):
        values = [values]
    elif hasattr(values, "tolist"):  # numpy arrays from pandas-read parquet
        values = values.tolist()
    if not isinstance(values, list | tuple):
        raise _BadRow("missing answers")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise _BadRow(f"answer {v!r} is not a string")
        s = str(v).strip()
        if s and s not in out:
            out.append(s)
    if not out:
        raise _BadRow("no non-empty answer")
    return tuple(out)


def _obj(row: Any) -> dict[str, Any]:
    if isinstance(row, _BadRow):
        raise row
    if not isinstance(row, dict):
        raise _BadRow(f"expected an object, got {type(row).__name__}")
    return row


def _field_obj(row: dict[str, Any], key: str) -> dict[str, Any]:
    """row[key] when it is an object ({} when absent or null)."""
    value = row.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _BadRow(f"{key} must be an object, got {type(value).__name__}")
    return value


def _read_jsonl(path: Path) -> list[Any]:
    rows: list[Any] = []
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                rows.append(None)  # keeps row i on line i + 1
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                rows.append(_BadRow(f"invalid JSON ({e.msg})"))
    return rows


def _read_json_list(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    return data


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DatasetError(f"{path}: cannot read parquet ({e})") from None


def _read_csv(path: Path) -> list[Any]:
    with path.open("r", encoding="utf-8-sig", newline="") as f:  # -sig: Excel/Sheets BOM
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- formats


def _parse_searchr1(row: Any, i: int) -> QAExample:
    row = _obj(row)
    prompt = row.get("prompt")
    user = None
    if isinstance(prompt, list):
        user = next((m.get("content") for m in prompt
                     if isinstance(m, dict) and m.get("role") == "user"), None)
    if isinstance(user, str):
        # Search-R1 prompts end with "Question: {question}\n"; take the last one so an
        # instruction mentioning "Question:" earlier does not matter.
        _, sep, after = user.rpartition("Question:")
        question = _question(after if sep else user)
    else:
        question = _question(row.get("question"))
    gt = _field_obj(row, "reward_model").get("ground_truth")
    if not isinstance(gt, dict) or "target" not in gt:
        raise _BadRow("missing reward_model.ground_truth.target")
    extra = _field_obj(row, "extra_info")
    source = str(row.get("data_source") or "searchr1")
    rid = row.get("id")
    if rid is None:
        rid = f"{source}_{extra.get('split', 'x')}_{extra.get('index', i)}"
    meta = {k: row[k] for k in ("ability", "extra_info") if row.get(k) is not None}
    return QAExample(str(rid), question, _golds(gt["target"]), source, meta)


def _parse_flashrag(row: Any, i: int) -> QAExample:
    row = _obj(row)
    meta = _field_obj(row, "metadata")
    source = str(meta.get("source") or row.get("source") or "flashrag")
    return QAExample(str(row.get("id", i)), _question(row.get("question")),
                     _golds(row.get("golden_answers")), source, dict(meta))


def _multihop_json(source: str, meta_keys: Sequence[str]) -> Callable[[Any, int], QAExample]:
    def parse(row: Any, i: int) -> QAExample:
        row = _obj(row)
        meta = {k: row[k] for k in meta_keys if k in row}
        return QAExample(str(row.get("_id", row.get("id", i))), _question(row.get("question")),
                         _golds(row.get("answer")), source, meta)

    return parse


def _parse_musique(row: Any, i: int) -> QAExample:
    row = _obj(row)
    answer = row.get("answer")
    aliases = row.get("answer_aliases") or []
    if not isinstance(aliases, list):
        raise _BadRow("answer_aliases must be a list")
    rid = str(row.get("id", i))
    meta: dict[str, Any] = {"answerable": bool(row.get("answerable", True))}
    hop = rid.split("hop", 1)[0]  # MuSiQue ids start with "2hop__", "3hop1__", ...
    if hop.isdigit():
        meta["hops"] = int(hop)
    if "question_decomposition" in row:
        meta["question_decomposition"] = row["question_decomposition"]
    golds = _golds([answer, *aliases] if answer is not None else aliases)
    return QAExample(rid, _question(row.get("question")), golds, "musique", meta)


def _parse_bamboogle(row: Any, i: int) -> QAExample:
    row = _obj(row)
    return QAExample(f"bamboogle_{i}", _question(row.get("Question")),
                     _golds(row.get("Answer")), "bamboogle", {})


QA_FORMATS.register("searchr1")(QAFormat(_read_parquet, _parse_searchr1))
QA_FORMATS.register("flashrag")(QAFormat(_read_jsonl, _parse_flashrag, _line))
QA_FORMATS.register("hotpotqa")(QAFormat(
    _read_json_list, _multihop_json("hotpotqa", ("type", "level", "supporting_facts"))))
QA_FORMATS.register("2wikimultihopqa")(QAFormat(
    _read_json_list, _multihop_json("2wikimultihopqa", ("type", "evidences", "supporting_facts"))))
QA_FORMATS.register("musique")(QAFormat(_read_jsonl, _parse_musique, _line))
QA_FORMATS.register("bamboogle")(QAFormat(_read_csv, _parse_bamboogle,
                                          lambda i: f"line {i + 2}"))  # after the header


# ---------------------------------------------------------------- detection and loading


def _first_row_keys(path: Path) -> set[str]:
    with path.open("r", encoding="utf-8") as f:
        if path.suffix.lower() == ".jsonl":
            for line in f:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        return set()
                    return set(row) if isinstance(row, dict) else set()
            return set()
        try:
            data = json.load(f)
        except json.JSONDecodeError:
            return set()
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return set(data[0])
    return set()


def detect_format(path: str | Path) -> str:
    """Guess the format from the extension and the first row's keys; DatasetError when the
    guess would be ambiguous."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "searchr1"
    if suffix == ".csv":
        return "bamboogle"
    if suffix in (".jsonl", ".json"):
        try:
            keys = _first_row_keys(path)
        except UnicodeDecodeError as e:
            raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
        if "golden_answers" in keys:
            return "flashrag"
        if keys & {"answerable", "answer_aliases"}:
            return "musique"
        if "evidences" in keys:
            return "2wikimultihopqa"
        if keys & {"level", "supporting_facts"} and "answer" in keys:
            return "hotpotqa"
    raise DatasetError(
        f"{path}: cannot detect the QA format; pass fmt= one of {QA_FORMATS.names()}"
    )


def load_qa(path: str | Path, fmt: str | None = None, skip_bad: bool = False,
            source: str | None = None) -> QADataset:
    """Load a QA file into a :class:`QADataset` (``fmt=None``: auto-detect). ``source``
    overrides each example's source tag."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    if fmt is None:
        fmt = detect_format(path)
    elif fmt not in QA_FORMATS:
        raise DatasetError(f"{path}: unknown QA format {fmt!r}; known: {QA_FORMATS.names()}")
    spec = QA_FORMATS.get(fmt)
    try:
        rows = spec.read(path)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    examples: list[QAExample] = []
    skipped: list[int] = []
    for i, row in enumerate(rows):
        if row is None:  # a blank line
            continue
        try:
            ex = spec.parse(row, i)
        except Exception as e:  # a row of unexpected shape: named, never a bare traceback
            if not skip_bad:
                why = str(e) if isinstance(e, _BadRow) else f"{type(e).__name__}: {e}"
                raise DatasetError(f"{path}: {spec.where(i)}: {why}") from None
            skipped.append(i)
            continue
        if source is not None:
            ex = QAExample(ex.id, ex.question, ex.golds, source, ex.meta)
        examples.append(ex)
    if not examples:
        why = f" (all {len(skipped)} rows were bad)" if skipped else ""
        raise DatasetError(f"{path}: no examples{why}")
    if skipped:
        log.warning("%s: skipped %d bad row(s): %s", path, len(skipped), skipped[:20])
    return QADataset(tuple(examples), str(path), fmt, len(skipped), tuple(skipped))


def write_flashrag_jsonl(examples: Sequence[QAExample], path: str | Path) -> Path:
    """Write examples in FlashRAG jsonl (``metadata`` carries ``meta`` and the source),
    atomically (``core.files``)."""
    path = Path(path)
    rows = ({"id": ex.id, "question": ex.question, "golden_answers": list(ex.golds),
             "metadata": {**ex.meta, "source": ex.source}} for ex in examples)
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
