"""Rubric data model and padding to arrays (ProRubric; docs/guides/prorubric.md).

A rubric is a checklist of criteria ``i`` with weights ``w_i``.  A negative weight marks a
*pitfall*: the criterion text describes an undesirable behaviour, and a judge saying "met" means
the behaviour is present.  ProRubric additionally partitions the criteria into ``K`` protocol
dimensions (``1 <= K <= 5``; the bundler aims at 2..5, ``K = 1`` is the authors' ablation), each
with an optional failure clause, an optional paragraph ``description`` (the one criterion the
ProRubric authors' judge sees for the dimension) and a weight (default ``sum_{i in I_d} |w_i|``);
see ``rewards.aggregate.prorubric``.

``RAR_WEIGHT_LABELS`` maps the Rubrics-as-Rewards weight labels to numbers.  Reading and writing
rubric files (``load_rubrics``, ``save_rubrics``) is ``rewards.rubric_io``; the row formats are
``rewards.rubric_parsers`` (HealthBench, RaR, RubricHub, native) and ``rewards.rubric_formats``
(the ProRubric authors').
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

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

    def context_text(self) -> str:
        """The prompt as a judge reads it: a plain prompt's text, a single message's content,
        a conversation's turns as ``role: content`` paragraphs (HealthBench's grader shows
        the judge the whole conversation, not only its last question)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) == 1:
            return self.prompt[0].content
        return "\n\n".join(f"{m.role}: {m.content}" for m in self.prompt)

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
