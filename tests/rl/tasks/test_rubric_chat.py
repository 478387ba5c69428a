"""task=rubric_chat and the rubric rewarder: determinism, rule-checkable criteria, additive vs
AND-product incentives, one batched judge call per step, and a short training run."""

import json

import numpy as np
import pytest

from core.types import Group, Prompt, Trajectory
from judges.rule import RuleJudge
from judges.rule_language import compile_rule
from rewards.aggregate import AGGREGATORS
from rewards.perturb import name_only
from rewards.rubric import Criterion, Rubric, RubricError
from rewards.rubric_io import load_rubrics
from rewards.rubric_scoring import (
    ScoreItem,
    fitness_criteria,
    prompt_rubric,
    score_items,
)
from rl.rewarders.rubric import RubricRewarder
from rl.run.wiring import make_rewarder, make_task
from rl.tasks.rubric_chat import TOPICS, RubricChatTask, build_rubric, export_rubrics
from tests.paths import CONF, FIXTURES

CONF = str(CONF)
FIXTURE = FIXTURES / "rubrics" / "perturb_refs.jsonl"


def traj(text: str) -> Trajectory:
    return Trajectory(prompt_tokens=(1,), tokens=(2,), loss_mask=(1,), logprobs=(0.0,),
                      text=text, finish="stop")


def topic_of(prompt: Prompt):
    return next(t for t in TOPICS if t.name == prompt.meta["topic"])


def stuffed(prompt: Prompt) -> str:
    """Every expected keyword, no substance: the labels as a bullet list."""
    return "\n".join(f"- {it.label}" for it in topic_of(prompt).items)


def named(prompt: Prompt) -> str:
    """Each item named in a sentence, none explained (every reference sentence cut back)."""
    return " ".join(name_only(it.sentence, 0) for it in topic_of(prompt).items)


def test_prompts_are_deterministic_and_splits_differ():
    task = RubricChatTask(size=24, eval_size=6)
    a, b = task.prompts("train"), task.prompts("train")
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.meta["rubric"] for p in a] == [p.meta["rubric"] for p in b]
    assert [p.messages for p in a] == [p.messages for p in b]
    other = RubricChatTask(size=24, seed=1).prompts("train")
    assert [p.meta["rubric"] for p in other] != [p.meta["rubric"] for p in a]
    dev = task.prompts("dev")
    assert len(dev) == 6 and not {p.id for p in dev} & {p.id for p in a}
    assert {p.meta["rubric"].num_dims for p in a} == {2, 3}
    with pytest.raises(ValueError, match="unknown split"):
        task.prompts("val")
    with pytest.raises(ValueError, match="unknown aggregator"):
        RubricChatTask(aggregator="sum")


def test_make_task_registers_rubric_chat():
    task = make_task({"name": "rubric_chat", "size": 4, "eval_size": 2, "aggregator": "raw_and"})
    assert isinstance(task, RubricChatTask) and task.aggregator == "raw_and"


def test_every_criterion_is_rule_checkable_and_references_are_perfect():
    task = RubricChatTask()
    prompts = []
    for j, t in enumerate(TOPICS):  # one prompt per topic, both dimension counts
        r = build_rubric(f"t{j}", t, t.questions[0], range(6), 2 + j % 2, [4] * 6, [1] * 6, 100)
        prompts.append(Prompt(id=r.prompt_id, messages=({"role": "user", "content": r.prompt},),
                              answer=r.reference_answer, meta={"rubric": r, "topic": t.name}))
    for p in prompts:
        r = p.meta["rubric"]
        texts = [c.text for c in r.criteria] + [d.failure for d in r.dimensions if d.failure]
        texts += [c.text for c in fitness_criteria(r)]
        assert all(compile_rule(x) is not None for x in texts), r.prompt_id
        assert len(fitness_criteria(r)) == 4 and not set(texts[:r.num_criteria]) & {
            c.text for c in fitness_criteria(r)}  # held out: never a training criterion
    judge = RuleJudge()
    for agg in AGGREGATORS.names():
        rep = RubricChatTask(aggregator=agg).evaluate(prompts, [p.answer for p in prompts], judge)
        assert rep.summary["coverage"] == pytest.approx(1.0)
        assert rep.summary["fitness"] == pytest.approx(1.0)
        if agg != "additive_abs":  # |w| normalisation leaves room for the pitfalls
            np.testing.assert_allclose(rep.reward, 1.0, rtol=1e-6)
    assert judge.stats()["fallbacks_check"] == 0
    assert task.outcome(prompts[0], traj(prompts[0].answer)) == pytest.approx(1.0)


def test_additive_pays_for_keywords_the_and_product_does_not():
    task = RubricChatTask(size=16)
    prompts = task.prompts("train")
    judge = RuleJudge()
    for make in (stuffed, named):
        texts = [make(p) for p in prompts]
        add = RubricChatTask(aggregator="additive").evaluate(prompts, texts, judge)
        pro = RubricChatTask(aggregator="prorubric").evaluate(prompts, texts, judge)
        assert add.summary["reward"] > 0.5, make.__name__
        assert np.all(add.reward > pro.reward)
        np.testing.assert_allclose(pro.reward, 0.0)


def test_rewarder_one_batched_check_per_step_and_metrics():
    class Counting(RuleJudge):
        calls = 0

        def check(self, reqs):
            Counting.calls += 1
            return super().check(reqs)

    task = RubricChatTask(size=3)
    prompts = task.prompts("train")
    groups = [Group(p, (traj(p.answer), traj(stuffed(p)), traj(""), traj("As an AI I cannot")))
              for p in prompts]
    rw = make_rewarder("rubric", task, {"aggregator": "prorubric"}, Counting())
    out = rw(groups, rw.init_state(), 0)
    assert Counting.calls == 1
    assert out.rewards.shape == out.outcome.shape == (3, 4) and out.state is None
    np.testing.assert_allclose(out.rewards[:, 0], 1.0)
    np.testing.assert_allclose(out.rewards[:, 1:], 0.0)
    assert np.all(out.outcome[:, 1] > 0.5)  # outcome = coverage g (additive)
    m = out.metrics
    for key in ("rubric/coverage", "rubric/fitness", "rubric/length_words", "rubric/reward",
                "rubric/fail_rate", "judge/requests_check"):
        assert key in m and np.isfinite(m[key]), key
    assert m["rubric/fail_rate"] > 0  # the refusal clause fired on "As an AI I cannot"
    assert len(out.per_traj) == 3 and out.per_traj[0][0]["coverage"] == pytest.approx(1.0)
    assert rw.state_to_json(None) is None and rw.state_from_json(None) is None
    # pass_rate (what `implicit` computed before #18): R = fraction of criteria satisfied
    imp = make_rewarder("rubric", task, {"aggregator": "pass_rate"}, RuleJudge())
    r = imp(groups[:1], None, 0).rewards[0]
    rub = prompts[0].meta["rubric"]
    n_pit = sum(c.weight < 0 for c in rub.criteria)
    assert r[0] == pytest.approx(1.0) and r[2] == pytest.approx(n_pit / rub.num_criteria)


RATED = Rubric("rated", "q", (Criterion("contains:paris", 3.0), Criterion("min_words:3", 1.0),
                              Criterion("contains:sorry", -2.0)))


def rated_groups(*texts: str) -> list[Group]:
    return [Group(Prompt("rated", ({"role": "user", "content": "q"},), answer=RATED),
                  tuple(traj(t) for t in texts))]


def test_implicit_is_one_rating_per_response_from_the_rule_judge():
    class Counting(RuleJudge):
        rate_calls = 0

        def rate(self, reqs):
            Counting.rate_calls += 1
            assert all(r.criteria == tuple(c.text for c in RATED.criteria) for r in reqs)
            return super().rate(reqs)

    task = RubricChatTask(size=1)
    rw = make_rewarder("rubric", task, {"aggregator": "implicit", "fitness": False}, Counting())
    out = rw(rated_groups("Paris is nice", "Paris", "sorry, Paris here", "sorry"), None, 0)
    # weighted pass fractions 6/6, 5/6, 4/6, 0 -> ratings 10, 9 (7.5 -> 8), 7, 1 -> (r - 1) / 9
    np.testing.assert_allclose(out.rewards[0], [1.0, 8 / 9, 6 / 9, 0.0])
    assert Counting.rate_calls == 1 and out.metrics["judge/requests_rate"] == 4
    assert out.metrics["rubric/rating_fallbacks"] == 0
    # the old arm by its name: the unweighted pass rate 3/3, 2/3, 2/3, 0
    old = make_rewarder("rubric", task, {"aggregator": "pass_rate", "fitness": False}, RuleJudge())
    np.testing.assert_allclose(old(rated_groups("Paris is nice", "Paris", "sorry, Paris here",
                                                "sorry"), None, 0).rewards[0],
                               [1.0, 2 / 3, 2 / 3, 0.0], rtol=1e-6)


def test_implicit_with_an_llm_judge_on_the_test_server():
    from judges import LLMJudge, OpenAIBackend, OpenAIConfig
    from tests.judge_server import FakeJudgeServer

    with FakeJudgeServer() as srv:
        judge = LLMJudge(OpenAIBackend(OpenAIConfig(
            base_url=srv.base_url, model="fake", api_key_env=None, timeout_s=5.0, max_retries=1,
            backoff_base_s=0.01, backoff_max_s=0.05, jitter_seed=0)), max_reasks=1)
        rw = make_rewarder("rubric", RubricChatTask(size=1),
                           {"aggregator": "implicit", "fitness": False}, judge)
        out = rw(rated_groups("RATE[7]", "FAULT[garbage*all] RATE[7]"), None, 0)
    # "7" -> (7 - 1) / 9; unreadable twice -> the fallback rating 1 -> 0, counted
    np.testing.assert_allclose(out.rewards[0], [6 / 9, 0.0])
    m = out.metrics
    assert (m["rubric/rating_fallbacks"], m["judge/fallbacks_rate"]) == (1, 1)
    # the marker also spoils that response's 3 criterion checks (coverage): 3 + 1 re-asks
    assert (m["rubric/check_fallbacks"], m["judge/reasks"]) == (3, 4)
    assert m["judge/requests_rate"] == 2


def test_rewarder_judge_resolution_and_errors():
    task = RubricChatTask(size=2)
    rw = RubricRewarder(task=task, judge=None)  # rule-checkable task: defaults to RuleJudge
    assert isinstance(rw.judge, RuleJudge)

    class Plain:
        name = "plain"

    with pytest.raises(ValueError, match="needs a judge"):
        RubricRewarder(task=Plain(), judge=None)
    with pytest.raises(ValueError, match="unknown aggregator"):
        RubricRewarder(task=task, judge=RuleJudge(), aggregator="sum")
    p = task.prompts("train")[0]
    r = p.meta["rubric"]
    unbundled = r.with_dimensions(())
    with pytest.raises(ValueError, match="needs bundled rubrics"):
        score_items(RuleJudge(), [ScoreItem("q", "x", unbundled)], "prorubric")
    with pytest.raises(TypeError, match="carries no rubric"):
        prompt_rubric(Prompt(id="x", messages=({"role": "user", "content": "q"},)))


@pytest.mark.parametrize("fit, field", [
    ([{"weight": 1.0}], "meta.fitness[0].text"),
    ([{"text": "iregex:dark"}, {"text": " ", "weight": 1.0}], "meta.fitness[1].text"),
    ([{"text": "iregex:dark", "weight": "heavy"}], "meta.fitness[0].weight"),
    ([{"text": "iregex:dark", "tags": [1]}], "meta.fitness[0].tags"),
    (["iregex:dark"], "meta.fitness[0]"),
    ("iregex:dark", "meta.fitness"),
])
def test_malformed_fitness_criteria_name_prompt_and_field(fit, field):
    r = Rubric("pf-1", "q", (Criterion("iregex:dark", 1.0),), meta={"fitness": fit})
    with pytest.raises(RubricError) as e:
        fitness_criteria(r)
    assert e.value.prompt_id == "pf-1" and e.value.field == field
    assert "'pf-1'" in str(e.value) and field in str(e.value)


#: Held-out criteria for "Keep the room dark.": two the rule judge reads (both pass), two free-text
#: ones it cannot read (its defined fallback), one positive and one pitfall.
FALLBACK_FITNESS = [
    {"text": "iregex:dark", "weight": 1.0},
    {"text": "iregex:alcohol", "weight": -1.0},
    {"text": "Cites a source for the advice.", "weight": 1.0},
    {"text": "Recommends alcohol as a sleep aid.", "weight": -1.0},
]


@pytest.mark.parametrize("use_probs", [False, True])
def test_judge_fallbacks_never_raise_fitness(use_probs):
    r = Rubric("fb", "q", (Criterion("iregex:dark", 1.0),), meta={"fitness": FALLBACK_FITNESS})
    s = score_items(RuleJudge(), [ScoreItem("q", "Keep the room dark.", r, fitness_criteria(r))],
                    "additive", use_probs)
    (ch,) = s.checks
    # the pitfall the judge could not read is not a pass: it earns nothing, like the positive one
    assert ch.fitness == (1.0, 1.0, 0.0, 0.0)
    assert s.fitness[0] == pytest.approx(0.5)
    assert (ch.fallbacks, ch.fitness_fallbacks) == (2, 2)


def test_rewarder_counts_fitness_fallbacks():
    r = Rubric("fb", "q", (Criterion("iregex:dark", 1.0),), meta={"fitness": FALLBACK_FITNESS})
    p = Prompt(id="fb", messages=({"role": "user", "content": "q"},), meta={"rubric": r})
    rw = make_rewarder("rubric", RubricChatTask(size=2), {"aggregator": "additive"}, RuleJudge())
    m = rw([Group(p, (traj("Keep the room dark."), traj("Have a drink.")))], None, 0).metrics
    assert m["rubric/fitness_fallbacks"] == 4 and m["rubric/check_fallbacks"] == 4
    assert m["rubric/fitness"] == pytest.approx((0.5 + 0.25) / 2)


def test_shipped_fixture_matches_the_generator(tmp_path):
    export_rubrics(tmp_path / "x.jsonl", split="test", n=12)
    assert load_rubrics(tmp_path / "x.jsonl") == load_rubrics(FIXTURE)


def test_two_step_prorubric_run_on_tiny(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.trainer import build_trainer

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=[
            "task=rubric_chat", "algo=prorubric", "judge=rule", "model=tiny",
            f"trainer.run_dir={tmp_path / 'run'}", "trainer.max_steps=2",
            "trainer.batch_prompts=2", "algo.group_size=2", "trainer.max_new_tokens=8",
            "task.eval_size=2", "trainer.progress=false", "trainer.loggers=[]",
            "trainer.save_every=0", "trainer.eval_at_ends=false"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    assert cfg["task"]["aggregator"] == "prorubric"
    trainer = build_trainer(cfg)
    history = trainer.run()
    trainer.close()
    assert len(history) == 2
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for rec in recs:
        for key in ("rubric/coverage", "rubric/fitness", "rubric/reward", "rubric/length_words"):
            assert key in rec and rec[key] is not None, key
        assert rec["judge/requests_check"] > 0 and "judge/fallbacks" in rec
    versions = json.loads((tmp_path / "run" / "judge_versions.json").read_text())
    assert versions == {"rule_features": "features-v2"}


def test_demonstrations_are_the_reference_answers_ending_the_turn(char_model):
    """The warm-up data: per prompt one trajectory whose tokens are the tokenizer's encoding of
    the rubric's reference answer plus the end-of-turn token, all of it trained on; the
    reference scores 1 under the rubric (coverage and fitness); a short budget cuts it."""
    from models.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(char_model)
    task = RubricChatTask(size=4, eval_size=2)
    groups = task.demonstrations("train", tok, n=3, max_new_tokens=1000)
    prompts = task.prompts("train")[:3]
    assert [g.prompt.id for g in groups] == [p.id for p in prompts]
    for g, p in zip(groups, prompts):
        (t,) = g.trajectories
        ref = p.meta["rubric"].reference_answer
        assert t.text == ref and t.finish == "eos"
        assert list(t.tokens) == [*tok.encode(ref), tok.eos_ids[0]]
        assert t.loss_mask == (1,) * len(t.tokens)
        assert list(t.prompt_tokens) == tok.encode_chat(list(p.messages))
    report = task.evaluate(prompts, [g.trajectories[0].text for g in groups])
    assert report.summary["coverage"] == 1.0 and report.summary["fitness"] == 1.0
    (cut,) = task.demonstrations("train", tok, n=1, max_new_tokens=10)[0].trajectories
    assert len(cut.tokens) == 10 and cut.finish == "length"
    assert cut.text == tok.decode(tok.encode(prompts[0].meta["rubric"].reference_answer)[:10])
