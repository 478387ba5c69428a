"""Every rollout path gives the same greedy tokens on a paged KV cache (models.paged_cache)
as on the dense one: single-turn groups, search rollouts in chunks with observations read in
place (also with a group's rows sharing their prompt's pages), tool-call rollouts, and
evaluation's greedy rollouts. The reference is the same
environment on ``decode_kernel="xla"``; greedy tokens are compared exactly, log-probs to float
rounding (the paged reference gathers pages where the dense cache slices)."""

import dataclasses
import logging
import re

import jax
import numpy as np
import pytest

from core.search_r1 import search_prompt
from core.types import Prompt
from models import load_params
from models.paged_cache import PAGE_SLOTS
from models.sampler import SamplingParams
from rl.run.evaluation import greedy_rollouts
from rl.tasks.envs import SamplerPolicy, SingleTurnEnv
from rl.tasks.search.env import SearchEnv
from rl.tasks.search.tool_call import tool_prompt
from rl.tasks.search.tool_env import ToolCallSearchEnv
from tests.paths import CONF

from .search.test_rollout_programs import SamplerDriven
from .search.test_search_env import FixedRetriever
from .search.test_tool_call import SCRIPTS as TOOL_SCRIPTS

KERNELS = ("xla", "paged_xla")


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=5)


def _same(dense, paged):
    for gd, gp in zip(dense, paged, strict=True):
        assert len(gd.trajectories) == len(gp.trajectories)
        for a, b in zip(gd.trajectories, gp.trajectories):
            assert a.prompt_tokens == b.prompt_tokens
            assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
            assert a.finish == b.finish and a.info == b.info
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _questions(n):
    return [Prompt(id=f"p{i}", messages=({"role": "user", "content": search_prompt(q)},))
            for i, q in enumerate(["who?", "where is the big old tower of the city?",
                                   "when did the river first flood the valley town?"][:n])]


def test_single_turn_groups(tiny):
    cfg, params, tok = tiny
    env = SingleTurnEnv(tok, SamplingParams(20, temperature=0))
    prompts = [Prompt(id=f"q{i}", messages=({"role": "user", "content": "word " * (3 + 7 * i)},))
               for i in range(3)]
    dense, paged = (env.rollout(SamplerPolicy(cfg, params, tok, decode_kernel=k), prompts,
                                group_size=3, seed=0) for k in KERNELS)
    _same(dense, paged)


def test_search_rollouts_in_chunks_and_evaluation(tiny, caplog):
    """The random model's turns are invalid actions, each answered by an observation (read in
    place) and another turn: two turns a row, rows of different lengths (their prompts'),
    decoded in chunks of 5 tokens through sub-batches. On shared prompt pages (whole-batch
    chunks reading a group's prompt once, sub-batches through their tables) a second
    rollout of the same shapes compiles nothing."""
    cfg, params, tok = tiny
    env = SearchEnv(tok, SamplingParams(12, temperature=0), FixedRetriever(), topk=1,
                    max_turns=2, max_response_tokens=120, chunk_tokens=5)
    prompts = _questions(3)
    runs = {k: (env.rollout(SamplerPolicy(cfg, params, tok, decode_kernel=k), prompts,
                            group_size=2, seed=3),
                greedy_rollouts(env, SamplerPolicy(cfg, params, tok, decode_kernel=k),
                                prompts, batch_size=3))
            for k in KERNELS}
    for dense, paged in zip(runs["xla"], runs["paged_xla"]):
        _same(dense, paged)
    assert all(t.info["turns"] == 2 for g in runs["xla"][0] for t in g.trajectories)
    # each group's rows sharing their prompt's full pages (the prompts' instructions fill
    # several) through both turns
    sharing = SamplerPolicy(cfg, params, tok, decode_kernel="paged_xla", shared_prompts=True)
    _same(runs["xla"][0], env.rollout(sharing, prompts, group_size=2, seed=3))
    assert min(len(env.encode_prompt(p)) for p in prompts) > 2 * PAGE_SLOTS
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        caplog.clear()
        env.rollout(sharing, prompts, group_size=2, seed=4)
    assert "Compiling" not in caplog.text, re.findall(r"Compiling (\S+)", caplog.text)


class Recording(SamplerDriven):
    """SamplerDriven (scripted turns, the real sampler decoding the same number of tokens and
    reading the environment's observations) keeping the real sampler's tokens of each call."""

    def __init__(self, tok, scripts, sampler):
        super().__init__(tok, scripts, sampler)
        self.sampled: list[tuple[list[list[int]], list[list[float]]]] = []
        self.sampler = _Keep(sampler, self.sampled)


@dataclasses.dataclass
class _Keep:
    policy: SamplerPolicy
    sampled: list

    def _kept(self, gen):
        n = gen.lengths
        self.sampled.append(([gen.tokens[i, :k].tolist() for i, k in enumerate(n)],
                             [gen.logprobs[i, :k].tolist() for i, k in enumerate(n)]))
        return gen

    def generate(self, *args, **kw):
        return self._kept(self.policy.generate(*args, **kw))

    def continue_from(self, *args, **kw):
        return self._kept(self.policy.continue_from(*args, **kw))


def test_tool_call_rollouts_read_the_same_observations(tiny):
    """Scripted tool-call messages (a search, two calls in one message, bad calls, an answer)
    drive the environment; the real sampler decodes as many tokens each turn and reads each
    tool response into its cache. Its tokens agree call by call."""
    cfg, params, tok = tiny
    tok = tok.with_chat_template((CONF / "chat_templates" / "chatml_tools.jinja").read_text())
    env = ToolCallSearchEnv(tok, SamplingParams(64, temperature=0), FixedRetriever(), topk=2,
                            max_turns=3, max_response_tokens=400, max_obs_tokens=40,
                            chunk_tokens=7)
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": tool_prompt(f"q{i}?")},))
               for i in range(len(TOOL_SCRIPTS))]
    encoded = [env.encode_prompt(p) for p in prompts]
    scripts = [[f"{text}[EOS]" for text in turns] for turns in TOOL_SCRIPTS]
    sampled = {}
    for k in KERNELS:
        policy = Recording(tok, scripts, SamplerPolicy(cfg, params, tok, decode_kernel=k))
        policy.prompt_len = min(len(e) for e in encoded)
        policy.row_by_prompt = {tuple(e[:policy.prompt_len]): i for i, e in enumerate(encoded)}
        groups = env.rollout(policy, prompts, group_size=1, seed=0)
        assert [g.trajectories[0].info["searches"] for g in groups] == [1, 2, 0, 0]
        sampled[k] = policy.sampled
    assert len(sampled["xla"]) == len(sampled["paged_xla"]) > 3
    for (tokens_d, logp_d), (tokens_p, logp_p) in zip(sampled["xla"], sampled["paged_xla"]):
        assert tokens_d == tokens_p
        for a, b in zip(logp_d, logp_p):
            np.testing.assert_allclose(a, b, atol=1e-5)
