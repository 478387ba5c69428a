"""Retrieval corpora in the wiki-18 jsonl form used by Search-R1 / FlashRAG.

One JSON object per line: ``{"id": "0", "contents": "\\"Title\\"\\ntext"}``; the first line of
``contents`` is the (double-quoted) title, the rest is the passage text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.files import write_atomic


class CorpusError(ValueError):
    """A corpus file that cannot be used (bad row, duplicate id, empty)."""


@dataclass(frozen=True)
class Doc:
    """A retrieved (or stored) passage; ``score`` is the retriever's score, 0 when stored."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        return format_contents(self.title, self.text)


def parse_contents(contents: str) -> tuple[str, str]:
    """Split wiki-18 ``contents`` into (title, text): the first line, without its surrounding
    double quotes, and the remaining lines."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def format_contents(title: str, text: str) -> str:
    """Inverse of :func:`parse_contents`."""
    return f'"{title}"\n{text}'


def render_docs(docs: Sequence[Doc], quote_titles: bool = False) -> str:
    """Search-R1's passage rendering: ``Doc {i}(Title: {title}) {text}\\n`` per doc, i from 1.

    Search-R1 itself renders the raw first line, i.e. the title WITH its double quotes;
    ``quote_titles=True`` reproduces that byte for byte (e.g. for Search-R1 checkpoints)."""
    out = []
    for i, d in enumerate(docs, start=1):
        title = f'"{d.title}"' if quote_titles else d.title
        out.append(f"Doc {i}(Title: {title}) {d.text}\n")
    return "".join(out)


def _row_to_doc(row: object, where: str) -> Doc:
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "id" not in row or "contents" not in row:
        missing = [k for k in ("id", "contents") if k not in row]
        raise CorpusError(f"{where}: missing field(s) {missing}")
    doc_id, contents = row["id"], row["contents"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
        raise CorpusError(f"{where}: 'id' must be a string or an integer, got {doc_id!r}")
    if not isinstance(contents, str):
        raise CorpusError(f"{where}: 'contents' must be a string")
    title, text = parse_contents(contents)
    return Doc(id=str(doc_id), title=title, text=text)


def load_corpus(path: str | Path) -> tuple[Doc, ...]:
    """Read a wiki-18 style jsonl corpus. Blank lines are skipped; a bad row, a duplicate id
    or an empty corpus raise :class:`CorpusError` naming the file (and line)."""
    path = Path(path)
    docs: list[Doc] = []
    seen: dict[str, int] = {}
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{where}: invalid JSON ({e.msg})") from None
            doc = _row_to_doc(row, where)
            if doc.id in seen:
                first = seen[doc.id]
                raise CorpusError(f"{where}: duplicate id {doc.id!r} (first on line {first})")
            seen[doc.id] = lineno
            docs.append(doc)
    if not docs:
        raise CorpusError(f"{path}: empty corpus (no documents)")
    return tuple(docs)


def write_corpus(docs: Iterable[Doc], path: str | Path) -> Path:
    """Write docs as wiki-18 jsonl (``id``, ``contents``), atomically (``core.files``)."""
    path = Path(path)
    write_atomic(path, "".join(
        json.dumps({"id": d.id, "contents": d.contents}, ensure_ascii=False) + "\n"
        for d in docs))
    return path
