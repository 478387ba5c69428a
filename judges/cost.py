"""What a step's judging cost: requests, cache hits, tokens and an estimated price.

The judges count cumulatively (``Judge.stats()``, logged as ``judge/*``). A step's own share
is the difference of two snapshots around its rollout and rewards (:func:`step_usage`:
``judge_step/*``), so evaluation calls between steps are not charged to a step. The
estimated cost uses ``judge.price_per_mtok_in`` and ``judge.price_per_mtok_out`` (price per
million prompt and completion tokens, in whatever currency the user writes them; unset:
no cost). Cache hits send nothing and cost nothing: the backends count tokens from the
server's ``usage`` only. The wall time of a step's rewards is ``time/judge_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRICE_KEYS = ("price_per_mtok_in", "price_per_mtok_out")


def cost(prompt_tokens: float, completion_tokens: float, price_in: float | None,
         price_out: float | None) -> float | None:
    """(prompt tokens x price_in + completion tokens x price_out) / 1e6; None without
    prices (an unset price counts as 0 when the other is set)."""
    if price_in is None and price_out is None:
        return None
    return (prompt_tokens * (price_in or 0.0) + completion_tokens * (price_out or 0.0)) / 1e6


def step_usage(before: Mapping[str, Any], after: Mapping[str, Any],
               price_in: float | None = None, price_out: float | None = None
               ) -> dict[str, float]:
    """``judge_step/*`` from two snapshots of the ``judge/*`` counters: ``requests`` (every
    judge operation asked for), ``backend_calls``, ``cache_hits``, ``prompt_tokens``,
    ``completion_tokens`` and, with prices, ``cost``. {} without a judge."""
    if not any(k.startswith("judge/") for k in after):
        return {}

    def delta(key: str) -> float:
        return float(after.get(key, 0)) - float(before.get(key, 0))

    out = {"judge_step/requests": sum(delta(k) for k in after
                                      if k.startswith("judge/requests_"))}
    for name in ("backend_calls", "cache_hits", "prompt_tokens", "completion_tokens"):
        if f"judge/{name}" in after:
            out[f"judge_step/{name}"] = delta(f"judge/{name}")
    spent = cost(out.get("judge_step/prompt_tokens", 0.0),
                 out.get("judge_step/completion_tokens", 0.0), price_in, price_out)
    if spent is not None:
        out["judge_step/cost"] = spent
    return out


def prices(judge_cfg: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The judge config's prices (None: unset), checked: a negative price is an error."""
    out = []
    for key in PRICE_KEYS:
        value = judge_cfg.get(key)
        if value is not None and float(value) < 0:
            raise ValueError(f"judge.{key} must be >= 0, got {value}")
        out.append(None if value is None else float(value))
    return out[0], out[1]
