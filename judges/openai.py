"""OpenAI-compatible chat-completions backend (vLLM, SGLang, llama.cpp's server, hosted APIs).

* async under the hood (one ``httpx.AsyncClient`` per batch), bounded concurrency
  (``max_concurrency`` requests in flight), a total deadline per attempt (``timeout_s``);
* retries of timeouts, transport errors, unreadable bodies (undecodable, not JSON, or JSON of
  the wrong shape), 408/409/425/429 and 5xx, with
  exponential backoff and jitter (``Retry-After`` honoured, capped); a request that exhausts its
  retries yields a ``Completion`` with ``error`` set — a batch never raises for one bad request;
* a circuit breaker (``core.breaker``): after ``breaker_timeouts`` consecutive timeouts every
  request fails fast (``error`` set, counted in ``breaker_rejected``) for
  ``breaker_cooldown_s``, then one probe request tests the server; a hung server costs about
  one ``timeout_s`` per cool-down instead of the full retry schedule of every request;
* an on-disk cache keyed by the SHA-256 of the server's address (``base_url``, never the API
  key) and the full request body (model, messages, sampling params): the same model name on
  another server is another judge; identical requests inside a batch are sent once; only
  deterministic requests (temperature 0, or a fixed sampling seed) are cached unless
  ``cache_sampled``;
* token accounting from ``usage`` (cache hits cost nothing and are not counted);
* the API key is read from the environment variable named by ``api_key_env`` and kept in a
  ``_Secret`` whose repr is masked and whose pickle re-reads the environment — it is never
  logged, repr'd, cached or pickled.

The sync methods work inside a running event loop too (e.g. a notebook): the batch then runs on a
worker thread with its own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import random
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import httpx

from core.breaker import CircuitBreaker
from core.files import write_atomic
from judges.base import BACKEND_STAT_KEYS, Counters, stable_digest
from judges.types import Completion, Messages

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
_CACHE_FORMAT = 1


class _Secret:
    """Holds a credential; masked in repr/str, never pickled (unpickling re-reads the env)."""

    __slots__ = ("_env", "_value")

    def __init__(self, env: str | None):
        self._env = env
        self._value = os.environ.get(env) if env else None

    def reveal(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return f"_Secret(env={self._env!r}, value={'***' if self._value else None})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Secret, (self._env,))


@dataclass(frozen=True)
class OpenAIConfig:
    """Connection and sampling settings (no secrets: only the *name* of the key's env var).

    ``extra_body`` is merged into every request body (e.g. vLLM's
    ``{"chat_template_kwargs": {"enable_thinking": false}}``) and is part of the cache key.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key_env: str | None = "OPENAI_API_KEY"
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    breaker_timeouts: int = 3
    breaker_cooldown_s: float = 30.0
    cache_dir: str | None = None
    cache_sampled: bool = False
    top_p: float | None = None
    seed: int | None = None
    top_logprobs: int = 10
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    jitter_seed: int | None = None

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> OpenAIConfig:
        """Build from a config mapping; unknown keys are an error (typos must not pass)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - names)
        if unknown:
            raise ValueError(f"unknown OpenAI judge option(s): {', '.join(unknown)}")
        values = dict(cfg)
        if values.get("extra_body") is not None:
            values["extra_body"] = dict(values["extra_body"])
        return cls(**values)


class DiskCache:
    """One JSON file per key under ``root/ab/abcdef...json``; atomic writes (tmp + rename), so
    concurrent runs sharing a cache never see half-written entries. Unreadable entries are
    misses."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) and value.get("format") == _CACHE_FORMAT else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        try:
            write_atomic(self._path(key),
                         json.dumps({"format": _CACHE_FORMAT, **value}, ensure_ascii=False))
        except OSError as e:  # a full disk must not stop training; the entry is just not cached
            log.warning("judge cache write failed: %s", type(e).__name__)


def run_sync(coro_factory: Any) -> Any:
    """Run ``coro_factory()`` to completion from sync code, even inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(lambda: asyncio.run(coro_factory())).result()


@dataclass(frozen=True)
class _Reply:
    """One finished request: the parsed body or why it failed."""

    body: dict[str, Any] | None
    error: str | None


class OpenAIBackend:
    """Chat completions over HTTP; implements ``complete`` and ``choice_probs`` (logprobs)."""

    def __init__(self, config: OpenAIConfig | None = None, **overrides: Any):
        cfg = config or OpenAIConfig()
        if overrides:
            cfg = OpenAIConfig.from_dict({**_asdict(cfg), **overrides})
        if cfg.max_concurrency < 1 or cfg.max_retries < 0 or cfg.timeout_s <= 0:
            raise ValueError("need max_concurrency >= 1, max_retries >= 0, timeout_s > 0")
        if cfg.breaker_timeouts < 0 or cfg.breaker_cooldown_s < 0:
            raise ValueError(f"judge.breaker_timeouts and judge.breaker_cooldown_s must be >= 0, "
                             f"got {cfg.breaker_timeouts}, {cfg.breaker_cooldown_s}")
        self.config = cfg
        self._key = _Secret(cfg.api_key_env)
        if cfg.api_key_env and not self._key:
            log.info("env var %s is not set: sending no Authorization header", cfg.api_key_env)
        self._cache = DiskCache(cfg.cache_dir) if cfg.cache_dir else None
        self._c = Counters(BACKEND_STAT_KEYS)
        self._breaker = CircuitBreaker(cfg.breaker_timeouts, cfg.breaker_cooldown_s)
        self._rng = random.Random(cfg.jitter_seed)
        self._logprobs_ok = True  # flips off once the server shows it has no logprobs
        self._url = cfg.base_url.rstrip("/") + "/chat/completions"

    def __repr__(self) -> str:
        c = self.config
        return (
            f"OpenAIBackend(base_url={c.base_url!r}, model={c.model!r}, "
            f"max_concurrency={c.max_concurrency}, cache_dir={c.cache_dir!r})"
        )

    # --- public sync API ------------------------------------------------------------------

    def complete(
        self, batch: Sequence[Messages], max_tokens: int, temperature: float
    ) -> list[Completion]:
        """One completion per message list, same order; failures come back as ``error``."""
        return run_sync(lambda: self.acomplete(batch, max_tokens, temperature))

    def choice_probs(
        self, batch: Sequence[Messages], choices: Sequence[str] = ("Yes", "No")
    ) -> list[dict[str, float]]:
        """P(next token is each choice), normalised over ``choices``, from ``top_logprobs``;
        ``{}`` for an item without usable logprobs (the judge then parses text instead)."""
        return run_sync(lambda: self.achoice_probs(batch, choices))

    def stats(self) -> dict[str, int]:
        return self._c.snapshot() | self._breaker.stats()

    def close(self) -> None:
        """Nothing persistent to release (clients live per batch); kept for the protocol."""

    # --- async API ------------------------------------------------------------------------

    async def acomplete(
        self, batch: Sequence[Messages], max_tokens: int, temperature: float
    ) -> list[Completion]:
        payloads = [self._payload(m, max_tokens, temperature) for m in batch]
        cacheable = temperature == 0 or self.config.seed is not None or self.config.cache_sampled
        entries = await self._fetch(payloads, cacheable, _completion_entry)
        return [
            Completion(
                text=e["text"],
                prompt_tokens=e.get("prompt_tokens", 0),
                completion_tokens=e.get("completion_tokens", 0),
                cached=e.get("cached", False),
            )
            if "error" not in e
            else Completion(text="", error=e["error"])
            for e in entries
        ]

    async def achoice_probs(
        self, batch: Sequence[Messages], choices: Sequence[str] = ("Yes", "No")
    ) -> list[dict[str, float]]:
        if not self._logprobs_ok:
            self._c.inc("logprob_unsupported", len(batch))
            return [{} for _ in batch]
        payloads = [
            {
                **self._payload(m, 1, 0.0),
                "logprobs": True,
                "top_logprobs": self.config.top_logprobs,
            }
            for m in batch
        ]
        entries = await self._fetch(payloads, True, _logprob_entry)
        out: list[dict[str, float]] = []
        for e in entries:
            probs = _choice_probs(e.get("top") or [], choices) if "error" not in e else {}
            if not probs:
                self._c.inc("logprob_unsupported")
            out.append(probs)
        # A server that answers without logprobs (or rejects the parameter with a 4xx) will keep
        # doing so: stop paying for the extra request. Timeouts/5xx say nothing about support.
        if entries and all(_no_logprobs(e) for e in entries):
            log.info("judge server returned no logprobs: checks will parse text from now on")
            self._logprobs_ok = False
        return out

    # --- internals ------------------------------------------------------------------------

    def _payload(self, messages: Messages, max_tokens: int, temperature: float) -> dict:
        c = self.config
        body: dict[str, Any] = {
            "model": c.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
        }
        if c.top_p is not None:
            body["top_p"] = float(c.top_p)
        if c.seed is not None:
            body["seed"] = int(c.seed)
        body.update(c.extra_body)
        return body

    async def _fetch(
        self, payloads: list[dict], cacheable: bool, to_entry: Any
    ) -> list[dict[str, Any]]:
        """Cache lookup, in-batch de-duplication, concurrent requests, cache fill.

        ``to_entry(body)`` turns a response body into the cacheable entry (a JSON-able dict).
        """
        self._c.inc("backend_calls", len(payloads))
        keys = [self._cache_key(p) if cacheable else None for p in payloads]
        entries: list[dict[str, Any] | None] = [None] * len(payloads)
        todo: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            hit = self._cache.get(key) if (self._cache and key) else None
            if hit is not None:
                self._c.inc("cache_hits")
                entries[i] = {**hit, "cached": True}
            elif key is not None and key in todo:  # same request twice in this batch
                self._c.inc("cache_hits")
                todo[key].append(i)
            else:
                todo[key if key is not None else f"#{i}"] = [i]
        if todo:
            limits = httpx.Limits(max_connections=self.config.max_concurrency)
            headers = {"Authorization": f"Bearer {self._key.reveal()}"} if self._key else {}
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(self.config.timeout_s), limits=limits, headers=headers
            ) as client:
                sem = asyncio.Semaphore(self.config.max_concurrency)
                replies = await asyncio.gather(
                    *(self._request(client, sem, payloads[idx[0]], to_entry)
                      for idx in todo.values())
                )
            for (key, idx), reply in zip(todo.items(), replies):
                if reply.error is not None:
                    entry: dict[str, Any] = {"error": reply.error}
                else:
                    entry = to_entry(reply.body)
                    self._c.inc("prompt_tokens", entry.get("prompt_tokens", 0))
                    self._c.inc("completion_tokens", entry.get("completion_tokens", 0))
                    if self._cache and not key.startswith("#"):
                        self._cache.put(key, entry)
                for n, i in enumerate(idx):
                    entries[i] = entry if n == 0 else {**entry, "cached": "error" not in entry}
        return [e if e is not None else {"error": "internal: no reply"} for e in entries]

    def _cache_key(self, payload: dict) -> str:
        """``sha256(url, body)``: the server's address is part of a verdict's identity (the
        same model name, e.g. "default", on another server is another model); the API key is
        not (it is a secret, and does not change the answer)."""
        return stable_digest({"url": self._url, "body": payload})

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with 'equal jitter'; a server's Retry-After wins (capped)."""
        c = self.config
        if retry_after is not None:
            return min(max(retry_after, 0.0), c.backoff_max_s)
        cap = min(c.backoff_max_s, c.backoff_base_s * (2 ** (attempt - 1)))
        return cap / 2 + self._rng.uniform(0, cap / 2)

    async def _send(self, client: httpx.AsyncClient,
                    payload: dict) -> tuple[httpx.Response | None, str]:
        """One attempt: (the response, "") or (None, why it failed), counted and reported to
        the circuit breaker."""
        c = self.config
        self._c.inc("http_requests")
        try:
            resp = await _with_deadline(client.post(self._url, json=payload), c.timeout_s)
        except (httpx.TimeoutException, TimeoutError):
            self._c.inc("timeouts")
            if self._breaker.record(timed_out=True):
                log.warning("judge server %s timed out %d times in a row: requests fail fast "
                            "for %s s (circuit breaker)", c.base_url, self._breaker.streak,
                            c.breaker_cooldown_s)
            return None, "timeout"
        except httpx.DecodingError as e:  # e.g. "content-encoding: gzip", plain body
            self._breaker.record(timed_out=False)
            self._c.inc("bad_responses")
            return None, f"undecodable response body ({type(e).__name__})"
        except httpx.RequestError as e:  # TransportError and any other request failure
            self._breaker.record(timed_out=False)
            self._c.inc("transport_errors")
            return None, f"transport error ({type(e).__name__})"
        self._breaker.record(timed_out=False)
        return resp, ""

    async def _request(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        payload: dict,
        to_entry: Any,
    ) -> _Reply:
        c = self.config
        error = "no attempt"
        retry_after: float | None = None
        for attempt in range(c.max_retries + 1):
            if attempt and not self._breaker.is_open():
                self._c.inc("retries")
                await asyncio.sleep(self._backoff(attempt, retry_after))
            retry_after = None
            async with sem:  # hold a slot only while a request is in flight, not while backing off
                if not self._breaker.allow():  # the server hangs: fail fast (see core.breaker)
                    error = (f"circuit breaker open after {c.breaker_timeouts} consecutive "
                             f"timeouts (judge.breaker_cooldown_s={c.breaker_cooldown_s})")
                    break
                resp, error = await self._send(client, payload)
            if resp is None:
                continue
            if resp.status_code >= 300:
                self._c.inc("http_errors")
                error = f"HTTP {resp.status_code}"
                if resp.status_code in _RETRYABLE_STATUS or resp.status_code >= 500:
                    retry_after = _retry_after(resp)
                    continue
                break  # 4xx: the request itself is wrong; retrying cannot help
            try:
                body = resp.json()
                to_entry(body)  # validates the shape we need (raises ValueError otherwise)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError,
                    OverflowError) as e:  # the validators raise ValueError; the rest: belt
                self._c.inc("bad_responses")
                error = f"unreadable response body ({str(e)[:160]})"
                continue
            return _Reply(body=body, error=None)
        self._c.inc("failed_requests")
        # refused by the open breaker: logged once, when it opened
        level = logging.DEBUG if error.startswith("circuit breaker") else logging.WARNING
        log.log(level, "judge request failed after %d attempt(s): %s", attempt + 1, error)
        return _Reply(body=None, error=error)


async def _with_deadline(aw: Awaitable[T], timeout_s: float) -> T:
    """A total deadline per attempt (httpx timeouts are per phase: a trickling server could
    otherwise hold a slot far longer than ``timeout_s``)."""
    return await asyncio.wait_for(aw, timeout=timeout_s)


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# Response-body validators: a body of the wrong shape raises ``ValueError`` saying which field,
# so ``_request`` counts it as a bad response and retries (never an exception out of a batch).


def _obj(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field} is not an object")
    return value


def _count(value: Any, field: str) -> int:
    """A token count: absent/null -> 0; otherwise a finite non-negative number."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value >= 0
    ):
        raise ValueError(f"{field} is not a token count")
    return int(value)


def _logprob(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} is not a number")
    return float(value)


def _first_choice(body: Any) -> dict[str, Any]:
    choices = _obj(body, "body").get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("choices is not a non-empty list")
    return _obj(choices[0], "choices[0]")


def _usage(body: dict[str, Any]) -> tuple[int, int]:
    usage = _obj(body.get("usage") or {}, "usage")
    return (_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
            _count(usage.get("completion_tokens"), "usage.completion_tokens"))


def _completion_entry(body: dict[str, Any]) -> dict[str, Any]:
    """Cacheable entry of a chat completion; ``ValueError`` on a body of the wrong shape."""
    message = _obj(_first_choice(body).get("message"), "choices[0].message")
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise ValueError("choices[0].message.content is not a string")
    pt, ct = _usage(body)
    return {"text": text, "prompt_tokens": pt, "completion_tokens": ct}


def _logprob_entry(body: dict[str, Any]) -> dict[str, Any]:
    """Cacheable entry of a 1-token logprob request: ``top`` = [[token, logprob], ...] of the
    first generated position, or ``None`` when the server returned no logprobs;
    ``ValueError`` on a body of the wrong shape."""
    entry = _completion_entry(body)
    lp = _first_choice(body).get("logprobs")
    top: list[list[Any]] | None = None
    if isinstance(lp, dict):
        content = lp.get("content")
        if isinstance(content, list) and content:  # OpenAI chat format
            first = _obj(content[0] or {}, "logprobs.content[0]")
            cands = first.get("top_logprobs") or [first]
            if not isinstance(cands, list):
                raise ValueError("logprobs.content[0].top_logprobs is not a list")
            top = [
                [str(t.get("token", "")), _logprob(t.get("logprob", -math.inf), "logprob")]
                for t in cands
                if isinstance(t, dict)
            ]
        elif isinstance(lp.get("top_logprobs"), list) and lp["top_logprobs"]:  # legacy format
            first = _obj(lp["top_logprobs"][0] or {}, "logprobs.top_logprobs[0]")
            top = [[str(k), _logprob(v, "logprob")] for k, v in first.items()]
    return {**entry, "top": top}


def _no_logprobs(entry: dict[str, Any]) -> bool:
    if "error" in entry:
        return str(entry["error"]).startswith("HTTP 4")
    return entry.get("top") is None


def _choice_probs(top: Sequence[Sequence[Any]], choices: Sequence[str]) -> dict[str, float]:
    """Sum the probability mass of tokens spelling each choice (case/space-insensitive)."""
    mass = dict.fromkeys(choices, 0.0)
    for token, logprob in top:
        norm = str(token).strip().lower()
        for ch in choices:
            if norm and norm == ch.lower() and math.isfinite(float(logprob)):
                mass[ch] += math.exp(float(logprob))
    total = sum(mass.values())
    return {ch: m / total for ch, m in mass.items()} if total > 0 else {}


def _asdict(cfg: OpenAIConfig) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}
