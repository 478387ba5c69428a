"""Multi-turn search environment on scripted policies (the environment is under test)."""

import dataclasses

import numpy as np
import pytest

from core.search_r1 import INVALID_ACTION, parse_action, search_prompt
from core.types import Prompt
from models.presets import cached_tokenizer, shipped_gguf_path
from models.sampler import Generation, SamplingParams
from rewards.qa import arbor_base_reward
from rl.tasks.search.corpus import Doc
from rl.tasks.search.env import SearchEnv


@pytest.fixture(scope="module")
def tok():
    return cached_tokenizer(str(shipped_gguf_path()))


class ScriptedPolicy:
    """Emits scripted turns per row; honours stop strings like the real sampler (the tokens up
    to and including the one that completes the first stop string, which may carry more
    characters). A turn ending in "[EOS]" finishes with EOS."""

    def __init__(self, tok, scripts):
        self.tokenizer, self.scripts = tok, scripts
        self.calls: list[list[int]] = []  # which rows each call served
        self._turn: dict[int, int] = {}

    def generate(self, prompts, sampling, seed, max_new_per_row=None):
        rows = []
        outs, finishes = [], []
        for p in prompts:
            row = self._identify(p)
            rows.append(row)
            turn = self._turn.get(row, 0)
            self._turn[row] = turn + 1
            text = self.scripts[row][turn]
            finish = "length"  # a turn without a stop string ran out of budget ...
            if text.endswith("[EOS]"):  # ... unless the script says the policy emitted EOS
                text, finish = text[:-5], "eos"
            ids = self.tokenizer.encode(text)
            ends = [n for n in range(1, len(ids) + 1)
                    if any(s in self.tokenizer.decode(ids[:n]) for s in sampling.stop)]
            if ends:
                ids, finish = ids[:ends[0]], "stop"
            outs.append(ids)
            finishes.append(finish)
        self.calls.append(rows)
        n = max(len(o) for o in outs)
        tokens = np.zeros((len(outs), n), np.int32)
        for i, o in enumerate(outs):
            tokens[i, :len(o)] = o
        return Generation(tokens=tokens, logprobs=np.full((len(outs), n), -0.5, np.float32),
                          lengths=np.asarray([len(o) for o in outs]), finish=tuple(finishes),
                          texts=tuple(self.tokenizer.decode(o) for o in outs))

    def _identify(self, prompt_tokens):
        # rows are told apart by their prompt (one prompt per row in these tests)
        key = tuple(prompt_tokens[: self.prompt_len])
        return self.row_by_prompt[key]


class FixedRetriever:
    def __init__(self):
        self.queries = []

    def retrieve(self, queries, topk=3):
        self.queries += list(queries)
        return [[Doc(id=f"d{i}", title=f"Title {q}", text=f"text about {q}", score=1.0)
                 for i in range(topk)] for q in queries]


def _setup(tok, scripts, max_turns=2):
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user",
                                             "content": search_prompt(f"question {i}?")},))
               for i in range(len(scripts))]
    policy = ScriptedPolicy(tok, scripts)
    encoded = [tok.encode_chat(list(p.messages)) for p in prompts]
    policy.prompt_len = len(encoded[0])
    policy.row_by_prompt = {tuple(e[: policy.prompt_len]): i for i, e in enumerate(encoded)}
    retriever = FixedRetriever()
    env = SearchEnv(tok, SamplingParams(32), retriever, topk=2, max_turns=max_turns)
    return env, policy, prompts, retriever


def test_turn_logic_masks_and_finished_rows(tok):
    scripts = [
        # row 0: search, then answer
        ["<think>need info</think><search> alpha </search> ignored tail",
         "<think>ok</think><answer> Alpha </answer>"],
        # row 1: answers at once
        ["<answer> beta </answer>"],
        # row 2: invalid, then search, then the final (search-disabled) turn
        ["I am not sure", "<search> gamma </search>", "<answer> g </answer>"],
        ["I give up.[EOS]"],  # row 3: EOS without an action: done, not retried
    ]
    env, policy, prompts, retriever = _setup(tok, scripts, max_turns=2)
    groups = env.rollout(policy, prompts, group_size=1, seed=0)
    trajs = [g.trajectories[0] for g in groups]

    assert retriever.queries == ["alpha", "gamma"]
    # finished rows stop costing compute: row 1 is served once, row 0 twice, row 2 three times
    assert policy.calls == [[0, 1, 2, 3], [0, 2], [2]]
    assert [t.finish for t in trajs] == ["answer", "answer", "answer", "eos"]
    assert trajs[0].info == {"turns": 2, "searches": 1, "invalid_actions": 0}
    assert trajs[2].info == {"turns": 3, "searches": 1, "invalid_actions": 1}

    for t in trajs:
        toks, mask = np.asarray(t.tokens), np.asarray(t.loss_mask)
        observed = tok.decode(toks[mask == 0].tolist())
        acted = tok.decode(toks[mask == 1].tolist())
        assert "<information>" not in acted and "Doc 1" not in acted
        assert observed.count("<information>") == t.text.count("<information>")
        assert (np.asarray(t.logprobs)[mask == 0] == 0).all()
    t0 = trajs[0]
    obs = tok.decode(np.asarray(t0.tokens)[np.asarray(t0.loss_mask) == 0].tolist())
    assert obs == ("\n\n<information>Doc 1(Title: Title alpha) text about alpha\n"
                   "Doc 2(Title: Title alpha) text about alpha</information>\n\n")
    assert "ignored tail" not in t0.text  # generation stopped right after </search>
    assert INVALID_ACTION.strip() in trajs[2].text


def test_stop_token_carrying_more_text_keeps_the_format_valid(tok):
    """SmolLM2 has tokens such as `>.`: one can complete `</answer>` and carry a period. The
    trajectory keeps the token but its text ends at `</answer>`, so the answer scores."""
    scripts = [["<search> a </search>. then", "<answer> Paris </answer>. Done"],
               ["I am not sure", "<answer> Lyon </answer>, surely"]]
    env, policy, prompts, _ = _setup(tok, scripts, max_turns=2)
    trajs = [g.trajectories[0] for g in env.rollout(policy, prompts, 1, 0)]
    assert [tok.decode(list(t.tokens[-1:])) for t in trajs] == [">.", ">,"]
    assert [t.text[-len("</answer>"):] for t in trajs] == ["</answer>"] * 2
    assert "</search>." in trajs[0].text  # a search's stop token is context, not cut
    assert [arbor_base_reward(t.text, g) for t, g in zip(trajs, (["Paris"], ["Lyon"]))] == [1, 1]


def test_search_r1_title_rendering_is_an_option(tok):
    env, policy, prompts, _ = _setup(tok, [["<search> a </search>", "<answer> x </answer>"]])
    env = dataclasses.replace(env, quote_titles=True)
    traj = env.rollout(policy, prompts, 1, 0)[0].trajectories[0]
    assert 'Doc 1(Title: "Title a") text about a' in traj.text


def test_final_turn_has_search_disabled(tok):
    scripts = [["<search> a </search>", "<search> b </search>", "<search> c </search>"]]
    env, policy, prompts, retriever = _setup(tok, scripts, max_turns=2)
    traj = env.rollout(policy, prompts, 1, 0)[0].trajectories[0]
    assert retriever.queries == ["a", "b"]  # the third search is not executed
    assert traj.info["turns"] == 3 and traj.info["searches"] == 2


class ChunkedScriptedPolicy(ScriptedPolicy):
    """The same scripts served a few tokens at a time through ``continue_from``, like the real
    sampler's continuation: a row resumes its turn when nothing is appended and starts its next
    scripted turn after an observation; stop strings may complete in a later call."""

    def generate(self, prompts, sampling, seed, max_new_per_row=None):
        self.pending: dict[int, list[int]] = {}
        self.emitted: dict[int, str] = {}
        self.eos: dict[int, bool] = {}
        rows = [self._identify(p) for p in prompts]
        return self._serve(rows, [True] * len(rows), sampling, max_new_per_row)

    def continue_from(self, state, continuation, sampling, seed):
        rows = [state[s] for s in continuation.rows]
        return self._serve(rows, [len(a) > 0 for a in continuation.appended], sampling,
                           continuation.max_new_per_row)

    def _serve(self, rows, new_turn, sampling, limits):
        self.calls.append(rows)
        self.mixed = getattr(self, "mixed", False) or 0 < sum(new_turn) < len(rows)
        outs, finishes = [], []
        for row, start, limit in zip(rows, new_turn, limits):
            if start:
                turn = self._turn.get(row, 0)
                self._turn[row] = turn + 1
                text = self.scripts[row][turn]
                self.eos[row] = text.endswith("[EOS]")
                self.pending[row] = self.tokenizer.encode(text.removesuffix("[EOS]"))
                self.emitted[row] = ""
            out, finish = [], "length"
            while self.pending[row] and len(out) < limit:
                before = self.emitted[row]
                out.append(self.pending[row].pop(0))
                self.emitted[row] = self.tokenizer.decode(
                    self.tokenizer.encode(before) + out[-1:])
                if any(s in self.emitted[row] and s not in before for s in sampling.stop):
                    finish = "stop"
                    break
                if self.eos[row] and not self.pending[row]:
                    finish = "eos"
            outs.append(out)
            finishes.append(finish)
        n = max(1, max(len(o) for o in outs))
        tokens = np.zeros((len(outs), n), np.int32)
        for i, o in enumerate(outs):
            tokens[i, :len(o)] = o
        return Generation(tokens=tokens, logprobs=np.full((len(outs), n), -0.5, np.float32),
                          lengths=np.asarray([len(o) for o in outs]), finish=tuple(finishes),
                          texts=tuple(self.tokenizer.decode(o) for o in outs), state=rows)


def test_chunked_turns_equal_whole_turns(tok):
    # served 3 tokens per call, rows start their next turn while others are mid-turn, and the
    # trajectories are exactly those of whole-turn generation; a final turn that closes a
    # search before its answer is not cut at `</search>`
    scripts = [
        ["<think>need info</think><search> alpha </search> ignored tail",
         "<think>ok</think><answer> Alpha </answer>"],
        ["<answer> beta </answer>"],
        ["I am not sure", "<search> gamma </search>",
         "<search> late </search> then <answer> g </answer> more"],
        ["I give up.[EOS]"],
    ]
    env, whole, prompts, _ = _setup(tok, scripts, max_turns=2)
    ref = [g.trajectories[0] for g in env.rollout(whole, prompts, group_size=1, seed=0)]
    env2, chunked, _, retriever = _setup(tok, scripts, max_turns=2)
    chunked.__class__ = ChunkedScriptedPolicy
    env3 = dataclasses.replace(env2, chunk_tokens=3)
    got = [g.trajectories[0] for g in env3.rollout(chunked, prompts, group_size=1, seed=0)]
    assert chunked.mixed  # some call had rows starting a turn next to rows mid-turn
    assert retriever.queries == ["alpha", "gamma"]
    for a, b in zip(got, ref):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        assert a.finish == b.finish and a.info == b.info
    assert "then <answer> g </answer>" in got[2].text and " more" not in got[2].text


def test_parse_action_and_prompt():
    assert parse_action("x <search> q1 </search> <answer> y </answer>") == ("search", "q1")
    assert parse_action("<answer>\n Paris </answer>") == ("answer", "Paris")
    assert parse_action("<search> unclosed") == (None, "")
    p = search_prompt("Who?")
    assert p.startswith("Answer the given question.") and p.endswith("Question: Who?\n")
    assert "<answer> Beijing </answer>" in p


class _ReprefillPolicy:
    """The real sampler without ``continue_from``: every turn re-sends the whole context."""

    def __init__(self, policy):
        self.tokenizer, self._policy = policy.tokenizer, policy

    def generate(self, *args, **kw):
        return self._policy.generate(*args, **kw)


def test_kv_continuation_equals_reprefilling_each_turn():
    from models import load_params
    from rl.tasks.envs import SamplerPolicy

    cfg, params, tok = load_params("tiny", seed=5)
    policy = SamplerPolicy(cfg, params, tok)
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": search_prompt(q)},))
               for i, q in enumerate(["who?", "where is the big old tower of the city?"])]
    # chunks of 5 tokens for the continuing policy (turns of 12 end mid-chunk), whole turns
    # for the re-prefilling one
    env = SearchEnv(tok, SamplingParams(12, temperature=0), FixedRetriever(), topk=1,
                    max_turns=2, max_response_tokens=120, chunk_tokens=5)
    calls = []
    orig = policy.continue_from
    policy_spy = SamplerPolicy(cfg, params, tok)
    object.__setattr__(policy_spy, "continue_from",
                       lambda *a, **k: calls.append(1) or orig(*a, **k))
    fast = env.rollout(policy_spy, prompts, group_size=2, seed=3)
    slow = env.rollout(_ReprefillPolicy(policy), prompts, group_size=2, seed=3)
    assert calls, "the search env should continue from the KV cache"
    for gf, gs in zip(fast, slow):
        for a, b in zip(gf.trajectories, gs.trajectories):
            assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
            assert a.finish == b.finish and a.info == b.info
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert any(t.info["turns"] > 1 for g in fast for t in g.trajectories)
