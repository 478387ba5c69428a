"""A real loopback OpenAI-compatible chat-completions server for judge tests.

It answers every judge prompt of ``judges.prompts`` with a valid JSON answer, deterministically:

* check: met iff the criterion text occurs (case-insensitively) in the response;
  with ``logprobs`` requested it answers one token with P(Yes) = 0.9 or 0.1;
* rate: ``RATE[text]`` in the response -> exactly ``text`` (e.g. ``RATE[7]``: the bare "7");
  otherwise ``{"rating": 1 + number of checklist criteria occurring in the response}``;
* compare: a response containing ``GOOD`` wins; both or neither -> "tie";
* induce: two fixed process rubrics; consolidate: one rubric named after the first draft;
* bundle: the numbered criteria split into two halves, the first with a failure clause;
* equivalent: true iff a gold occurs in the prediction;
* edit (``rewards.audit_edits``), in the reply format the instruction asks for: a
  ``padding`` of ``[edited] <instruction's first word>`` filled to the "about N characters"
  asked for (60 without a size); E2 a ``sentence``; E3 an ``insert`` after the answer's first
  sentence; E4 ``delete`` of the answer's first sentence; a rewrite: the answer with
  `` [edited]`` filled to the middle of the "between LO and HI characters" asked for;
* a yes/no classification (``# Text``): "yes" iff the text holds ``YES``.

Faults are injected by markers in the *first user message* (so a re-ask of the same item, whose
conversation starts with the same message, counts as the same item):
``FAULT[kind*n]`` applies the fault to the first ``n`` requests of that item (``*all``: every
request); kinds: ``500``, ``429`` (with ``Retry-After: 0``), ``400``, ``delay`` (sleep
``delay_s`` before answering, past a short client timeout), ``garbage`` (content that is not
JSON), ``badbody`` (HTTP 200 with a non-JSON body), ``fenced`` (valid answer in a code fence
with chatter around it), ``same`` (an edit request answered with the answer unchanged).
``injected`` counts every fault actually applied.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_FAULT = re.compile(r"FAULT\[(\w+)(?:\*(\d+|all))?\]")
_RATE = re.compile(r"RATE\[([^\]]*)\]")


def _sections(text: str) -> dict[str, str]:
    """``# Header\\nvalue`` sections of a rendered judge prompt (instruction tail dropped)."""
    out: dict[str, str] = {}
    parts = re.split(r"(?:^|\n\n)# ", text)
    for part in parts[1:]:
        head, _, value = part.partition("\n")
        out[head.strip()] = value
    if out:  # the last section is followed by the instruction paragraph
        last = list(out)[-1]
        out[last] = out[last].rsplit("\n\n", 1)[0]
    return out


def _answer(system: str, user: str) -> tuple[str, float | None]:
    """(content, P(Yes) for check prompts) for one judge prompt."""
    s = _sections(user)
    if "Edit" in s and "Answer" in s:
        return _edit(s["Answer"].strip(), user.rsplit("# Edit\n", 1)[-1]), None
    if "one word: yes or no" in user:
        return ("yes" if "YES" in user.rsplit("# Text\n", 1)[-1] else "no"), None
    checklist = next((v for h, v in s.items() if h.startswith("Checklist")), None)
    if checklist is not None:
        response = s.get("Response to grade", "")
        if m := _RATE.search(response):
            return m.group(1), None
        texts = [ln.split(") ", 1)[-1].strip().lower() for ln in checklist.splitlines()]
        rating = 1 + sum(bool(t) and t in response.lower() for t in texts)
        return json.dumps({"explanation": "fake", "rating": min(rating, 10)}), None
    if "Criterion" in s:
        met = s["Criterion"].strip().lower() in s.get("Response to grade", "").lower()
        if "Answer Yes or No" in user:
            return ("Yes" if met else "No"), (0.9 if met else 0.1)
        return json.dumps({"explanation": "fake", "criteria_met": met}), (0.9 if met else 0.1)
    if "Response 1" in s:
        g1, g2 = "GOOD" in s["Response 1"], "GOOD" in s["Response 2"]
        winner = "1" if g1 and not g2 else "2" if g2 and not g1 else "tie"
        return json.dumps({"explanation": "fake", "winner": winner}), None
    if "Best trajectory (highest outcome score)" in s:
        rubrics = [
            {"title": "Evidence check", "description": "Verifies the answer in retrieved text."},
            {"title": "Focused queries", "description": "Searches for one entity at a time."},
        ]
        return json.dumps({"rubrics": rubrics}), None
    if "Draft rubrics" in s:
        first = s["Draft rubrics"].splitlines()[0].split(". ", 1)[-1].split(":")[0]
        rubric = {"title": f"Common {first}", "description": "A recurring process pattern."}
        return json.dumps({"rubrics": [rubric]}), None
    if any(h.startswith("Criteria (number") for h in s):
        body = next(v for h, v in s.items() if h.startswith("Criteria (number"))
        n = len([ln for ln in body.splitlines() if re.match(r"\d+\. ", ln)])
        half = max(1, n // 2)
        para = "A good answer does the first part. It fails if it skips a step."
        dims = [  # the authors' schema: 1-based atomic_indices
            {"name": "first", "description": para, "weight": 1,
             "atomic_indices": list(range(1, half + 1)), "failure_clause": "skips step one"},
            {"name": "second", "description": para, "weight": 1,
             "atomic_indices": list(range(half + 1, n + 1)), "failure_clause": None},
        ]
        return json.dumps({"criteria": dims}), None
    if "Predicted answer" in s:
        pred = s["Predicted answer"].lower()
        golds = [g.strip().lower() for g in s.get("Gold answer(s)", "").split(";")]
        eq = any(g and g in pred for g in golds)
        return json.dumps({"explanation": "fake", "equivalent": eq}), None
    return json.dumps({"error": "unknown prompt"}), None


def _edit(answer: str, instruction: str) -> str:
    """The loopback writer's reply to one audit edit (module docstring)."""
    first = answer.split(". ", 1)[0].rstrip(".") + "."
    if '{"padding"' in instruction:
        m = re.search(r"about (\d+) characters", instruction)
        size = int(m.group(1)) if m else 60
        text = f"[edited] {instruction.split()[0]}"
        return json.dumps({"padding": (text + " filler" * size)[:size]})
    if '"sentence"' in instruction:
        return json.dumps({"item": 1, "sentence": "[edited] One part of it."})
    if '"after"' in instruction:
        return json.dumps({"after": first, "insert": "[edited] Get an extra scan."})
    if '"delete"' in instruction:
        return json.dumps({"delete": first})
    m = re.search(r"between (\d+) and (\d+) characters", instruction)
    size = (int(m.group(1)) + int(m.group(2))) // 2 if m else len(answer) + 9
    return (answer + " [edited]" + " filler" * size)[:max(size, len(answer) + 9)]


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog (5) drops connection attempts of a concurrent batch
    # on a busy machine; a dropped SYN is retried after ~1 s and looks like a timeout.
    request_queue_size = 128


class FakeJudgeServer:
    """Threaded HTTP server on 127.0.0.1 (port 0); use as a context manager."""

    def __init__(
        self,
        *,
        logprobs: bool = True,
        api_key: str | None = None,
        delay_s: float = 1.5,
        base_delay_s: float = 0.0,
    ):
        self.logprobs = logprobs
        self.api_key = api_key
        self.delay_s = delay_s
        self.base_delay_s = base_delay_s  # every request sleeps this long (concurrency tests)
        self.lock = threading.Lock()
        self.requests = 0  # chat-completion requests received
        self.seen: Counter[str] = Counter()  # per first-user-message
        self.bodies: Counter[str] = Counter()  # per whole request body (distinct requests)
        self.injected: Counter[str] = Counter()
        self.inflight = 0
        self.max_inflight = 0
        self.auth_headers: list[str | None] = []
        self.prompt_tokens = 0  # usage reported on successful answers
        self.completion_tokens = 0
        self._stopped = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeJudgeServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._send(self, 200, {"object": "list", "data": [{"id": "fake"}]})

            def do_POST(self) -> None:  # noqa: N802
                server._handle(self)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeJudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- request handling ----------------------------------------------------------------

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, body: Any, raw: bytes | None = None,
              headers: dict[str, str] | None = None) -> None:
        data = raw if raw is not None else json.dumps(body).encode()
        try:
            h.send_response(code)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def _fault(self, root: str, n_seen: int) -> str | None:
        """The fault to apply to the ``n_seen``-th request (1-based) of this item, if any."""
        for m in _FAULT.finditer(root):
            kind, count = m.group(1), m.group(2) or "all"
            if count == "all" or n_seen <= int(count):
                return kind
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length) or b"{}")
        msgs = body.get("messages") or []
        first_user = next((m["content"] for m in msgs if m.get("role") == "user"), "")
        with self.lock:
            self.requests += 1
            self.seen[first_user] += 1
            self.bodies[json.dumps(body, sort_keys=True)] += 1
            n_seen = self.seen[first_user]
            self.auth_headers.append(h.headers.get("Authorization"))
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            fault = self._fault(first_user, n_seen)
            if fault:
                self.injected[fault] += 1
        try:
            if self.base_delay_s:
                self._stopped.wait(self.base_delay_s)  # a stopped server stops hanging
            if self.api_key is not None and h.headers.get("Authorization") != (
                f"Bearer {self.api_key}"
            ):
                return self._send(h, 401, {"error": {"message": "bad key"}})
            if fault in ("500", "400"):
                return self._send(h, int(fault), {"error": {"message": "injected"}})
            if fault == "429":
                return self._send(h, 429, {"error": {"message": "slow down"}},
                                  headers={"Retry-After": "0"})
            if fault == "badbody":
                return self._send(h, 200, None, raw=b"<html>oops, not json")
            if fault == "delay":
                self._stopped.wait(self.delay_s)
            self._complete(h, body, msgs, fault)
        finally:
            with self.lock:
                self.inflight -= 1

    def _complete(self, h: BaseHTTPRequestHandler, body: dict, msgs: list, fault: str | None
                  ) -> None:
        system = next((m["content"] for m in msgs if m.get("role") == "system"), "")
        first_user = next((m["content"] for m in msgs if m.get("role") == "user"), "")
        content, p_yes = _answer(system, first_user)
        if fault == "garbage":
            content = "I think the answer is probably fine {not json at all"
        elif fault == "same":
            content = _sections(first_user).get("Answer", "").strip()
        elif fault == "fenced":
            content = f"Sure! Here is my verdict:\n```json\n{content}\n```\nHope this helps."
        pt = sum(len(str(m.get("content", "")).split()) for m in msgs)
        ct = max(1, len(content.split()))
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }
        if body.get("logprobs") and self.logprobs and p_yes is not None:
            first = "Yes" if p_yes >= 0.5 else "No"
            choice["message"]["content"] = first
            top = [
                {"token": "Yes", "logprob": math.log(p_yes)},
                {"token": "No", "logprob": math.log(1 - p_yes)},
            ]
            choice["logprobs"] = {"content": [{"token": first, "logprob": math.log(
                max(p_yes, 1 - p_yes)), "top_logprobs": top}]}
        if fault != "delay":  # a delayed answer arrives after the client gave up: not billed
            with self.lock:
                self.prompt_tokens += pt
                self.completion_tokens += ct
        self._send(h, 200, {
            "id": "fake",
            "object": "chat.completion",
            "model": body.get("model", "fake"),
            "choices": [choice],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        })
