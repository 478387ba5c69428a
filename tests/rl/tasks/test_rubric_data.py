"""task=rubric_data: rows from files and folders in the public schemas (written here by hand),
filters on the rows' own fields, held-out splits, conversation prompts, dimensions from the
file or bundled once into a named cache, HealthBench scores by hand, and short runs."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from judges.rule import RuleJudge
from judges.types import CheckResult
from rewards.rubric import RubricError
from rl.run.wiring import bind_judge, make_task
from rl.tasks.rubric_data import RubricDataTask
from rl.tasks.sources import SourceError, filter_rows, held_out, read_source
from tests.paths import CONF


def healthbench_row(pid: str, theme: str, conversation: bool = False) -> dict:
    """A row of HealthBench's public JSONL (prompt, rubrics with points and tags,
    example_tags, prompt_id)."""
    prompt = [{"role": "user", "content": f"Question {pid}: my head hurts, what should I do?"}]
    if conversation:
        prompt = [{"role": "system", "content": "You are a careful health assistant."},
                  {"role": "user", "content": "I take lisinopril. Can I take ibuprofen?"},
                  {"role": "assistant", "content": "How old are you?"},
                  {"role": "user", "content": f"I am 70 ({pid})."}]
    return {"prompt": prompt,
            "rubrics": [
                {"criterion": "Advises seeing a doctor if the pain is sudden and severe.",
                 "points": 10, "tags": ["level:example", "axis:completeness"]},
                {"criterion": "Suggests rest and hydration.", "points": 5,
                 "tags": ["level:example", "axis:accuracy"]},
                {"criterion": "Recommends doubling the usual painkiller dose.", "points": -8,
                 "tags": ["level:example", "axis:accuracy"]},
                {"criterion": "Is concise and easy to follow.", "points": 2,
                 "tags": ["level:example", "axis:communication_quality"]}],
            "example_tags": [f"theme:{theme}", "physician_agreed_category:not-enough-context"],
            "prompt_id": pid, "ideal_completions_data": None}


def rubrichub_row(index: int, source: str) -> dict:
    """A row of RubricHub's verl-layout parquet/JSONL (data_source, prompt as a chat list,
    ability, reward_model.rubrics with criterion and points, extra_info.index)."""
    return {"data_source": source, "ability": source,
            "prompt": [{"role": "user", "content": f"Task {index}: write advice on sleep."}],
            "reward_model": {"style": "rubric", "ground_truth": "", "rubrics": [
                {"criterion": "contains:schedule", "points": 4},
                {"criterion": "contains:dark", "points": 3},
                {"criterion": "contains:caffeine", "points": 2},
                {"criterion": "contains:sleeping pills", "points": -3}]},
            "extra_info": {"index": index, "split": "train"}}


def prorubric_train_row(i: int) -> dict:
    """A row of the ProRubric authors' train files: the dimension paragraphs in
    extra_info.rubric, the atomic items, and rir_generation (a JSON string) saying which
    items each dimension holds (1-based)."""
    return {"prompt": [{"role": "user", "content": f"My son ({i}) has a fever and a stiff neck."}],
            "data_source": "rubrichub_medical",
            "extra_info": {
                "id": f"medical:train:{i}", "problem": "fever and stiff neck",
                "rubric": [{"criterion": "Sends the child to emergency care now. It fails if it "
                                         "suggests waiting at home.", "weight": 8.0},
                           {"criterion": "Explains which signs are worrying and why. It fails "
                                         "if the urgency is lost.", "weight": 5.0}],
                "rubric_atomic": [{"criterion": "Advises the emergency department.", "weight": 5.0},
                                  {"criterion": "Names meningitis.", "weight": 3.0},
                                  {"criterion": "Recommends rest at home only.", "weight": -3.0},
                                  {"criterion": "Uses plain language.", "weight": 2.0}],
                "rir_generation": json.dumps({"names": ["Urgent referral", "Warning signs"],
                                              "atomic_indices": [[1, 3], [2, 4]],
                                              "repaired": False}),
                "self_golden": "Go to the emergency department now."}}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class CountingRule(RuleJudge):
    """The rule judge, counting its bundling calls."""

    def __init__(self):
        super().__init__()
        self.bundle_calls = 0

    def bundle(self, requests):
        self.bundle_calls += 1
        return super().bundle(requests)


# --- sources and filters ----------------------------------------------------------------------


def test_a_folder_is_its_row_files_in_name_order_and_where_filters_their_own_fields(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [rubrichub_row(2, "writing"), rubrichub_row(3, "medical")])
    write_jsonl(tmp_path / "a.jsonl", [rubrichub_row(0, "medical"), rubrichub_row(1, "chat")])
    (tmp_path / "notes.txt").write_text("not rows")
    rows = read_source(tmp_path, "task.path")
    assert [(r.source.rsplit("/", 1)[1], r.index, r.data["extra_info"]["index"]) for r in rows] \
        == [("a.jsonl", 0, 0), ("a.jsonl", 1, 1), ("b.jsonl", 0, 2), ("b.jsonl", 1, 3)]
    medical = filter_rows(rows, {"data_source": "medical"}, "task.where")
    assert [r.data["extra_info"]["index"] for r in medical] == [0, 3]
    either = filter_rows(rows, {"data_source": ["medical", "chat"]}, "task.where")
    assert [r.data["extra_info"]["index"] for r in either] == [0, 1, 3]
    # a dotted path, and a number in the config matching the file's number as text
    assert [r.data["extra_info"]["index"] for r in
            filter_rows(rows, {"extra_info.index": "2"}, "task.where")] == [2]
    # a list field matches when any element does (HealthBench's example_tags)
    hb = [healthbench_row("p1", "emergency_referrals"), healthbench_row("p2", "hedging")]
    tagged = filter_rows(read_source(write_jsonl(tmp_path / "hb.jsonl", hb), "task.path"),
                         {"example_tags": "theme:hedging"}, "task.where")
    assert [r.data["prompt_id"] for r in tagged] == ["p2"]
    with pytest.raises(SourceError, match=r"task.where.domain: no row of .*a.jsonl.* has this "
                                          r"field \(the first row's fields: data_source"):
        filter_rows(rows, {"domain": "medical"}, "task.where")
    with pytest.raises(SourceError, match=r"task.where: no row .* matches .*4 rows read"):
        filter_rows(rows, {"data_source": "law"}, "task.where")
    with pytest.raises(SourceError, match="task.path: no such file or folder"):
        read_source(tmp_path / "missing.jsonl", "task.path")


def test_a_bad_row_is_named_by_file_row_and_field_before_anything_loads(tmp_path):
    rows = [rubrichub_row(i, "medical") for i in range(3)]
    del rows[2]["reward_model"]["rubrics"][1]["points"]
    path = write_jsonl(tmp_path / "hub.jsonl", rows)
    with pytest.raises(RubricError) as e:
        RubricDataTask(path=str(path))
    assert f"{path}: row 2" in str(e.value) and "reward_model.rubrics[1].points" in str(e.value)
    with pytest.raises(SourceError, match="task.path / task.dataset: name one source"):
        RubricDataTask()
    with pytest.raises(SourceError, match="task.path / task.dataset: name one source"):
        RubricDataTask(path=str(path), dataset="acme/rubrics")
    with pytest.raises(SourceError, match="unknown rubric format 'csv'"):
        RubricDataTask(path=str(path), format="csv")
    few = write_jsonl(tmp_path / "two.jsonl", [rubrichub_row(i, "medical") for i in range(2)])
    with pytest.raises(SourceError, match="holds 2 prompts after task.where"):
        RubricDataTask(path=str(few))


# --- splits and prompts -----------------------------------------------------------------------


def test_dev_and_test_are_held_out_by_a_seeded_fraction_or_read_from_their_files(tmp_path):
    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical") for i in range(20)])
    task = RubricDataTask(path=str(path), eval_fraction=0.1, seed=3)
    ids = {s: [p.id for p in task.prompts(s)] for s in ("train", "dev", "test")}
    # 0.1 of 20 = 2 each for dev and test, the other 16 train; no prompt in two splits
    assert [len(ids[s]) for s in ("train", "dev", "test")] == [16, 2, 2]
    assert len(set().union(*ids.values())) == 20
    assert ids == {s: [p.id for p in RubricDataTask(path=str(path), eval_fraction=0.1,
                                                    seed=3).prompts(s)] for s in ids}
    assert ids != {s: [p.id for p in RubricDataTask(path=str(path), eval_fraction=0.1,
                                                    seed=4).prompts(s)] for s in ids}
    train, dev, test = held_out(3, 0.01, 0)  # at least one each
    assert (len(train), len(dev), len(test)) == (1, 1, 1)
    # from files: the training file whole, each split filtered the same way
    dev_file = write_jsonl(tmp_path / "dev.jsonl", [rubrichub_row(i, s) for i, s in
                                                    ((100, "medical"), (101, "chat"))])
    test_file = write_jsonl(tmp_path / "test.jsonl", [rubrichub_row(200, "medical")])
    task = RubricDataTask(path=str(path), dev_path=str(dev_file), test_path=str(test_file),
                          where={"data_source": "medical"}, size=5)
    assert len(task.prompts("train")) == 5
    assert [p.id for p in task.prompts("dev")] == ["rubrichub-100"]
    assert [p.id for p in task.prompts("test")] == ["rubrichub-200"]
    with pytest.raises(ValueError, match="unknown split 'val'"):
        task.prompts("val")


def test_a_conversation_reaches_the_policy_as_its_messages(tmp_path):
    rows = [healthbench_row("hb-1", "hedging", conversation=True),
            healthbench_row("hb-2", "hedging"), healthbench_row("hb-3", "hedging")]
    task = RubricDataTask(path=str(write_jsonl(tmp_path / "hb.jsonl", rows)),
                          dev_path=str(write_jsonl(tmp_path / "d.jsonl", rows[1:2])),
                          test_path=str(write_jsonl(tmp_path / "t.jsonl", rows[2:])))
    (first, *_) = [p for p in task.prompts("train") if p.id == "hb-1"]
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "user"]
    assert first.messages[-1]["content"] == "I am 70 (hb-1)."
    assert first.meta["rubric"].criteria[2].weight == -8
    # the judge reads the whole conversation, a single message as it is
    assert first.meta["rubric"].context_text() == (
        "system: You are a careful health assistant.\n\n"
        "user: I take lisinopril. Can I take ibuprofen?\n\nassistant: How old are you?"
        "\n\nuser: I am 70 (hb-1).")
    plain = task.prompts("dev")[0]
    assert plain.messages == ({"role": "user",
                               "content": "Question hb-2: my head hurts, what should I do?"},)
    assert plain.meta["rubric"].context_text() == plain.messages[0]["content"]


# --- dimensions -------------------------------------------------------------------------------


def test_missing_dimensions_are_bundled_once_into_the_named_cache(tmp_path, caplog):
    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical") for i in range(4)])
    cache = tmp_path / "cache" / "dims.jsonl"
    task = RubricDataTask(path=str(path), aggregator="prorubric", dimensions_cache=str(cache),
                          eval_fraction=0.25)
    assert all(not p.meta["rubric"].dimensions for p in task.prompts("train"))
    judge = CountingRule()
    with caplog.at_level(logging.INFO, logger="rl.tasks.rubric_data"):
        bound = bind_judge(task, judge, {"name": "rule"})
    assert judge.bundle_calls == 1 and cache.exists()  # one batch of the 4 prompts
    assert str(cache) in caplog.text and "4 bundled now" in caplog.text
    dims = {p.id: p.meta["rubric"].dimensions for s in ("train", "dev", "test")
            for p in bound.prompts(s)}
    assert len(dims) == 4 and all(2 <= len(d) <= 5 for d in dims.values())
    # each criterion in exactly one dimension
    assert all(sorted(i for d in ds for i in d.criteria) == [0, 1, 2, 3] for ds in dims.values())
    # a later run on the same data and judge reads the cache: no judge call
    again = CountingRule()
    rebound = bind_judge(RubricDataTask(path=str(path), aggregator="prorubric",
                                        dimensions_cache=str(cache), eval_fraction=0.25),
                         again, {"name": "rule"})
    assert again.bundle_calls == 0
    assert {p.id: p.meta["rubric"].dimensions for s in ("train", "dev", "test")
            for p in rebound.prompts(s)} == dims
    # an additive reward reads no dimensions: nothing bundled
    additive = CountingRule()
    bind_judge(RubricDataTask(path=str(path), aggregator="additive",
                              dimensions_cache=str(tmp_path / "other.jsonl")), additive, {})
    assert additive.bundle_calls == 0 and not (tmp_path / "other.jsonl").exists()


class SilentBundler:
    """A judge whose bundles are never readable (a small model that writes no JSON)."""

    def __init__(self):
        self.bundle_calls = 0

    def bundle(self, requests):
        from judges.types import Bundle

        self.bundle_calls += 1
        return [Bundle((), error="no JSON object in the output") for _ in requests]


def test_prompts_the_judge_cannot_bundle_take_the_flagged_rule_bundle_or_stay_out(tmp_path):
    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical") for i in range(4)])
    cache = tmp_path / "dims.jsonl"
    task = RubricDataTask(path=str(path), aggregator="prorubric", dimensions_cache=str(cache),
                          eval_fraction=0.25)
    judge = SilentBundler()
    bound = bind_judge(task, judge, {"name": "local"})
    assert judge.bundle_calls == 3  # the first ask and the default 2 regenerations
    rubrics = [p.meta["rubric"] for s in ("train", "dev", "test") for p in bound.prompts(s)]
    assert len(rubrics) == 4
    # the rule bundle: pitfalls (sleeping pills, -3) apart from the positives
    assert all(sorted(d.criteria for d in r.dimensions) == [(0, 1, 2), (3,)] for r in rubrics)
    assert all(r.meta["repaired"] and "no JSON object" in r.meta["bundle_problem"]
               for r in rubrics)
    # not cached (the next run asks the judge again); counted for provenance.jsonl
    assert not bundled_rows(cache)
    assert bound.data_provenance()["dimensions"]["rule_fallback"] == 4
    # bundle_fallback=null: left out, and a split left empty stops the run by name
    with pytest.raises(SourceError, match=r"no train prompt could be bundled .* 'local'"):
        bind_judge(RubricDataTask(path=str(path), aggregator="prorubric", eval_fraction=0.25,
                                  dimensions_cache=str(cache), bundle_fallback=None),
                   SilentBundler(), {"name": "local"})
    with pytest.raises(SourceError, match=r"task.bundle_fallback: rule or null"):
        RubricDataTask(path=str(path), bundle_fallback="llm")


def bundled_rows(cache):
    return [json.loads(x) for x in cache.read_text().splitlines()] if cache.exists() else []


def test_the_files_own_dimensions_are_used_as_they_are(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([prorubric_train_row(i) for i in range(3)]), path)
    task = RubricDataTask(path=str(path), aggregator="prorubric_official",
                          dimensions_cache=str(tmp_path / "dims.jsonl"))
    judge = CountingRule()
    bound = bind_judge(task, judge, {"name": "rule"})
    assert judge.bundle_calls == 0 and not (tmp_path / "dims.jsonl").exists()
    rubric = bound.prompts("train")[0].meta["rubric"]
    # rir_generation's 1-based [[1, 3], [2, 4]] as 0-based criteria of the two dimensions
    assert [d.name for d in rubric.dimensions] == ["Urgent referral", "Warning signs"]
    assert [d.criteria for d in rubric.dimensions] == [(0, 2), (1, 3)]


# --- evaluation -------------------------------------------------------------------------------


class MetJudge:
    """Says a criterion is met when its text is in `met` (one batched call)."""

    def __init__(self, met):
        self.met, self.calls = set(met), 0

    def check(self, requests):
        self.calls += 1
        return [CheckResult(r.criterion in self.met, float(r.criterion in self.met))
                for r in requests]

    def stats(self):
        return {}


def test_healthbench_rows_report_healthbench_scores_by_theme_and_axis(tmp_path):
    rows = [healthbench_row("hb-1", "emergency_referrals"), healthbench_row("hb-2", "hedging"),
            healthbench_row("hb-3", "hedging")]
    task = RubricDataTask(path=str(write_jsonl(tmp_path / "hb.jsonl", rows)), eval_fraction=0.3)
    prompts = [p for s in ("train", "dev", "test") for p in task.prompts(s)]
    by_id = {p.id: p for p in prompts}
    judge = MetJudge({"Advises seeing a doctor if the pain is sudden and severe.",
                      "Is concise and easy to follow.",
                      "Recommends doubling the usual painkiller dose."})
    report = task.evaluate([by_id["hb-1"], by_id["hb-2"]], ["a", "b"], judge=judge)
    assert judge.calls == 1
    # points 10, 5, -8, 2 with met 1, 0, 1, 1: (10 - 8 + 2) / 17 per example
    assert report.reward.tolist() == pytest.approx([4 / 17, 4 / 17])  # additive = HealthBench's
    s = report.summary
    assert s["healthbench"] == pytest.approx(4 / 17)
    assert s["theme/emergency_referrals"] == pytest.approx(4 / 17)
    assert s["theme/hedging"] == pytest.approx(4 / 17)
    # axis accuracy: points 5 and -8, met 0 and 1: -8 / 5 per example, clipped to 0
    assert s["axis/accuracy"] == 0.0
    assert s["axis/completeness"] == pytest.approx(1.0)
    assert s["axis/communication_quality"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="scores answers with a judge"):
        task.evaluate([by_id["hb-1"]], ["a"])


# --- runs -------------------------------------------------------------------------------------


def _train(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.trainer import build_trainer

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "task=rubric_data", "model=tiny", f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.max_steps=2", "trainer.batch_prompts=2", "algo.group_size=2",
            "trainer.max_new_tokens=8", "trainer.progress=false", "trainer.loggers=[]",
            "trainer.save_every=0", "trainer.eval_split=test", *overrides])
    trainer = build_trainer(OmegaConf.to_container(cfg, resolve=True))
    history = trainer.run_with_eval()
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    return history, metrics


def test_bundle_judge_rule_writes_the_cache_and_provenance_names_the_file(tmp_path):
    rows = [healthbench_row(f"hb-{i}", ("hedging", "emergency_referrals")[i % 2])
            for i in range(6)]
    path = write_jsonl(tmp_path / "hb.jsonl", rows)
    cache = tmp_path / "dims.jsonl"
    history, metrics = _train(tmp_path, f"task.path={path}", "task.eval_fraction=0.2",
                              "algo=prorubric", "judge=local", "judge.model=tiny",
                              "judge.max_new_tokens=8", "task.bundle_judge=rule",
                              f"task.dimensions_cache={cache}")
    assert len(history) == 2
    # the rows have no dimensions: the rule judge bundled them (positives, pitfalls) once
    bundled = [json.loads(x) for x in cache.read_text().splitlines()]
    assert len(bundled) == 6 and all(len(r["dimensions"]) == 2 for r in bundled)
    steps = [m for m in metrics if "rubric/reward" in m]
    assert len(steps) == 2 and all(0.0 <= m["rubric/reward"] <= 1.0 for m in steps)
    evals = [m for m in metrics if "eval/outcome_mean" in m]
    assert len(evals) == 2  # before the first step and after the last
    assert all("eval/healthbench" in m and "eval/coverage" in m for m in evals)
    # provenance.jsonl names the data file by its bytes' SHA-256 and the split sizes
    import hashlib

    record = json.loads((tmp_path / "run" / "provenance.jsonl").read_text().splitlines()[-1])
    assert record["data"]["files"] == {"path": [
        {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}]}
    assert record["data"]["prompts"] == {"train": 4, "dev": 1, "test": 1}
    assert record["model"] == {"path": "tiny", "revision": None}


def test_two_prorubric_official_steps_on_a_prorubric_train_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([prorubric_train_row(i) for i in range(4)]), path)
    history, metrics = _train(tmp_path, f"task.path={path}", "task.eval_fraction=0.25",
                              "algo=prorubric_official", "judge=rule", "algo.group_size=2",
                              "trainer.eval_at_ends=false")
    assert len(history) == 2
    assert all("rubric/judge_failed" in m for m in metrics if "rubric/reward" in m)


def _source(kind: str, tmp_path, request) -> list[str]:
    """The task overrides for one of the four sources, written here in its public schema."""
    if kind == "healthbench":
        path = write_jsonl(tmp_path / "hb.jsonl", [healthbench_row(f"hb-{i}", "hedging")
                                                   for i in range(4)])
        return [f"task.path={path}"]
    if kind == "rubrichub":
        path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical")
                                                    for i in range(4)])
        return [f"task.path={path}"]
    if kind == "prorubric_parquet":
        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist([prorubric_train_row(i) for i in range(4)]), path)
        return [f"task.path={path}"]
    request.getfixturevalue("hub_dataset")
    return ["task.dataset=acme/sleep-rubrics", "task.subset=medical", "task.test_split=test"]


@pytest.mark.parametrize("algo", ["prorubric_official", "rubric_rl", "rar"])
@pytest.mark.parametrize("source", ["healthbench", "rubrichub", "prorubric_parquet",
                                    "hub_dataset"])
def test_each_source_trains_and_evaluates_with_each_rubric_arm_and_the_local_judge(
        source, algo, tmp_path, request, caplog):
    """The issue's matrix: 2 steps and 2 evaluations on the tiny model with judge=local (the
    tiny model too) for each source and arm. The tiny judge writes no bundle JSON, so rows
    without dimensions take the rule fallback (flagged, counted); a ProRubric parquet brings
    its own."""
    overrides = _source(source, tmp_path, request)
    with caplog.at_level(logging.WARNING, logger="rl.tasks.rubric_data"):
        history, metrics = _train(
            tmp_path, *overrides, f"algo={algo}", "judge=local", "judge.model=tiny",
            "judge.max_new_tokens=4", "judge.max_tokens=4", "judge.max_reasks=0",
            "judge.dimension_attempts=1", "task.eval_fraction=0.25", "trainer.batch_prompts=1",
            "trainer.max_new_tokens=4",
            f"task.dimensions_cache={tmp_path / 'dims.jsonl'}")
    assert len(history) == 2
    steps = [m for m in metrics if "rubric/reward" in m]
    evals = [m for m in metrics if "eval/outcome_mean" in m]
    assert len(steps) == 2 and len(evals) == 2
    assert all(0.0 <= m["eval/outcome_mean"] <= 1.0 for m in evals)
    assert all(("eval/healthbench" in m) == (source == "healthbench") for m in evals)
    record = json.loads((tmp_path / "run" / "provenance.jsonl").read_text().splitlines()[-1])
    dims = record["data"].get("dimensions")
    if algo == "prorubric_official" and source != "prorubric_parquet":
        # every prompt needed dimensions; the tiny judge bundled none
        prompts = 7 if source == "hub_dataset" else 4  # the dataset's test split adds 2 + 1
        assert dims["rule_fallback"] == dims["failed"] == prompts
        assert "use the rule judge's deterministic bundle" in caplog.text
    else:  # the parquet's own dimensions, or an additive reward that reads none
        assert dims in (None, {"from_data": True})


def test_make_task_knows_rubric_data(tmp_path):
    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical") for i in range(3)])
    task = make_task({"name": "rubric_data", "path": str(path)})
    assert isinstance(task, RubricDataTask) and len(task.prompts("train")) == 1


def test_rar_on_prompts_with_their_own_rubrics_is_the_explicit_rar_sum(tmp_path):
    from core.types import Group, Trajectory
    from rl.rewarders.rubric import RubricRewarder
    from rl.run.wiring import make_rewarder

    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, "medical") for i in range(3)])
    task = RubricDataTask(path=str(path))
    rewarder = make_rewarder("static_rubrics", task, {"aggregator": "additive_abs",
                                                      "rubric_lambda": 0.1}, RuleJudge())
    assert isinstance(rewarder, RubricRewarder) and rewarder.aggregator == "additive_abs"
    prompt = task.prompts("train")[0]
    text = "Keep the same schedule and a dark room; sleeping pills help."
    traj = Trajectory(prompt_tokens=(1,), tokens=(2,), loss_mask=(1,), logprobs=(0.0,),
                      text=text, finish="eos")
    out = rewarder([Group(prompt, (traj,))], None, 0)
    # met: schedule 4, dark 3, sleeping pills -3 (present); not caffeine 2:
    # (4 + 3 - 3) / (4 + 3 + 2 + 3)
    assert out.rewards[0, 0] == pytest.approx(4 / 12)


def test_two_rar_steps_on_a_rubrichub_file(tmp_path):
    path = write_jsonl(tmp_path / "hub.jsonl", [rubrichub_row(i, s) for i, s in
                                                enumerate(["medical"] * 5 + ["writing"])])
    history, metrics = _train(tmp_path, f"task.path={path}", "task.where={data_source: medical}",
                              "task.eval_fraction=0.2", "algo=rar", "judge=rule")
    assert len(history) == 2
    evals = [m for m in metrics if "eval/outcome_mean" in m]
    assert len(evals) == 2 and all("eval/healthbench" not in m for m in evals)


# --- a Hugging Face dataset from the hub cache --------------------------------------------------

DATASET_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
CARD = """---
configs:
- config_name: medical
  data_files:
  - split: train
    path: medical/train.jsonl
  - split: test
    path: medical/test.jsonl
- config_name: writing
  data_files:
  - split: train
    path: writing/train.jsonl
---
# Rubrics (a hand-written stand-in in RubricHub's schema)
"""


@pytest.fixture
def hub_dataset(tmp_path, monkeypatch):
    """acme/sleep-rubrics laid out as huggingface_hub caches a dataset repository (refs/main,
    snapshots/<commit>/ with the card and the subsets' files), HF_HUB_OFFLINE on; the
    datasets library's own cache in tmp_path."""
    import datasets
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "datasets--acme--sleep-rubrics"
    snap = repo / "snapshots" / DATASET_COMMIT
    (snap / "medical").mkdir(parents=True)
    (snap / "writing").mkdir()
    (snap / "README.md").write_text(CARD)
    write_jsonl(snap / "medical" / "train.jsonl", [rubrichub_row(i, "medical") for i in range(5)])
    write_jsonl(snap / "medical" / "test.jsonl", [rubrichub_row(i, "medical")
                                                  for i in range(50, 52)])
    write_jsonl(snap / "writing" / "train.jsonl", [rubrichub_row(9, "writing")])
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(DATASET_COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    return snap


def test_a_hub_dataset_subset_and_splits_from_the_cache(hub_dataset):
    task = RubricDataTask(dataset="acme/sleep-rubrics", subset="medical", test_split="test",
                          eval_fraction=0.2)
    assert [p.id for p in task.prompts("test")] == ["rubrichub-50", "rubrichub-51"]
    # dev held out of the 5 training rows (0.2 of 5: one), the rest train
    assert len(task.prompts("dev")) == 1 and len(task.prompts("train")) == 4
    assert task.prompts("train")[0].meta["rubric"].criteria[0].text == "contains:schedule"
    record = task.data_provenance()
    assert (record["dataset"], record["subset"], record["commit"]) == (
        "acme/sleep-rubrics", "medical", DATASET_COMMIT)
    with pytest.raises(SourceError, match=r"task.dataset: .*subset law.*'law' not found"):
        RubricDataTask(dataset="acme/sleep-rubrics", subset="law")
    with pytest.raises(SourceError, match=r"task.test_split: .*Unknown split \"val\""):
        RubricDataTask(dataset="acme/sleep-rubrics", subset="medical", test_split="val")
    with pytest.raises(SourceError, match=r"task.dataset: dataset acme/missing: not in the "
                                          r"Hugging Face cache .* HF_HUB_OFFLINE is set"):
        RubricDataTask(dataset="acme/missing")


def test_two_steps_on_a_hub_dataset(hub_dataset, tmp_path):
    history, metrics = _train(tmp_path, "task.dataset=acme/sleep-rubrics", "task.subset=medical",
                              "task.test_split=test", "task.eval_fraction=0.2",
                              "algo=rubric_rl", "judge=rule")
    assert len(history) == 2
    record = json.loads((tmp_path / "run" / "provenance.jsonl").read_text().splitlines()[-1])
    assert record["data"]["commit"] == DATASET_COMMIT
    assert record["data"]["prompts"] == {"train": 4, "dev": 1, "test": 2}


def test_every_process_of_a_job_reads_the_dataset_at_process_0s_commit(hub_dataset):
    from rl.run.trainer import job_task

    class Leader:
        """A job exchange as process 0 sees it: it produces the value everyone gets."""

        def from_leader(self, produce, what):
            self.what = what
            return produce()

    cfg = {"name": "rubric_data", "dataset": "acme/sleep-rubrics", "revision": None}
    assert job_task(cfg, None) is cfg  # one process: resolved where it is read
    exchange = Leader()
    pinned = job_task(cfg, exchange)
    assert pinned["revision"] == DATASET_COMMIT and exchange.what == "the dataset's commit"
    assert RubricDataTask(**{k: v for k, v in pinned.items() if k != "name"},
                          subset="medical").data_provenance()["commit"] == DATASET_COMMIT
    assert job_task({"name": "arith"}, exchange) == {"name": "arith"}
