"""Judge throughput: llama.cpp's server over HTTP vs the in-process JAX judge, and the cache.

Run: ``python -m bench.judge [--n 64] [--concurrency 1,8,32] [--batches 8,16]``.

* HTTP: ``python -m llama_cpp.server`` on the shipped SmolLM2-135M GGUF (started here, stopped at
  the end), driven through ``OpenAIBackend`` + ``LLMJudge`` at each concurrency: logprob
  criterion checks (one 1-token request each) and one row of JSON checks (generation);
* cache: the same batch twice through the on-disk cache (second pass should be all hits);
* in-process: ``JaxBackend`` logprob checks on the same model (dequantised, f32) at each batch
  size; the first pass includes jit compilation (one compile per padded shape), the second is
  warm.

llama-cpp-python's server runs one request at a time, so concurrency only hides HTTP overhead;
the in-process judge scores a whole chunk in one forward pass.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from judges import CheckRequest, LLMJudge, OpenAIBackend, OpenAIConfig
from judges.llamacpp_server import serve_llamacpp

CRITERIA = (
    "The response searches before answering.",
    "The response answers in a single short phrase.",
    "The response cites the retrieved evidence it relies on.",
    "The response contradicts the retrieved information.",
    "The response plans its search steps before the first search.",
    "The response revises its query after an unhelpful result.",
    "The response guesses without any supporting evidence.",
    "The response stops searching once the evidence is sufficient.",
)
FILMS = ("Inception", "Memento", "Alien", "Heat", "Fargo", "Arrival", "Gravity", "Jaws")
PEOPLE = (("Christopher Nolan", "London", "England"), ("Ridley Scott", "South Shields", "England"),
          ("Michael Mann", "Chicago", "the United States"), ("Joel Coen", "Minneapolis",
          "the United States"), ("Denis Villeneuve", "Becancour", "Canada"),
          ("Alfonso Cuaron", "Mexico City", "Mexico"), ("Steven Spielberg", "Cincinnati",
          "the United States"))


def make_checks(n: int, salt: int) -> list[CheckRequest]:
    """``n`` distinct, similar-length criterion checks on search-agent trajectories (``salt``
    makes another distinct set, so one set never warms a server-side cache for the next)."""
    out = []
    for i in range(n):
        k = i + 1000 * salt
        film = FILMS[k % len(FILMS)]
        who, city, country = PEOPLE[(k // len(FILMS)) % len(PEOPLE)]
        question = f"In which country was the director of {film} born? (case {k})"
        response = (
            f"<think>I need the director of {film}, then the birthplace.</think>"
            f"<search>{film} director</search>"
            f"<information>{film} was directed by {who}, who was born in {city}.</information>"
            f"<think>{city} is in {country}.</think><answer>{country}</answer>"
        )
        out.append(CheckRequest(question, response, CRITERIA[k % len(CRITERIA)]))
    return out


@contextmanager
def llama_server(model: Path, n_threads: int, timeout_s: float) -> Iterator[str]:
    """llama.cpp's OpenAI-compatible server with a throwaway log; yields its base URL."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "llamacpp.log"
        with serve_llamacpp(model, log, timeout_s=timeout_s, n_threads=n_threads) as base:
            yield base


def _http_judge(base: str, concurrency: int, cache_dir: str | None, **kw) -> LLMJudge:
    backend = OpenAIBackend(OpenAIConfig(
        base_url=base, model="smollm2", api_key_env=None, max_concurrency=concurrency,
        timeout_s=600, max_retries=1, cache_dir=cache_dir,
    ))
    return LLMJudge(backend, max_reasks=0, seed=0, **kw)


def _timed(judge: LLMJudge, reqs: list[CheckRequest]) -> float:
    t0 = time.perf_counter()
    judge.check(reqs)
    return time.perf_counter() - t0


Row = tuple[str, str, str, int, float, str]


def bench_http(model: Path, a: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    with llama_server(model, a.n_threads, a.startup_timeout) as base:
        _http_judge(base, 1, None, check_mode="logprob").check(make_checks(2, 99))  # warm-up
        for salt, conc in enumerate(a.concurrency):
            judge = _http_judge(base, conc, None, check_mode="logprob")
            dt = _timed(judge, make_checks(a.n, salt))
            s = judge.stats()
            note = f"{s['http_requests']} HTTP requests"
            if s["logprob_unsupported"]:
                note += f", {s['logprob_unsupported']} without logprobs (JSON instead)"
            rows.append(("llama.cpp HTTP", "logprob check", f"conc {conc}", a.n, dt, note))
        judge = _http_judge(base, 8, None, max_tokens=a.json_max_tokens)
        dt = _timed(judge, make_checks(a.n, 50))
        s = judge.stats()
        rows.append(("llama.cpp HTTP", "JSON check", "conc 8", a.n, dt,
                     f"{s['completion_tokens'] / a.n:.0f} tokens/answer, "
                     f"{s['fallbacks']} unparseable"))
        with tempfile.TemporaryDirectory() as cache:
            reqs = make_checks(a.n, 60)
            for name in ("cache, 1st pass", "cache, 2nd pass"):
                judge = _http_judge(base, 8, cache, check_mode="logprob")
                dt = _timed(judge, reqs)
                s = judge.stats()
                rows.append(("llama.cpp HTTP", "logprob check", f"conc 8, {name}", a.n, dt,
                             f"hit rate {s['cache_hits'] / max(1, s['backend_calls']):.0%}, "
                             f"{s['http_requests']} HTTP requests"))
    return rows


def bench_local(a: argparse.Namespace) -> list[Row]:
    from judges.local import JaxBackend
    from models import load_params

    t0 = time.perf_counter()
    loaded = load_params("smollm2_135m")
    print(f"(in-process model loaded in {time.perf_counter() - t0:.1f}s)", flush=True)
    rows: list[Row] = []
    for salt, batch in enumerate(a.batches):
        backend = JaxBackend(loaded, max_batch=batch)
        judge = LLMJudge(backend, check_mode="logprob", seed=0)
        reqs = make_checks(a.n, 70 + salt)
        cold = _timed(judge, reqs)
        passes = backend.stats()["forward_passes"]
        warm = _timed(judge, reqs)
        s = judge.stats()
        tokens = s["prompt_tokens"] / 2 / a.n
        rows.append(("in-process JAX", "logprob check", f"batch {batch}, cold", a.n, cold,
                     f"incl. jit compile, {passes} forward passes"))
        rows.append(("in-process JAX", "logprob check", f"batch {batch}, warm", a.n, warm,
                     f"{tokens:.0f} prompt tokens/check, "
                     f"{s['prompt_tokens'] / 2 / warm:.0f} tok/s prefill"))
    # One row of generation for scale: JSON verdicts need ~40-60 generated tokens each.
    backend = JaxBackend(loaded, max_batch=8, max_new_tokens=a.json_max_tokens)
    judge = LLMJudge(backend, max_reasks=0, max_tokens=a.json_max_tokens, seed=0)
    reqs = make_checks(8, 90)
    judge.check(reqs)  # compile (no cache in-process: the repeat is recomputed)
    dt = _timed(judge, reqs)
    s = judge.stats()
    rows.append(("in-process JAX", "JSON check", "batch 8, warm", 8, dt,
                 f"{s['completion_tokens'] / 16:.0f} tokens/answer, "
                 f"{s['fallbacks']} of 16 unparseable"))
    return rows


def print_table(rows: list[Row]) -> None:
    head = ("backend", "operation", "setting", "n", "seconds", "judgments/s", "notes")
    body = [(b, op, st, str(n), f"{dt:.2f}", f"{n / dt:.1f}", note)
            for b, op, st, n, dt, note in rows]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in body:
        print(line(r))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="criterion checks per row")
    p.add_argument("--concurrency", default="1,8,32", help="HTTP concurrency levels")
    p.add_argument("--batches", default="8,16", help="in-process batch sizes")
    p.add_argument("--json-max-tokens", type=int, default=64)
    p.add_argument("--n-threads", type=int, default=os.cpu_count() or 1,
                   help="llama.cpp threads (its default is half the cores)")
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--skip-http", action="store_true")
    p.add_argument("--skip-local", action="store_true")
    a = p.parse_args(argv)
    a.concurrency = [int(x) for x in a.concurrency.split(",") if x]
    a.batches = [int(x) for x in a.batches.split(",") if x]

    from models.presets import shipped_gguf_path

    model = shipped_gguf_path()
    rows: list[Row] = []
    if not a.skip_http:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError:
            print("llama-cpp-python[server] is not installed: skipping the HTTP rows")
        else:
            rows += bench_http(model, a)
    if not a.skip_local:
        rows += bench_local(a)
    print(f"\njudge throughput, shipped {model.name}, {os.cpu_count()} CPU cores")
    print_table(rows)


if __name__ == "__main__":
    main()
