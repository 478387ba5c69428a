"""Where a data task's rows come from: a file, a folder of files, a Hugging Face dataset, and
the filter on the rows' own fields (``task.where``).

A file is JSON Lines, a JSON list or Parquet (``rewards.rubric_io.read_rows``); a folder is
every such file in it (``*.jsonl``, ``*.json``, ``*.parquet``), in name order. A dataset
(``org/name``, a subset, a split) is read by the ``datasets`` library from its snapshot in the
Hugging Face cache (``core.hub``): the dataset card first, then only the files of the subset
it names. Each row keeps its source and its row number there, so an error about it names
both.

``where`` keeps the rows whose fields hold the wanted values: ``{data_source: medical}``, a
dotted path into nested fields (``{extra_info.split: train}``), a list of accepted values
(``{data_source: [medical, writing]}``), and a field that is a list matches when any of its
elements does (HealthBench's ``{example_tags: theme:emergency_referrals}``). Values compare
as text, so ``1`` in a config matches ``"1"`` in a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rewards.rubric_io import read_rows

#: the file suffixes a folder source reads
ROW_FILES = (".jsonl", ".json", ".parquet")


class SourceError(ValueError):
    """A data source that cannot be read or filtered as configured (names the key and file)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a source: its file, its number in that file (from 0) and its fields."""

    source: str
    index: int
    data: Any

    @property
    def where(self) -> str:
        return f"{self.source}: row {self.index}"


def source_files(path: str | Path, key: str) -> list[Path]:
    """The files of `path`: itself, or a folder's row files in name order (`key` names the
    config key in errors)."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in ROW_FILES and f.is_file())
        if not files:
            raise SourceError(f"{key}: folder {p} holds no {', '.join(ROW_FILES)} file")
        return files
    if not p.exists():
        raise SourceError(f"{key}: no such file or folder: {p}")
    return [p]


def read_source(path: str | Path, key: str) -> list[Row]:
    """Every row of the file or folder `path`."""
    return [Row(str(f), i, data) for f in source_files(path, key)
            for i, data in enumerate(read_rows(f))]


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_provenance(path: str | Path, key: str) -> list[dict[str, str]]:
    """Each file of a source with its SHA-256: what a run's ``provenance.jsonl`` names."""
    return [{"path": str(f), "sha256": file_digest(f)} for f in source_files(path, key)]


def _card_config(configs: list[Any], subset: str | None) -> Mapping[str, Any] | None:
    """The card's config of `subset`; without one, the config marked default, the one named
    ``default`` or the first."""
    named = [c for c in configs if isinstance(c, Mapping)]
    if subset:
        return next((c for c in named if c.get("config_name") == subset), None)
    return (next((c for c in named if c.get("default")), None)
            or next((c for c in named if c.get("config_name") == "default"), None)
            or (named[0] if named else None))


def _card_patterns(card: Path, subset: str | None) -> list[str] | None:
    """The data files the card (README.md front matter, ``configs``) gives `subset`, as
    ``allow_patterns``; None when it names none (the whole repository is fetched, and the
    datasets library says which subsets there are)."""
    import yaml

    text = card.read_text(encoding="utf-8") if card.exists() else ""
    if not text.startswith("---"):
        return None
    meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    configs = meta.get("configs") if isinstance(meta, Mapping) else None
    config = _card_config(configs, subset) if isinstance(configs, list) else None
    if config is None:
        return None
    files = config.get("data_files")
    paths: list[str] = []
    for entry in files if isinstance(files, list) else [files]:
        path = entry.get("path") if isinstance(entry, Mapping) else entry
        paths += [str(p) for p in (path if isinstance(path, list) else [path]) if p]
    return paths or None


def dataset_commit(dataset: str, revision: str | None, key: str) -> str:
    """The commit `revision` (None: the default branch) of hub dataset `dataset` resolves to
    (its card fetched into the cache, or found there); a ``SourceError`` naming `key`."""
    from core.hub import HubError, snapshot

    try:
        return snapshot(dataset, revision, repo_type="dataset", patterns=["README.md"]).name
    except HubError as e:
        raise SourceError(f"{key}: {e}") from None


def read_dataset(dataset: str, subset: str | None, split: str, revision: str | None,
                 key: str) -> tuple[list[Row], str]:
    """The rows of `split` of `subset` of hub dataset `dataset` at `revision`, and the commit
    they were read at. A dataset, subset or split that does not exist, or one neither cached
    nor reachable, is a ``SourceError`` naming `key`."""
    from core.hub import HubError, snapshot

    try:
        import datasets
    except ImportError:
        raise SourceError(f"{key}: reading a Hugging Face dataset needs the datasets "
                          f"package: pip install -e '.[data]'") from None
    try:
        card = snapshot(dataset, revision, repo_type="dataset", patterns=["README.md"])
        patterns = _card_patterns(card / "README.md", subset)
        folder = snapshot(dataset, card.name, repo_type="dataset",
                          patterns=None if patterns is None else ["README.md", *patterns])
    except HubError as e:
        raise SourceError(f"{key}: {e}") from None
    try:
        table = datasets.load_dataset(str(folder), subset, split=split)
    except (ValueError, FileNotFoundError) as e:
        raise SourceError(f"{key}: {dataset} (subset {subset}, split {split}): {e}") from None
    source = f"{dataset}@{folder.name[:12]} {subset or 'default'}/{split}"
    return [Row(source, i, data) for i, data in enumerate(table.to_list())], folder.name


MISSING = object()  # what field_value gives for a path a row does not have


def field_value(data: Any, dotted: str) -> Any:
    """The value at a dotted path of a row (``MISSING`` where the path does not exist)."""
    value = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def _matches(value: Any, wanted: Any) -> bool:
    accepted = {str(w) for w in (wanted if isinstance(wanted, Sequence)
                                 and not isinstance(wanted, str) else [wanted])}
    values = value if isinstance(value, list | tuple) else [value]
    return any(str(v) in accepted for v in values)


def _keeps(data: Any, where: Mapping[str, Any]) -> bool:
    for field, wanted in where.items():
        value = field_value(data, str(field))
        if value is MISSING or not _matches(value, wanted):
            return False
    return True


def filter_rows(rows: Sequence[Row], where: Mapping[str, Any] | None, key: str) -> list[Row]:
    """The rows whose fields match `where` (module docstring). A field no row has, or a
    filter that keeps nothing, is a ``SourceError`` naming `key` and the source."""
    if not where:
        return list(rows)
    if not isinstance(where, Mapping):
        raise SourceError(f"{key}: expected a mapping of field to value(s), got {where!r}")
    sources = ", ".join(dict.fromkeys(r.source for r in rows)) or "<no rows>"
    for field in where:
        if not any(field_value(r.data, str(field)) is not MISSING for r in rows):
            first = rows[0].data if rows and isinstance(rows[0].data, Mapping) else {}
            raise SourceError(f"{key}.{field}: no row of {sources} has this field "
                              f"(the first row's fields: {', '.join(map(str, first))})")
    kept = [r for r in rows if _keeps(r.data, where)]
    if not kept:
        raise SourceError(f"{key}: no row of {sources} matches {dict(where)} "
                          f"({len(rows)} rows read)")
    return kept


SPLITS = ("train", "dev", "test")


@dataclasses.dataclass
class DataSource:
    """Where a data task's splits come from (the ``task`` keys of the same names): a file or
    folder (``path``, with ``dev_path`` / ``test_path``) or a hub dataset (``dataset``,
    ``subset``, ``split``, ``dev_split``, ``test_split``, ``revision``); a split without a
    source of its own is held out of the training rows (:func:`hold_out`). A dataset's
    splits are all read at the commit the first one was read at (``commit``)."""

    path: str | None = None
    dev_path: str | None = None
    test_path: str | None = None
    dataset: str | None = None
    subset: str | None = None
    split: str = "train"
    dev_split: str | None = None
    test_split: str | None = None
    revision: str | None = None
    commit: str | None = None

    def __post_init__(self) -> None:
        if bool(self.path) == bool(self.dataset):
            raise SourceError("task.path / task.dataset: name one source, a file or folder "
                              "(task.path=/data/train.jsonl) or a Hugging Face dataset "
                              "(task.dataset=org/name)")

    def rows(self, split: str) -> list[Row] | None:
        """The rows of `split` from its own source (None: it has none, it is held out)."""
        if self.dataset:
            name = {"train": self.split, "dev": self.dev_split, "test": self.test_split}[split]
            if not name:
                return None
            key = "task.dataset" if split == "train" else f"task.{split}_split"
            rows, self.commit = read_dataset(self.dataset, self.subset, name,
                                             self.commit or self.revision, key)
            return rows
        path = {"train": self.path, "dev": self.dev_path, "test": self.test_path}[split]
        key = "task.path" if split == "train" else f"task.{split}_path"
        return None if not path else read_source(str(path), key)

    def provenance(self) -> dict[str, Any]:
        """The source for ``provenance.jsonl``: the dataset and the commit read, or each
        file with its SHA-256."""
        if self.dataset:
            return {"dataset": self.dataset, "subset": self.subset, "revision": self.revision,
                    "commit": self.commit, "splits": {"train": self.split,
                                                      "dev": self.dev_split,
                                                      "test": self.test_split}}
        return {"files": {key: source_provenance(p, f"task.{key}") for key, p in
                          (("path", self.path), ("dev_path", self.dev_path),
                           ("test_path", self.test_path)) if p}}


def held_out(n: int, fraction: float, seed: int, parts: int = 2) -> tuple[np.ndarray, ...]:
    """(train, held out 1, ..., held out `parts`) indices of `n` rows: a seeded permutation,
    cut into `parts` blocks of max(1, round(fraction n)) and the rest for training."""
    k = max(1, round(fraction * n))
    order = np.random.default_rng(seed).permutation(n)
    return (np.sort(order[parts * k:]),
            *(np.sort(order[j * k:(j + 1) * k]) for j in range(parts)))


def hold_out(splits: Mapping[str, list[Any]], fraction: float, seed: int) -> dict[str, list[Any]]:
    """`splits` with the dev and test splits it lacks cut out of its training items
    (:func:`held_out`); too few training items for that is a ``SourceError``."""
    train = splits["train"]
    missing = [s for s in ("test", "dev") if s not in splits]
    if not missing:
        return dict(splits)
    if len(train) <= len(missing):
        raise SourceError(f"task.eval_fraction: the training source holds {len(train)} prompts "
                          f"after task.where; holding {' and '.join(missing)} prompts out "
                          f"needs {len(missing) + 1} (or give their own sources)")
    keep, *held = held_out(len(train), fraction, seed, len(missing))
    return {**splits, "train": [train[i] for i in keep],
            **{s: [train[i] for i in idx] for s, idx in zip(missing, held)}}


def read_splits(task: Any, items: Callable[[list[Row]], list[Any]]
                ) -> tuple[DataSource, dict[str, list[Any]]]:
    """A data task's source and its three splits: the task's source keys (the fields of
    :class:`DataSource`) read split by split, each split's rows (kept by ``task.where``)
    turned into items by `items`, the missing splits held out (``task.eval_fraction``,
    ``task.seed``) and each capped (``task.size``, ``task.eval_size``)."""
    if not 0 < float(task.eval_fraction) < 0.5:
        raise SourceError(f"task.eval_fraction: must be in (0, 0.5), got {task.eval_fraction}")
    source = DataSource(**{f.name: getattr(task, f.name) for f in dataclasses.fields(DataSource)
                           if f.name != "commit"})
    splits = {s: items(filter_rows(rows, task.where, "task.where"))
              for s in SPLITS if (rows := source.rows(s)) is not None}
    splits = hold_out(splits, float(task.eval_fraction), int(task.seed))
    caps = {"train": task.size, "dev": task.eval_size, "test": task.eval_size}
    return source, {s: got[:caps[s]] if caps[s] else got for s, got in splits.items()}
