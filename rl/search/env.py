"""Multi-turn search environment (the Search-R1 protocol that ARBOR builds on).

Each turn the policy generates until `</search>`, `</answer>`, EOS or its budget. The action is
the first `<(search|answer)>(.*?)</\\1>` of the turn. A search appends the retrieved documents
as `\\n\\n<information>...</information>\\n\\n`; anything else appends the invalid-action
message. Both are observations: their tokens get loss mask 0 (no loss, no KL). After
`max_turns` turns, one final generation runs with search disabled.

The whole batch advances turn by turn and only unfinished trajectories are sent to the sampler,
so finished ones stop costing compute. When the policy can continue a generation
(``continue_from``, e.g. the jitted sampler's KV cache), a turn reads only the new observation
tokens instead of re-reading the whole context.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from models.sampler import SamplingParams
from models.tokenizer import Tokenizer
from rl.search.corpus import render_docs
from rl.types import Group, Policy, Prompt, Trajectory

PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n")
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n")
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def search_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question.strip())


def parse_action(text: str) -> tuple[str | None, str]:
    """("search" | "answer" | None, content) from one turn's generated text."""
    m = ACTION_RE.search(text)
    return (m.group(1), m.group(2).strip()) if m else (None, "")


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

    def add(self, tokens: Sequence[int], action: bool, logprobs: Sequence[float] = ()) -> None:
        self.tokens += list(tokens)
        self.mask += [int(action)] * len(tokens)
        self.logprobs += list(logprobs) if action else [0.0] * len(tokens)
        if not action:
            self.unread += list(tokens)


@dataclasses.dataclass(frozen=True)
class SearchEnv:
    """`sampling.max_new_tokens` bounds each turn; `max_response_tokens` bounds a whole
    trajectory (actions + observations); `max_obs_tokens` truncates retrieved text."""

    tokenizer: Tokenizer
    sampling: SamplingParams
    retriever: Any
    topk: int = 3
    max_turns: int = 4
    max_response_tokens: int = 512
    max_obs_tokens: int = 256

    def _observe(self, rows: list[_Row], queries: list[str]) -> None:
        results = self.retriever.retrieve(queries, topk=self.topk) if queries else []
        for row, docs in zip(rows, results):
            ids = self.tokenizer.encode(f"\n\n<information>{render_docs(docs).strip()}"
                                        f"</information>\n\n")
            if len(ids) > self.max_obs_tokens:  # keep the closing tag so the format stays valid
                tail = self.tokenizer.encode("...</information>\n\n")
                ids = ids[: self.max_obs_tokens - len(tail)] + tail
            row.add(ids, action=False)

    def rollout(self, policy: Policy, prompts: Sequence[Prompt], group_size: int,
                seed: int) -> list[Group]:
        base = [self.tokenizer.encode_chat(list(p.messages)) for p in prompts]
        rows = [_Row(list(ids)) for ids in base for _ in range(group_size)]
        invalid_ids = self.tokenizer.encode(INVALID_ACTION)
        answer_only = dataclasses.replace(self.sampling, stop=("</answer>",))
        with_search = dataclasses.replace(self.sampling, stop=("</search>", "</answer>"))
        state = None  # the latest generation's continuation state, if the policy has one
        for turn in range(self.max_turns + 1):
            active = [r for r in rows if not r.done]
            budget = [self.max_response_tokens - len(r.tokens) for r in active]
            for r, b in zip(active, budget):
                if b <= 0:
                    r.done, r.finish = True, "length"
            active = [r for r, b in zip(active, budget) if b > 0]
            if not active:
                break
            final = turn == self.max_turns
            sampling = answer_only if final else with_search
            limits = [self.max_response_tokens - len(r.tokens) for r in active]
            if state is not None and hasattr(policy, "continue_from"):
                gen = policy.continue_from(state, [r.slot for r in active],
                                           [r.unread for r in active], sampling,
                                           seed=seed * 1000 + turn, max_new_per_row=limits)
            else:
                gen = policy.generate([r.prompt_tokens + r.tokens for r in active], sampling,
                                      seed=seed * 1000 + turn, max_new_per_row=limits)
            state = getattr(gen, "state", None)
            searching: list[tuple[_Row, str]] = []
            for i, r in enumerate(active):
                r.slot, r.unread = i, []
                n = int(gen.lengths[i])
                r.add(gen.tokens[i, :n].tolist(), True, gen.logprobs[i, :n].tolist())
                r.turns += 1
                kind, content = parse_action(gen.texts[i])
                if kind == "answer":
                    r.done, r.finish = True, "answer"
                elif kind == "search" and not final:
                    r.searches += 1
                    searching.append((r, content))
                elif gen.finish[i] == "eos" or final:
                    r.done, r.finish = True, gen.finish[i]
                else:
                    r.invalid += 1
                    r.add(invalid_ids, action=False)
            self._observe([r for r, _ in searching], [q for _, q in searching])
        texts = self.tokenizer.decode_batch([r.tokens for r in rows])
        groups = []
        for i, prompt in enumerate(prompts):
            trajs = tuple(
                Trajectory(prompt_tokens=tuple(r.prompt_tokens), tokens=tuple(r.tokens),
                           loss_mask=tuple(r.mask), logprobs=tuple(r.logprobs), text=text,
                           finish=r.finish, info={"turns": r.turns, "searches": r.searches,
                                                  "invalid_actions": r.invalid})
                for r, text in zip(rows[i * group_size:(i + 1) * group_size],
                                   texts[i * group_size:(i + 1) * group_size]))
            groups.append(Group(prompt, trajs))
        return groups
