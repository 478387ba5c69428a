"""ARBOR through the trainer seams: hydra configs, the ``arbor`` / ``static_rubrics`` rewarders on
hand-written Search-R1 trajectories, and end-to-end runs on the tiny model (metrics, the memory
event log, and an exact resume of the rubric memory).

A random tiny model almost never writes a valid Search-R1 trajectory, so its groups are all
invalid and the memory stays empty. The resume test therefore also runs the trainer on a
"scripted" search task whose environment writes hand-made trajectories (good searcher, lazy
guesser, question copier, broken format) for the real world questions: the model still trains
on them, and the memory fills up, consolidates and is activated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.types import Group, Prompt, Trajectory
from judges import RuleJudge
from judges.search_features import question_entities
from memory.events import REJECT_REASONS, event_from_dict
from memory.state import RubricMemory
from rl.rewarders.arbor import ArborRewarder
from rl.rewarders.static_rubrics import StaticRubricRewarder
from rl.run.wiring import TASKS, make_rewarder
from rl.tasks.search.task import SearchQATask
from tests.paths import CONF

CONF = str(CONF)

# --- hand-written Search-R1 trajectories -------------------------------------------------------

WRONG = "zzyzx"  # shares no token with any gold: F1 = 0
#: Group recipes: member kinds, in order (permuted per group).
RECIPES = {
    "mixed": ("good", "lazy", "copy", "invalid"),        # R_base = 1, 0, 0, -1
    "all_wrong": ("good_wrong", "lazy", "good_wrong", "copy"),  # homogeneous at 0
    "all_invalid": ("invalid",) * 4,                     # homogeneous at -1
    "all_good": ("good",) * 4,                           # homogeneous at 1
}


def _entity_query(question: str) -> str:
    ents = question_entities(question)
    return " ".join(ents[0]) if ents else question


def scripted_text(kind: str, question: str, gold: str) -> str:
    """One trajectory response of a given behaviour (see ``RECIPES``)."""
    q = _entity_query(question)
    think = "<think>I need to find this out.</think>"
    if kind in ("good", "good_wrong"):
        # good_wrong: a grounded answer from the wrong hop's document (wrong, but a good process)
        answer = gold if kind == "good" else WRONG
        fact = f"the record names {answer}"
        return (f"{think}<search>{q}</search>\n\n<information>Doc 1(Title: {q.title()}) "
                f"{q.title()}: {fact}.</information>\n\n<think>The document answers it."
                f"</think><answer>{answer}</answer>")
    if kind == "lazy":
        return f"{think}<answer>{WRONG}</answer>"
    if kind == "copy":
        return (f"{think}<search>{question}</search>\n\n<information>Doc 1(Title: Elsewhere) "
                f"Nothing relevant here.</information>\n\n<think>Guess.</think>"
                f"<answer>{WRONG}</answer>")
    if kind == "invalid":
        return f"{think}<answer>{WRONG}"
    raise ValueError(kind)


def _seed_of(*parts: object) -> int:
    return int(hashlib.sha1(repr(parts).encode()).hexdigest()[:8], 16)


def scripted_texts(prompt: Prompt, recipe: str, group_size: int, seed: int) -> list[str]:
    kinds = [RECIPES[recipe][i % 4] for i in range(group_size)]
    order = np.random.default_rng(_seed_of(seed, prompt.id)).permutation(group_size)
    gold = str(prompt.answer[0])
    return [scripted_text(kinds[int(k)], prompt.question, gold) for k in order]


def scripted_groups(prompts: Sequence[Prompt], recipes: Sequence[str], seed: int = 0,
                    group_size: int = 4, tokenizer=None) -> list[Group]:
    """Groups of hand-written trajectories (token ids only if a tokenizer is given)."""
    groups = []
    for p, recipe in zip(prompts, recipes):
        prompt_ids = tuple(tokenizer.encode_chat(list(p.messages))) if tokenizer else (0,)
        trajs = []
        for text in scripted_texts(p, recipe, group_size, seed):
            ids = tuple(tokenizer.encode(text)) if tokenizer else (0,) * 4
            trajs.append(Trajectory(prompt_tokens=prompt_ids, tokens=ids,
                                    loss_mask=(1,) * len(ids), logprobs=(0.0,) * len(ids),
                                    text=text, finish="answer"))
        groups.append(Group(p, tuple(trajs)))
    return groups


QUESTIONS = [
    ("Who directed the film Rogral Rising?", "Maela Dorn"),
    ("Where was Terkyn Belpoul born?", "Vasko City"),
    ("What is the occupation of the spouse of Ilsa Marrow?", "novelist"),
    ("Which band did Oren Quill join?", "The Leirtvoumvund Tides"),
    ("In which year was Pellam Harbor founded?", "1843"),
    ("Who founded the company Brasklin Works?", "Tovin Esk"),
]


def hand_prompts() -> list[Prompt]:
    return [Prompt(id=f"q{i}", messages=({"role": "user", "content": q},), answer=(a,),
                   meta={"question": q}) for i, (q, a) in enumerate(QUESTIONS)]


# --- a scripted search task for the trainer ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScriptedSearchEnv:
    """Writes hand-made trajectories instead of sampling: batch position 0 gets a "mixed" group,
    the others cycle through the recipes with the rollout seed."""

    tokenizer: object

    def rollout(self, policy, prompts, group_size, seed):
        names = list(RECIPES)
        recipes = ["mixed" if i == 0 else names[(seed + i) % len(names)]
                   for i in range(len(prompts))]
        return scripted_groups(prompts, recipes, seed, group_size, self.tokenizer)


@dataclasses.dataclass(frozen=True)
class ScriptedSearchQATask(SearchQATask):
    name: str = "search_qa_scripted"

    def make_env(self, tokenizer, sampling):
        return ScriptedSearchEnv(tokenizer)


if "search_qa_scripted" not in TASKS:
    TASKS.register("search_qa_scripted")(ScriptedSearchQATask)


# --- configs -----------------------------------------------------------------------------------


def compose_cfg(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("search_world")


def tiny_overrides(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return ["model=tiny", "task=search_qa", "judge=rule", "algo=arbor",
            "algo.embedder=hashing", "task.n_entities=200", "task.n_train=40", "task.n_dev=4",
            "task.n_test=4", f"task.cache_dir={cache}", "task.max_turns=1",
            "task.max_response_tokens=64", "task.max_obs_tokens=40", "trainer.batch_prompts=2",
            "algo.group_size=4", "trainer.max_new_tokens=16", "trainer.eval_at_ends=false",
            "trainer.progress=false", "trainer.loggers=[]", "trainer.sample_every=1",
            f"trainer.run_dir={run_dir}", *extra]


def test_algo_configs_expose_top_level_keys():
    cfg = compose_cfg("algo=arbor", "algo.rubric_lambda=0.2", "algo.k_consol=4",
                      "algo.delta_v=0.02", "algo.rho_min=0.1", "algo.retire_k=3",
                      "trainer.seed=7", "trainer.run_dir=x")
    a = cfg["algo"]
    assert (a["name"], a["rewarder"], a["eps_high"]) == ("arbor", "arbor", 0.2)
    assert a["rewarder_options"] == {"rubric_lambda": 0.2, "k_consol": 4, "delta_v": 0.02,
                                     "rho_min": 0.1, "retire_k": 3, "use_common_pool": True,
                                     "embedder": "minilm", "seed": 7, "rubric_outcome": "f1",
                                     "rho_r": "cumulative", "min_drift_activations": 1,
                                     "active_combine": "sum", "rubric_gate": "none",
                                     "correct_at": 1.0, "lineage_in_induction": False,
                                     "lineage_k": 3}
    # the version-1 behaviour, one override each
    old = compose_cfg("algo=arbor", "algo.rubric_outcome=r_base", "algo.rho_r=centred",
                      "algo.min_drift_activations=5", "algo.active_combine=mean",
                      "trainer.run_dir=x")["algo"]["rewarder_options"]
    cfg = make_rewarder("arbor", SearchQATask(), old, RuleJudge()).cfg
    assert (cfg.rubric_outcome, cfg.rho_r, cfg.min_drift_activations, cfg.active_combine) == (
        "r_base", "centred", 5, "mean")
    nm = compose_cfg("algo=arbor_no_memory", "trainer.run_dir=x")["algo"]
    assert nm["name"] == "arbor_no_memory" and nm["rewarder_options"]["use_common_pool"] is False
    dapo = compose_cfg("algo=arbor_dapo", "algo.rubric_lambda=0.05", "trainer.run_dir=x")["algo"]
    assert (dapo["rewarder"], dapo["eps_high"], dapo["dynamic_sampling"], dapo["loss_agg"]) == (
        "arbor", 0.28, True, "token-mean")
    assert dapo["rewarder_options"]["rubric_lambda"] == 0.05
    assert {k: dapo["rewarder_options"][k] for k in a["rewarder_options"]} == {
        **a["rewarder_options"], "rubric_lambda": 0.05, "k_consol": 8, "delta_v": 0.01,
        "rho_min": 0.2, "retire_k": 5, "seed": 0}
    rar = compose_cfg("algo=rar", "trainer.run_dir=x")["algo"]
    assert rar["rewarder"] == "static_rubrics"
    assert rar["rewarder_options"] == {"rubric_lambda": 0.1,
                                       "rubrics_path": "conf/rubrics/rar_search.jsonl",
                                       "rubric_gate": "none", "correct_at": 1.0,
                                       "aggregator": "additive_abs"}


def test_rewarders_need_a_judge_and_known_options():
    task = SearchQATask()
    with pytest.raises(ValueError, match="algo=arbor needs a judge: judge=rule"):
        make_rewarder("arbor", task, {}, None)
    with pytest.raises(ValueError, match="needs a judge"):
        make_rewarder("static_rubrics", task, {}, None)
    with pytest.raises(ValueError, match="unknown MemoryConfig keys"):
        make_rewarder("arbor", task, {"rubric_lamda": 0.1}, RuleJudge())
    # names are checked against their registries when the rewarder is built (start-up)
    for key, typo in (("embedder", "nope"), ("graph", "ring_diam"),
                      ("tie_break", "fromat_then_length")):
        with pytest.raises(ValueError, match=rf"MemoryConfig\.{key} must be one of .*{typo}"):
            make_rewarder("arbor", task, {key: typo}, RuleJudge())


# --- the rewarder on hand-written trajectories ------------------------------------------------


def _run_rewarder(rewarder, batches, state=None):
    state = rewarder.init_state() if state is None else state
    outs = []
    for step, groups in enumerate(batches):
        out = rewarder(groups, state, step)
        state = out.state
        outs.append(out)
    return state, outs


def _batches():
    ps = hand_prompts()
    recipes = [("mixed", "mixed"), ("all_wrong", "mixed"), ("mixed", "all_wrong"),
               ("all_wrong", "all_invalid")]
    return [scripted_groups([ps[(2 * s) % 6], ps[(2 * s + 1) % 6]], r, seed=s)
            for s, r in enumerate(recipes)]


def test_arbor_rewarder_admits_consolidates_and_converts():
    task = SearchQATask()
    options = {"k_consol": 4, "embedder": "hashing", "seed": 3, "retire_k": 2}
    rewarder = make_rewarder("arbor", task, options, RuleJudge(seed=0))
    assert isinstance(rewarder, ArborRewarder) and rewarder.cfg.embedder == "hash"
    batches = _batches()
    mem, outs = _run_rewarder(rewarder, batches)

    # Outcome = the task's R_base (F1 if valid else -1), per group member.
    for groups, out in zip(batches, outs):
        want = [[task.outcome(g.prompt, t) for t in g.trajectories] for g in groups]
        np.testing.assert_array_equal(out.outcome, want)
        assert out.rewards.shape == out.outcome.shape == (2, 4)
        assert len(out.per_traj) == 2 and len(out.per_traj[0]) == 4
    np.testing.assert_array_equal(sorted(outs[0].outcome[0]), [-1, 0, 0, 1])
    # Step 0 (empty memory): no rubric term; two mixed groups admit drafts and consolidate.
    np.testing.assert_array_equal(outs[0].rewards, outs[0].outcome)
    kinds0 = [e["kind"] for e in outs[0].events]
    assert "admitted" in kinds0 and "consolidated" in kinds0
    m0 = outs[0].metrics
    assert m0["memory/admitted"] >= 4 and m0["memory/commons"] >= 1
    assert m0["memory/judge_calls"] > 0
    # Later steps activate common rubrics and convert the all-wrong (homogeneous) group.
    kinds = [e["kind"] for out in outs[1:] for e in out.events]
    assert "activated" in kinds
    assert outs[1].metrics["memory/active"] >= 1
    assert outs[1].metrics["memory/converted_frac"] > 0
    assert np.std(outs[1].rewards[0]) > 0 and np.std(outs[1].outcome[0]) == 0
    assert any(abs(x["rubric_score"]) > 0 for x in outs[1].per_traj[0])
    for out in outs:
        for key in ("memory/drafts", "memory/commons", "memory/judge_calls",
                    "memory/homogeneous_frac_before", "memory/converted_frac",
                    *(f"memory/rejected_{r}" for r in REJECT_REASONS)):
            assert key in out.metrics
        for e in out.events:  # events are JSON-able and read back
            assert event_from_dict(json.loads(json.dumps(e))).to_dict() == e
    # Checkpoint form: exact JSON round trip; the same inputs give the same memory.
    data = json.loads(json.dumps(rewarder.state_to_json(mem)))
    assert rewarder.state_from_json(data) == mem
    assert rewarder.state_from_json(None) == RubricMemory()
    again, _ = _run_rewarder(make_rewarder("arbor", task, options, RuleJudge(seed=0)), batches)
    assert again == mem


def test_no_memory_and_static_rubric_rewarders_from_configs():
    task = SearchQATask()
    batches = _batches()
    opts = compose_cfg("algo=arbor_no_memory", "algo.embedder=hashing",
                       "trainer.run_dir=x")["algo"]["rewarder_options"]
    nm = make_rewarder("arbor", task, opts, RuleJudge())
    mem, outs = _run_rewarder(nm, batches[:2])
    assert mem.drafts == () and mem.commons == ()
    # "w/o memory": a mixed group is scored by its own admitted drafts at once (step 0).
    assert outs[0].metrics["memory/admitted"] > 0 and outs[0].metrics["memory/active"] == 0
    assert not np.array_equal(outs[0].rewards, outs[0].outcome)
    assert all(e["kind"] != "consolidated" for o in outs for e in o.events)

    opts = compose_cfg("algo=rar", "trainer.run_dir=x")["algo"]["rewarder_options"]
    rar = make_rewarder("static_rubrics", task, opts, RuleJudge())
    assert isinstance(rar, StaticRubricRewarder) and len(rar.rubrics) >= 5
    state, outs = _run_rewarder(rar, batches[:2])
    assert state is None and outs[0].events == ()
    m = outs[0].metrics
    # every shipped rubric is readable by the rule judge: no fallbacks
    assert m["static/check_fallbacks"] == 0 and m["static/judge_calls_check"] == 2 * 4 * len(
        rar.rubrics)
    # the all-wrong group (step 1, group 0) is converted by the static rubrics
    assert outs[1].metrics["static/converted_frac"] == 1.0
    assert rar.state_to_json(None) is None and rar.state_from_json(None) is None


# --- end to end on the tiny model ---------------------------------------------------------------


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


MEMORY_KEYS = ("memory/drafts", "memory/commons", "memory/admitted", "memory/rejected",
               *(f"memory/rejected_{r}" for r in REJECT_REASONS), "memory/judge_calls",
               "memory/consolidations", "groups/homogeneous_frac", "groups/all_wrong_frac",
               "groups/converted_frac", "memory/converted_frac")


def test_arbor_trains_on_tiny_model_with_search_env(tmp_path, world_dir):
    from rl.run.trainer import build_trainer

    cfg = compose_cfg(*tiny_overrides(tmp_path / "run", world_dir, "trainer.max_steps=2",
                                      "trainer.save_every=0"))
    trainer = build_trainer(cfg)
    assert isinstance(trainer.parts.rewarder, ArborRewarder)
    history = trainer.run()
    trainer.close()
    assert [h["step"] for h in history] == [0, 1]
    recs = _records(tmp_path / "run" / "metrics.jsonl")
    for key in MEMORY_KEYS:
        assert key in recs[-1], key
    # retrieval counters reach the step metrics (cumulative, like judge/*); local BM25 fails never
    for key in ("calls", "searches", "failed_calls", "degraded", "requests", "timeouts",
                "breaker_opens"):
        assert f"retrieval/{key}" in recs[-1], key
    assert recs[-1]["retrieval/degraded"] == 0
    assert recs[-1]["retrieval/searches"] >= recs[0]["retrieval/searches"]
    # a step's own judge requests: the difference of the cumulative counters (judges.cost)
    def requests(r):
        return sum(v for k, v in r.items() if k.startswith("judge/requests_"))

    assert recs[1]["judge_step/requests"] == requests(recs[1]) - requests(recs[0])
    # the gaming monitors run wherever the rubric term is defined (rewards.gaming)
    for r in recs:
        for key in ("gaming/copied_titles",):
            assert key in r and r[key] >= 0, key
    # the agent's behaviour per step, as Search-R1 logs it (core.search_r1.agent_metrics)
    for r in recs:
        assert 1 <= r["agent/turns"] and 0 <= r["agent/searches"] <= r["agent/turns"]
        for key in ("valid_action_ratio", "finish_ratio", "format_valid"):
            assert 0 <= r[f"agent/{key}"] <= 1, key
    # Random weights: (almost) every trajectory is invalid, R = -1, memory stays consistent.
    assert recs[-1]["memory/drafts"] == len(trainer.reward_state.drafts)
    assert recs[-1]["memory/commons"] == len(trainer.reward_state.commons)


def test_arbor_run_logs_events_and_resumes_memory_exactly(tmp_path, world_dir):
    from rl.run.checkpoint import Checkpointer
    from rl.run.trainer import build_trainer

    over = tiny_overrides(tmp_path / "run", world_dir, "task.name=search_qa_scripted",
                          "algo.k_consol=4", "trainer.max_steps=3", "trainer.save_every=1")
    first = build_trainer(compose_cfg(*over))
    first.run(until=2)  # "interrupted" after the checkpoint at step 2
    saved = first.reward_state.to_dict()
    first.close()
    assert saved["commons"], "the scripted run should have consolidated a common rubric"

    ck = Checkpointer(tmp_path / "run" / "checkpoints")
    assert ck.latest_step() == 2 and ck.read_meta(2)["reward_state"] == saved
    ck.close()
    resumed = build_trainer(compose_cfg(*over, "trainer.resume=true"))
    assert resumed.start_step == 2
    assert resumed.reward_state.to_dict() == saved
    assert resumed.reward_state == RubricMemory.from_dict(saved)
    resumed.run()
    final = resumed.reward_state
    resumed.close()

    run = tmp_path / "run"
    recs = [r for r in _records(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in recs] == [0, 1, 2]
    for key in MEMORY_KEYS:
        assert key in recs[0], key
    assert recs[0]["memory/admitted"] > 0 and recs[-1]["memory/commons"] >= 1
    assert recs[-1]["memory/commons"] == len(final.commons)
    events = _records(run / "memory_events.jsonl")
    kinds = {e["kind"] for e in events}
    assert {"admitted", "consolidated", "activated"} <= kinds
    assert sorted({e["step"] for e in events}) == [0, 1, 2]  # resume replaced step >= 2
    for e in events:  # each line reads back as a memory event
        assert event_from_dict(e).to_dict() == e
    # the rubric term reached the samples: some logged reward differs from its outcome
    samples = _records(run / "samples.jsonl")
    assert any(s["reward"] != s["outcome"] for s in samples)
