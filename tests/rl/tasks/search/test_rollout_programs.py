"""A multi-turn rollout compiles its programs in its first step only (models.continuation).

Rows that search a varying number of times (scripted) are served through the real jitted
sampler: every call runs it on the environment's rows with each row's scripted token count as
its budget, so the KV cache fills as the trajectories do, chunk by chunk, observations read
in place. Six steps, with new prompts and new scripts each step, as in training.
"""

import dataclasses
import logging
import re

import jax
import pytest

from core.search_r1 import search_prompt
from core.types import Prompt
from models import load_params
from models.continuation import row_buckets
from models.sampler import SamplingParams
from rl.tasks.envs import SamplerPolicy
from rl.tasks.search.env import SearchEnv

from .test_search_env import ChunkedScriptedPolicy, FixedRetriever

ROWS = 8
# per row, turn by turn: 0 to 3 searches, an invalid turn, an answer or EOS
TURNS = [
    ["<answer> a </answer>"],
    ["<search> q1 </search>", "<answer> b </answer>"],
    ["hmm", "<search> q2 </search>", "<answer> c </answer>"],
    ["<search> q3 </search>", "<search> q4 </search>", "<search> q5 </search>",
     "<answer> d </answer>"],
    ["I do not know.[EOS]"],
    ["<think>long thought about the question and its parts</think><search> q6 </search>",
     "<answer> e </answer>"],
    ["<search> q7 </search>", "<think>again</think><search> q8 </search>", "<answer> f </answer>"],
    ["<think>x</think><answer> g </answer>"],
]


class SamplerDriven(ChunkedScriptedPolicy):
    """ChunkedScriptedPolicy's turns, each call also run through the real sampler with the
    scripted token counts as budgets; the state carries both (scripted rows, sampler state)."""

    def __init__(self, tok, scripts, sampler):
        super().__init__(tok, scripts)
        self.sampler = sampler

    def generate(self, prompts, sampling, seed, max_new_per_row=None):
        scripted = super().generate(prompts, sampling, seed, max_new_per_row)
        real = self.sampler.generate(prompts, dataclasses.replace(sampling, ignore_eos=True),
                                     seed, list(scripted.lengths))
        return dataclasses.replace(scripted, state=(scripted.state, real.state))

    def continue_from(self, state, continuation, sampling, seed):
        scripted = super().continue_from(state[0], continuation, sampling, seed)
        real = self.sampler.continue_from(
            state[1], dataclasses.replace(continuation, max_new_per_row=list(scripted.lengths)),
            dataclasses.replace(sampling, ignore_eos=True), seed)
        assert list(real.lengths) == list(scripted.lengths)  # the cache holds the script
        return dataclasses.replace(scripted, state=(scripted.state, real.state))


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=1)


@pytest.mark.parametrize("decode_kernel", ["xla", "paged_xla"])
def test_no_program_compiles_after_the_first_step(tiny, caplog, decode_kernel):
    """Also on a paged KV cache (models.paged_cache): its sub-batches are rows of the page
    table, the same programs compile once."""
    cfg, params, tok = tiny
    env = SearchEnv(tok, SamplingParams(24, temperature=1.0), FixedRetriever(), topk=2,
                    max_turns=3, max_response_tokens=240, max_obs_tokens=48, chunk_tokens=6)
    compiled: list[list[str]] = []
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        for step in range(6):
            prompts = [Prompt(id=f"{step}-{i}", messages=({"role": "user", "content":
                       search_prompt(f"question {step} {i}{'?' * (i % 3)}")},))
                       for i in range(ROWS)]
            scripts = [TURNS[(i + step) % ROWS] for i in range(ROWS)]  # rows change scripts
            encoded = [tok.encode_chat(list(p.messages)) for p in prompts]
            policy = SamplerDriven(tok, scripts, SamplerPolicy(cfg, params, tok,
                                                               decode_kernel=decode_kernel))
            policy.prompt_len = max(len(e) for e in encoded)
            policy.row_by_prompt = {tuple(e[:policy.prompt_len]): i
                                    for i, e in enumerate(encoded)}
            caplog.clear()
            groups = env.rollout(policy, prompts, group_size=1, seed=step)
            compiled.append(re.findall(r"Compiling (\S+)", caplog.text))
            searches = [g.trajectories[0].info["searches"] for g in groups]
            assert sorted(searches) == [0, 0, 0, 1, 1, 1, 2, 3]
    assert compiled[1:] == [[]] * 5, compiled
    # the sampler's programs: one fresh generation, one read, and per row bucket one decode
    # (compiled at the first continuation), whatever the rows did
    sampler = [n for n in compiled[0] if re.search("_generate|in_place", n)]
    assert sorted(sampler) == sorted(["jit(_generate)", "jit(read_in_place)"]
                                     + ["jit(decode_in_place)"] * len(row_buckets(ROWS))), \
        compiled[0]


def test_each_decode_bucket_compiles_once_with_the_weights_on_the_device(tiny, caplog):
    """The shipped search run compiled `decode_in_place` twice for a bucket (once at step 0,
    once at step 3, same shapes): with the weights committed to the device, as the trainer
    places them, the first continuation compiled every bucket for a frontier built on the host
    (its row counters uncommitted), then decoded from the read's output (committed), and JAX
    compiles again for another placement. Here: the buckets compiled ahead, rows decoded after
    reading tokens, then fewer rows decoded without: one program per bucket."""
    from models.continuation import Continuation

    cfg, params, tok = tiny
    policy = SamplerPolicy(cfg, jax.device_put(params, jax.devices()[0]), tok)
    sp = SamplingParams(4, temperature=1.0, capacity=32)
    first = policy.generate([tok.encode(f"question {i}") for i in range(ROWS)], sp, 0)
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        policy.continue_from(first.state, Continuation(
            range(ROWS), [[5, 6]] * 4 + [[]] * 4, [4] * ROWS, read_width=2,
            compile_buckets=True), sp, 1)
        policy.continue_from(first.state, Continuation(range(3), [[]] * 3, [4] * 3), sp, 2)
    decodes = re.findall(r"Compiling jit\(decode_in_place\)", caplog.text)
    assert len(decodes) == len(row_buckets(ROWS)), len(decodes)
