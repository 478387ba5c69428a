"""Oracle demonstrations of the search protocol, for a supervised format warm-up (``rl.sft``).

A small policy (SmolLM2-135M) almost never writes a well-formed Search-R1 trajectory on its own,
so every group is all-wrong and RL has nothing to learn from. These demonstrations show the
protocol on the shipped world: one ``<search>`` per supporting document (its title, i.e. the
entity the hop is about, in the order the question's legs read them), then the gold answer.
They are produced by running the real :class:`~rl.tasks.search.env.SearchEnv` with a scripted
policy, so prompts, observations (what the retriever actually returned), masks and truncation are
exactly what RL sees; only the policy's own turns are scripted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from core.types import Group, Prompt
from models.sampler import Generation, SamplingParams
from models.tokenizer import Tokenizer
from rl.tasks.search.corpus import parse_contents
from rl.tasks.search.tool_call import TOOL_NAME


def search_turn(query: str) -> str:
    return f"<think> I need information about {query}. </think>\n<search> {query} </search>"


def answer_turn(answer: str) -> str:
    return (f"<think> The information above answers the question. </think>\n"
            f"<answer> {answer} </answer>")


def tool_search_turn(query: str) -> str:
    """A search in the tool-call protocol, the call written as Qwen3's template renders one."""
    call = json.dumps({"name": TOOL_NAME, "arguments": {"query": query}}, ensure_ascii=False)
    return f"I need information about {query}.\n<tool_call>\n{call}\n</tool_call>"


def tool_answer_turn(answer: str) -> str:
    return f"The information above answers the question.\n<answer> {answer} </answer>"


def oracle_turns(prompt: Prompt, titles: Mapping[str, str], max_turns: int,
                 protocol: str = "search_r1") -> list[str]:
    """The scripted turns for one question: a search per supporting document (at most
    ``max_turns``), then the answer. Needs ``supporting_docs`` (corpus document ids) in the
    prompt's meta: the shipped world records them; the real-dataset loaders do not (HotpotQA
    and 2Wiki keep ``supporting_facts``, titles and sentence numbers)."""
    docs = list((prompt.meta or {}).get("supporting_docs") or [])
    if not docs:
        raise ValueError(f"prompt {prompt.id}: no supporting_docs in its meta; oracle "
                         f"demonstrations need them")
    missing = [d for d in docs if d not in titles]
    if missing:
        raise ValueError(f"prompt {prompt.id}: supporting docs {missing} are not in the corpus")
    queries = list(dict.fromkeys(titles[d] for d in docs))[:max_turns]
    search, answer = ((tool_search_turn, tool_answer_turn) if protocol == "tool_call"
                      else (search_turn, answer_turn))
    return [*(search(q) for q in queries), answer(prompt.answer[0])]


def corpus_titles(path: str | Path) -> dict[str, str]:
    """doc id -> title of a wiki-18 style jsonl corpus."""
    out = {}
    with open(path) as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                out[str(row["id"])] = parse_contents(row["contents"])[0]
    return out


class ScriptedTurnsPolicy:
    """Replays fixed turns per trajectory. A row is recognised by its prompt (the context the
    environment sends starts with it), and each call serves that row's next turn, cut right
    after the first stop string as the sampler would. With ``eos_id`` each turn ends with that
    token (a message in the tool-call protocol), finishing with "eos"."""

    def __init__(self, tokenizer: Tokenizer, scripts: Mapping[tuple[int, ...], Sequence[str]],
                 eos_id: int | None = None):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self._lengths = sorted({len(k) for k in scripts})
        self._served: dict[tuple[int, ...], int] = {}

    def _row(self, context: Sequence[int]) -> tuple[int, ...]:
        for n in self._lengths:
            key = tuple(context[:n])
            if key in self.scripts:
                return key
        raise KeyError("context does not start with any scripted prompt")

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int,
                 max_new_per_row: Sequence[int] | None = None) -> Generation:
        outs, finish = [], []
        for i, ctx in enumerate(prompts):
            key = self._row(ctx)
            turn = self._served.get(key, 0)
            self._served[key] = turn + 1
            script = self.scripts[key]
            text = script[min(turn, len(script) - 1)]
            reason = "length"
            for s in sampling.stop:
                if s in text:
                    text, reason = text[: text.index(s) + len(s)], "stop"
            ids = self.tokenizer.encode(text)
            if self.eos_id is not None:
                ids, reason = [*ids, self.eos_id], "eos"
            limit = sampling.max_new_tokens if max_new_per_row is None else min(
                sampling.max_new_tokens, max_new_per_row[i])
            if len(ids) > limit:
                ids, reason = ids[:limit], "length"
            outs.append(ids)
            finish.append(reason)
        n = max(1, max(len(o) for o in outs))
        tokens = np.full((len(outs), n), self.tokenizer.pad_id, np.int32)
        for i, o in enumerate(outs):
            tokens[i, :len(o)] = o
        return Generation(tokens=tokens, logprobs=np.zeros((len(outs), n), np.float32),
                          lengths=np.asarray([len(o) for o in outs]), finish=tuple(finish),
                          texts=tuple(self.tokenizer.decode_batch(outs)))


def oracle_demonstrations(env, prompts: Sequence[Prompt], titles: Mapping[str, str],
                          protocol: str = "search_r1") -> list[Group]:
    """One scripted trajectory per prompt through ``env`` (a SearchEnv, or a
    ToolCallSearchEnv with ``protocol="tool_call"``): groups of size 1."""
    encoded = [tuple(env.encode_prompt(p)) for p in prompts]
    if len(set(encoded)) != len(encoded):
        raise ValueError("oracle demonstrations need distinct prompts")
    scripts = {e: oracle_turns(p, titles, env.max_turns, protocol)
               for e, p in zip(encoded, prompts)}
    eos_id = (env.tokenizer.backend.token_to_id(env.template.eos_text)
              if protocol == "tool_call" else None)
    return env.rollout(ScriptedTurnsPolicy(env.tokenizer, scripts, eos_id), prompts, 1, seed=0)
