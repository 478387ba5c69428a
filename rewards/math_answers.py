"""Math answers: is a response's final answer the gold one, as a mathematician would read it?

Both sides are parsed by Hugging Face's ``math-verify`` (``pip install -e '.[math]'``), the
checker open-r1 and TRL's accuracy reward use: LaTeX or plain expressions, ``\\boxed{}``
preferred, then the last expression; ``1/2``, ``0.5`` and ``\\frac{1}{2}`` are one answer, as
are equal sets, intervals and equations' sides; numbers compare to 6 decimals. A GSM8K gold
(``... #### 72``) is read after its ``####``.

``math-verify`` bounds its parsing with a signal alarm, which only the main thread may set:
elsewhere (a reward computed in a worker thread) the checks run without that bound.
"""

from __future__ import annotations

import threading
from typing import Any


def _gold_text(gold: object) -> str:
    text = str(gold)
    return text.rsplit("####", 1)[1].strip() if "####" in text else text


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise ImportError("math answers are checked by math-verify: pip install -e "
                          "'.[math]'") from None
    return math_verify


def _timeout() -> int | None:
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_equivalent(response_text: str, gold: object) -> float:
    """1.0 when the response's final answer equals the gold answer (module docstring)."""
    mv, timeout = _math_verify(), _timeout()
    gold_parsed = mv.parse(_gold_text(gold), parsing_timeout=timeout)
    if not gold_parsed:
        return 0.0
    answer = mv.parse(response_text, parsing_timeout=timeout)
    return float(bool(answer) and mv.verify(gold_parsed, answer, timeout_seconds=timeout))


def math_answer(response_text: str) -> str | None:
    """The response's final answer as math-verify reads it, as text two equal answers share:
    a number to 6 significant digits (``0.5`` for ``\\boxed{\\frac{1}{2}}`` and for
    ``0.5``), another expression as sympy prints it; None when there is none."""
    parsed = _math_verify().parse(response_text, parsing_timeout=_timeout())
    if not parsed:
        return None
    try:
        return f"{float(parsed[0]):.6g}"
    except (TypeError, ValueError):
        return str(parsed[0])
