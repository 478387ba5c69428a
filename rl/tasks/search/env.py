"""Multi-turn search environment (the Search-R1 protocol that ARBOR builds on).

Each turn the policy generates until `</search>`, `</answer>`, EOS or its budget. The action is
the first `<(search|answer)>(.*?)</\\1>` of the turn. A search appends the retrieved documents
as `\\n\\n<information>...</information>\\n\\n` (a failed retrieval: the same block holding
``rl.tasks.search.faults.SEARCH_FAILED``); anything else appends the invalid-action message. Both
are observations: their tokens get loss mask 0 (no loss, no KL). After `max_turns` turns, one
final generation runs with search disabled. A turn that ends with EOS
and no action ends the trajectory (our choice: the policy chose to stop; its format is then
invalid). Search-R1 instead appends the invalid-action message and goes on. The protocol's
texts and rules (prompt, action, invalid-action message) are ``core.search_r1``'s.

Only unfinished trajectories are sent to the sampler, so finished ones stop costing compute.
When the policy can continue a generation (``continue_from``, e.g. the jitted sampler's KV
cache), a turn reads only the new observation tokens instead of re-reading the whole context,
and the batch advances in chunks of ``chunk_tokens`` instead of whole turns: a row whose turn
ended (its action executed, its observation appended) starts its next turn in the next chunk
while the others go on with theirs, so no row waits for the batch's slowest turn. Turn
boundaries, stop strings and budgets are exactly those of turn-by-turn generation.

The protocol lives in a few methods (``encode_prompt``, ``_stop_strings``, ``_act``,
``_append_observation``, ``_texts``, ``_info``); ``rl.tasks.search.tool_env.ToolCallSearchEnv``
overrides them for the chat template's native tool calls (``task.protocol=tool_call``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from core.search_r1 import INVALID_ACTION, parse_action
from core.types import Group, Policy, Prompt, Trajectory
from models.continuation import Continuation
from models.padding import round_up
from models.sampler import Generation, SamplingParams
from models.tokenizer import Tokenizer
from rl.tasks.search.corpus import Doc, render_docs
from rl.tasks.search.faults import SEARCH_FAILED, RetrievalGuard

PROMPT_BUCKET = 64  # a rollout's prompts are padded to a multiple of this: few cache shapes


def _end_at_answer(text: str) -> str:
    """An answered trajectory's text ends at its ``</answer>``. The sampler stops right after
    the token that completes the stop string, and that token may carry more characters
    (SmolLM2 has ``>.``, ``>,``, ``>"``, ...); Search-R1 cuts them off too. The trajectory's
    tokens keep the token as sampled (it is what the policy generated)."""
    return text[: text.rindex("</answer>") + len("</answer>")]


@dataclasses.dataclass
class _Row:
    prompt_tokens: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    done: bool = False
    finish: str = "length"
    turns: int = 0
    searches: int = 0
    invalid: int = 0
    slot: int | None = None  # this row's index in the latest generation (for continuing it)
    unread: list[int] = dataclasses.field(default_factory=list)  # observations since then
    turn_tokens: list[int] = dataclasses.field(default_factory=list)  # this turn's, so far

    def add(self, tokens: Sequence[int], action: bool, logprobs: Sequence[float] = ()) -> None:
        self.tokens += list(tokens)
        self.mask += [int(action)] * len(tokens)
        self.logprobs += list(logprobs) if action else [0.0] * len(tokens)
        if not action:
            self.unread += list(tokens)


@dataclasses.dataclass(frozen=True)
class _Decoding:
    """How one rollout decodes: whole turns, or chunks of ``chunk`` tokens for a policy that
    can continue a generation; the sampling with and without search; the invalid-action
    message's tokens."""

    chunked: bool
    chunk: int
    per_turn: int  # a turn's token budget
    with_search: SamplingParams
    answer_only: SamplingParams
    invalid_ids: tuple[int, ...]
    read_width: int  # the longest observation a row can read (its lines' width)


@dataclasses.dataclass(frozen=True)
class SearchEnv:
    """`sampling.max_new_tokens` bounds each turn; `max_response_tokens` bounds a whole
    trajectory (actions + observations); `max_obs_tokens` truncates retrieved text;
    `chunk_tokens` is the decode granularity with a policy that can continue generations;
    `quote_titles` renders titles as Search-R1 does, with their double quotes (for its
    checkpoints; see rl.tasks.search.corpus.render_docs); `guard` (rl.tasks.search.faults) turns a
    failed retrieval call into the `SEARCH_FAILED` observation, counted, within a fault budget."""

    tokenizer: Tokenizer
    sampling: SamplingParams
    retriever: Any
    topk: int = 3
    max_turns: int = 4
    max_response_tokens: int = 512
    max_obs_tokens: int = 256
    chunk_tokens: int = 16
    quote_titles: bool = False  # Search-R1 renders wiki-18 titles with their quotes
    guard: RetrievalGuard | None = None  # None: a retrieval error ends the rollout

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError(f"task.chunk_tokens must be >= 1, got {self.chunk_tokens}")

    def _retrieve(self, queries: list[str]) -> list[list[Doc]] | list[None]:
        """One result list per query; with a ``guard``, a failed call (within its budget)
        gives None for every query (rendered as ``SEARCH_FAILED``)."""
        if not queries:
            return []
        if self.guard is None:
            return self.retriever.retrieve(queries, topk=self.topk)
        results = self.guard.retrieve(self.retriever, queries, self.topk)
        return [None] * len(queries) if results is None else results

    def retrieval_stats(self) -> dict[str, int]:
        """The ``retrieval/*`` counters (``rl.tasks.search.faults``); empty without a guard."""
        return {} if self.guard is None else self.guard.stats(self.retriever)

    def _observe(self, searching: list[tuple[_Row, list[str]]]) -> None:
        """Retrieve for every row's queries at once, then append each row's observation."""
        results = self._retrieve([q for _, queries in searching for q in queries])
        start = 0
        for row, queries in searching:
            self._append_observation(row, results[start:start + len(queries)])
            start += len(queries)

    def _append_observation(self, row: _Row, results: Sequence[list[Doc] | None]) -> None:
        """Search-R1: the documents of the turn's one search in an ``<information>`` block."""
        (docs,) = results
        text = SEARCH_FAILED if docs is None else render_docs(docs, self.quote_titles).strip()
        ids = self.tokenizer.encode(f"\n\n<information>{text}</information>\n\n")
        if len(ids) > self.max_obs_tokens:  # keep the closing tag so the format stays valid
            tail = self.tokenizer.encode("...</information>\n\n")
            ids = ids[: self.max_obs_tokens - len(tail)] + tail
        row.add(ids, action=False)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """The prompt's tokens: its messages in the chat template, with the generation prompt."""
        return self.tokenizer.encode_chat(list(prompt.messages))

    def _new_row(self, prompt: Prompt, prompt_tokens: list[int]) -> _Row:
        del prompt  # a Search-R1 row needs only its tokens
        return _Row(prompt_tokens)

    def rollout(self, policy: Policy, prompts: Sequence[Prompt], group_size: int,
                seed: int) -> list[Group]:
        base = [self.encode_prompt(p) for p in prompts]
        rows = [self._new_row(p, list(ids)) for p, ids in zip(prompts, base)
                for _ in range(group_size)]
        decoding = self._decoding(policy)
        state = None  # the latest generation's continuation state, if the policy has one
        for call in itertools.count():
            active = self._unfinished(rows)
            if not active:
                break
            gen, limits = self._generate(policy, decoding, state, active, seed * 1000 + call,
                                         first_continuation=call == 1)
            state = getattr(gen, "state", None)
            searching: list[tuple[_Row, list[str]]] = []
            for i, r in enumerate(active):
                queries = self._advance(r, gen, i, limits[i], decoding)
                if queries is not None:
                    searching.append((r, queries))
            self._observe(searching)
        return self._groups(prompts, rows, group_size)

    def _decoding(self, policy: Policy) -> _Decoding:
        per_turn = self.sampling.max_new_tokens
        # Chunked decoding needs a policy that can continue a generation; any other policy
        # generates whole turns, the batch in lockstep, the last one without search.
        chunked = hasattr(policy, "continue_from")
        chunk = min(self.chunk_tokens, per_turn) if chunked else per_turn
        stops, final_stops = self._stop_strings()
        with_search = dataclasses.replace(self.sampling, stop=stops, max_new_tokens=chunk)
        return _Decoding(chunked=chunked, chunk=chunk, per_turn=per_turn,
                         with_search=with_search,
                         answer_only=dataclasses.replace(with_search, stop=final_stops),
                         invalid_ids=tuple(self.tokenizer.encode(INVALID_ACTION)),
                         read_width=self._observation_bound())

    def _observation_bound(self) -> int:
        """The most tokens one observation can hold: a search's ``max_obs_tokens``, or the
        invalid-action message."""
        return max(self.max_obs_tokens, len(self.tokenizer.encode(INVALID_ACTION)))

    def _stop_strings(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Where a turn stops: while searching is allowed, and in the final turn."""
        return ("</search>", "</answer>"), ("</answer>",)

    def _unfinished(self, rows: list[_Row]) -> list[_Row]:
        """The rows still going; a row whose response reached its budget finishes here."""
        active = [r for r in rows if not r.done]
        for r in active:
            if len(r.tokens) >= self.max_response_tokens:
                r.done, r.finish = True, "length"
        return [r for r in active if not r.done]

    def _generate(self, policy: Policy, decoding: _Decoding, state: Any, active: list[_Row],
                  seed: int, first_continuation: bool) -> tuple[Generation, list[int]]:
        """One generation call for the active rows, and each row's token limit in it."""
        # Chunks always stop at both tags (the automaton state carries over between
        # chunks only for an unchanged stop set); a final-turn row that stops at
        # `</search>` simply goes on in the next chunk, as if only `</answer>` stopped it.
        final_only = all(r.turns == self.max_turns for r in active)
        sampling = (decoding.answer_only if final_only and not decoding.chunked
                    else decoding.with_search)
        limits = [min(decoding.chunk, decoding.per_turn - len(r.turn_tokens),
                      self.max_response_tokens - len(r.tokens)) for r in active]
        if state is not None and decoding.chunked:
            # each state is continued once, in place; the first continuation of a rollout
            # compiles the read and every row bucket's decode (no later chunk or step compiles)
            slots = [r.slot for r in active if r.slot is not None]
            if len(slots) != len(active):  # every row of a chunked rollout has its slot
                raise RuntimeError("search rollout: a row to continue has no generation slot")
            continuation = Continuation(slots, [r.unread for r in active],
                                        limits, consume=True, read_width=decoding.read_width,
                                        compile_buckets=first_continuation)
            gen = policy.continue_from(  # type: ignore[attr-defined]  # chunked: SamplerPolicy
                state, continuation, sampling, seed=seed)
        elif decoding.chunked:
            # one KV cache for the whole rollout: room for a whole trajectory after the
            # prompt (a row's tokens, generated and observed, stop at max_response_tokens)
            whole = dataclasses.replace(sampling, prompt_bucket=PROMPT_BUCKET,
                                        capacity=round_up(self.max_response_tokens, 64))
            gen = policy.generate([r.prompt_tokens + r.tokens for r in active], whole,
                                  seed=seed, max_new_per_row=limits)
        else:
            gen = policy.generate([r.prompt_tokens + r.tokens for r in active], sampling,
                                  seed=seed, max_new_per_row=limits)
        return gen, limits

    def _advance(self, r: _Row, gen: Generation, i: int, limit: int,
                 decoding: _Decoding) -> list[str] | None:
        """Append generation row ``i`` to ``r``; if that ends the row's turn, act on the turn.
        Returns the queries of a turn that gets an observation (the caller retrieves for all
        searching rows at once), None for a turn that does not."""
        r.slot, r.unread = i, []
        n = int(gen.lengths[i])
        generated = gen.tokens[i, :n].tolist()
        r.add(generated, True, gen.logprobs[i, :n].tolist())
        r.turn_tokens += generated
        final = r.turns == self.max_turns
        out_of_budget = (len(r.turn_tokens) >= decoding.per_turn
                         or len(r.tokens) >= self.max_response_tokens)
        if decoding.chunked and gen.finish[i] == "length" and n == limit and not out_of_budget:
            return None  # the chunk ended mid-turn
        text = (gen.texts[i] if len(r.turn_tokens) == n
                else self.tokenizer.decode(r.turn_tokens))
        if (decoding.chunked and final and gen.finish[i] == "stop" and "</answer>" not in text
                and not out_of_budget):
            return None  # a final turn ignores `</search>`
        r.turns += 1
        turn, r.turn_tokens = r.turn_tokens, []
        return self._act(r, turn, text, gen.finish[i], final, decoding)

    def _act(self, r: _Row, turn: list[int], text: str, finish: str, final: bool,
             decoding: _Decoding) -> list[str] | None:
        """Search-R1: the turn's first ``<search>``/``<answer>`` (``turn``: its tokens)."""
        del turn  # the decoded text is enough here
        kind, content = parse_action(text)
        if kind == "answer":
            r.done, r.finish = True, "answer"
        elif kind == "search" and not final:
            r.searches += 1
            return [content]
        elif finish == "eos" or final:
            r.done, r.finish = True, finish
        else:
            r.invalid += 1
            r.add(decoding.invalid_ids, action=False)
        return None

    def _texts(self, rows: list[_Row]) -> list[str]:
        """Each trajectory's response text (what the rewards read)."""
        return [_end_at_answer(text) if r.finish == "answer" else text
                for r, text in zip(rows, self.tokenizer.decode_batch([r.tokens for r in rows]))]

    def _info(self, r: _Row) -> dict[str, int]:
        return {"turns": r.turns, "searches": r.searches, "invalid_actions": r.invalid}

    def _groups(self, prompts: Sequence[Prompt], rows: list[_Row],
                group_size: int) -> list[Group]:
        texts = self._texts(rows)
        groups = []
        for i, prompt in enumerate(prompts):
            trajs = tuple(
                Trajectory(prompt_tokens=tuple(r.prompt_tokens), tokens=tuple(r.tokens),
                           loss_mask=tuple(r.mask), logprobs=tuple(r.logprobs), text=text,
                           finish=r.finish, info=self._info(r))
                for r, text in zip(rows[i * group_size:(i + 1) * group_size],
                                   texts[i * group_size:(i + 1) * group_size]))
            groups.append(Group(prompt, trajs))
        return groups
