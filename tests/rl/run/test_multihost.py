"""A multi-process job (#17 items 4-5): 2 processes x 2 CPU devices on 127.0.0.1 (gloo) train
as one run. Final weights equal a 1-process x 4-device run of the same config, the rubric
memory is the same value, the judge server receives each distinct request once, process 0
alone writes the run folder, a killed process ends the job with an error within a bounded
time, and inconsistent job settings are refused by key before any compute.

The runs are subprocesses of ``python -m rl.train`` (a process joins a job before its first
JAX call, so the test process itself cannot)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest
from etils import epath

from models import load_params
from rl.run.config import ConfigError
from rl.run.evaluation import restore_run_params
from rl.run.folder import TOKEN, check_shared
from rl.run.multihost import DivergenceError, Exchange, LeaderCalls
from rl.run.trainer import build_trainer
from tests.judge_server import FakeJudgeServer
from tests.paths import ROOT
from tests.rl.run.test_trainer import LEARN, make_cfg

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------ the exchange


class FakeStore:
    """The coordinator's key-value store, in memory, shared by threads playing processes."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def key_value_set_bytes(self, key, value):
        with self.cond:
            assert key not in self.data, f"{key} written twice"
            self.data[key] = value
            self.cond.notify_all()

    def key_value_set(self, key, value):
        self.key_value_set_bytes(key, value.encode())

    def blocking_key_value_get_bytes(self, key, timeout_ms):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, timeout_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.data[key]

    def key_value_delete(self, key):
        with self.cond:
            self.data.pop(key)


class Exchanges:
    """`size` Exchange objects over one store, run side by side in threads."""

    def __init__(self, size=2, timeout_s=5):
        self.store = FakeStore()
        self.of = [Exchange(timeout_s, self.store) for _ in range(size)]
        for rank, ex in enumerate(self.of):
            ex.rank, ex.size = rank, size

    def run(self, fn):
        """fn(rank, exchange) in every 'process' at once; their results, or their errors."""
        out = [None] * len(self.of)

        def one(rank):
            try:
                out[rank] = fn(rank, self.of[rank])
            except Exception as e:  # noqa: BLE001 - compared by the test
                out[rank] = e

        threads = [threading.Thread(target=one, args=(r,)) for r in range(len(self.of))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


class CountingService:
    def __init__(self):
        self.calls = []
        self.name = "svc"

    def score(self, text):
        self.calls.append(text)
        if text == "bad":
            raise ValueError("the service refused 'bad'")
        return len(text)


def test_only_process_0_calls_the_service_and_every_process_gets_its_reply():
    ex = Exchanges(size=3)
    services = [CountingService() for _ in range(3)]

    def work(rank, e):
        svc = LeaderCalls(services[rank], e, "svc")
        got = [svc.score("ab"), svc.score("abcd")]
        with pytest.raises(ValueError, match="refused 'bad'"):  # the error reaches everyone
            svc.score("bad")
        return got, svc.name  # attributes are read locally

    assert ex.run(work) == [([2, 4], "svc")] * 3
    assert services[0].calls == ["ab", "abcd", "bad"]
    assert services[1].calls == services[2].calls == []


def test_agree_passes_equal_digests_and_names_the_processes_that_differ():
    ex = Exchanges(size=3)
    assert ex.run(lambda r, e: e.agree("same", "the memory")) == [None] * 3
    out = ex.run(lambda r, e: e.agree("b" * 12 if r == 2 else "a" * 12, "the memory"))
    assert all(isinstance(x, DivergenceError) for x in out)
    assert "the memory differs" in str(out[0]) and "processes [2]" in str(out[0])


def test_process_0_deletes_the_keys_everyone_has_passed():
    ex = Exchanges(size=2)

    def steps(rank, e):
        svc = LeaderCalls(CountingService(), e, "svc")
        for _ in range(5):
            svc.score("x")
            svc.score("yy")
            e.agree("d", "state")

    ex.run(steps)
    # only the last step's agreement keys remain (the followers may still be reading them)
    assert sorted(ex.store.data) == [f"rl_exchange/14/{r}" for r in range(2)]


def test_a_wait_for_a_silent_process_is_bounded_and_names_the_key():
    ex = Exchanges(size=2, timeout_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="mesh.wait_timeout_s"):
        ex.of[1].from_leader(lambda: 1)  # process 0 never answers
    assert time.perf_counter() - t0 < 2


# ------------------------------------------------------------------------------ bad settings


def test_gather_gives_every_process_all_values_by_process_index():
    ex = Exchanges(size=3)
    out = ex.run(lambda rank, e: e.gather({"rank": rank}, "a value"))
    assert out == [[{"rank": 0}, {"rank": 1}, {"rank": 2}]] * 3


def test_hosts_that_see_different_run_folders_stop_naming_the_key(tmp_path):
    """Process 0 writes a token with a fresh nonce into the run folder; a process whose
    folder is another (a local disk per host) cannot read it back: every process stops with
    an error naming trainer.run_dir and that process, and nothing is deleted."""
    shared = tmp_path / "shared"
    ok = Exchanges(size=2).run(lambda rank, e: check_shared(epath.Path(shared), e, wait_s=1))
    assert ok == [None, None] and (shared / TOKEN).read_text()
    (shared / "keep.txt").write_text("x")
    folders = [tmp_path / "host0", tmp_path / "host1"]
    out = Exchanges(size=2).run(
        lambda rank, e: check_shared(epath.Path(folders[rank]), e, wait_s=1))
    for err in out:
        assert isinstance(err, ConfigError), out
        assert "trainer.run_dir" in str(err) and "process(es) [1]" in str(err)
    assert (shared / "keep.txt").exists() and (folders[0] / TOKEN).exists()


@pytest.mark.parametrize("overrides, key", [
    (["mesh.coordinator=127.0.0.1:1", "mesh.num_processes=2", "mesh.process_id=2"],
     "mesh.process_id"),
    (["mesh.coordinator=127.0.0.1:1", "mesh.num_processes=2"], "mesh.num_processes"),
    (["mesh.coordinator=localhost", "mesh.num_processes=2", "mesh.process_id=0"],
     "mesh.coordinator"),
    (["mesh.num_processes=2", "mesh.process_id=1"], "mesh.coordinator"),
    (["mesh.heartbeat_timeout_s=0"], "mesh.heartbeat_timeout_s"),
])
def test_inconsistent_job_settings_are_refused_by_key_before_connecting(
        tmp_path, char_model, monkeypatch, overrides, key):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    cfg = make_cfg(tmp_path / "run", *LEARN, *overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_trainer(cfg)
    assert not (tmp_path / "run").exists()


def device_flags(devices: int) -> str:
    """XLA_FLAGS for a process of `devices` CPU devices, keeping the test run's other flags."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(run_dir: Path, devices: int, overrides: list[str], job: tuple[int, int, int] | None
           = None, log: Path | None = None, cluster: dict[str, str] | None = None
           ) -> subprocess.Popen:
    """``python -m rl.train`` on `devices` CPU devices; `job` = (port, processes, rank) as
    ``mesh.*`` keys, or `cluster`: environment variables of a cluster JAX detects."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=device_flags(devices), **(cluster or {}))
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    rank = job[2] if job else (cluster or {}).get("SLURM_PROCID", "")
    args = [f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}_hydra{rank}",
            "trainer.progress=false", "trainer.loggers=[]", *overrides]
    if job is not None:
        port, n, rank = job
        args += [f"mesh.coordinator=127.0.0.1:{port}", f"mesh.num_processes={n}",
                 f"mesh.process_id={rank}", "mesh.heartbeat_timeout_s=10"]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed by the child
    return subprocess.Popen([sys.executable, "-m", "tests.rl.train_entry", *args], cwd=ROOT,
                            env=env, stdout=out, stderr=subprocess.STDOUT)


def _finish(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 900) -> None:
    for p, log in zip(procs, logs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{log} did not finish in {timeout} s") from None
        assert rc == 0, f"{log} exited {rc}:\n{log.read_text()[-4000:]}"


def _two_processes(tmp_path: Path, overrides: list[str], leg: str = "") -> Path:
    run, port = tmp_path / "two", _free_port()
    logs = [tmp_path / f"two{leg}_{r}.log" for r in range(2)]
    procs = [_train(run, 2, overrides, (port, 2, r), logs[r]) for r in range(2)]
    _finish(procs, logs)
    return run


def _one_process(tmp_path: Path, overrides: list[str]) -> Path:
    run, log = tmp_path / "one", tmp_path / "one.log"
    _finish([_train(run, 4, overrides, None, log)], [log])
    return run


def _max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _final_params(run: Path, model_path: str):
    _, like, _ = load_params(model_path)
    params, step = restore_run_params(run, like)
    return params, step


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_processes_train_the_same_weights_as_one(tmp_path, char_model):
    """GRPO with a KL term (the reference pass runs) over 2 steps that update the weights, on
    a mesh of 2 data-parallel x 2 FSDP shards laid over both processes' devices; the
    2-process job stops after step 1 and resumes from its checkpoint under another mesh
    shape, 4 FSDP shards (saved and restored by both processes, each its shards, verified by
    their layout-free sums). The 1-process run has the first mesh on 4 devices."""
    overrides = ["model=hf", f"model.path={char_model}", *LEARN, "algo.beta=0.05",
                 "trainer.max_steps=2", "trainer.batch_prompts=4", "algo.group_size=4",
                 "trainer.max_new_tokens=8", "optim.lr=5e-2", "trainer.eval_at_ends=false",
                 "trainer.save_every=1", "trainer.skip_zero_advantage=false"]
    first = [*overrides, "mesh.shape={data:2,fsdp:2,tensor:1}"]
    _two_processes(tmp_path, [*first, "trainer.max_steps=1"], leg="_first")
    two = _two_processes(tmp_path, [*overrides, "mesh.shape={data:1,fsdp:4,tensor:1}",
                                    "trainer.resume=true"])
    one = _one_process(tmp_path, first)
    (p2, s2), (p1, s1) = _final_params(two, str(char_model)), _final_params(one, str(char_model))
    _, start, _ = load_params(str(char_model))
    assert s1 == s2 == 2
    assert _max_abs_diff(p1, start) > 1e-3  # the updates moved the weights
    assert _max_abs_diff(p1, p2) <= 1e-5
    # process 0 alone wrote the run folder: one record per step, as in the 1-process run
    assert [r["step"] for r in _lines(two / "metrics.jsonl")] == [0, 1]
    r1, r2 = _lines(one / "metrics.jsonl"), _lines(two / "metrics.jsonl")
    for a, b in zip(r1, r2):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6)
    history = _lines(two / "config_history.jsonl")
    assert [h["resumed"] for h in history] == [False, True]
    starts = _lines(two / "provenance.jsonl")  # process 0's record of every process's host
    assert [p["start_step"] for p in starts] == [0, 1]
    assert [h["process"] for h in starts[1]["hosts"]] == [0, 1]
    assert starts[1]["devices"] | {"kind": None} == {"platform": "cpu", "kind": None,
                                                     "count": 4, "local_count": 2,
                                                     "processes": 2}


def test_two_processes_find_each_other_from_slurm_variables_alone(tmp_path, char_model):
    """No mesh.* keys, no JAX_COORDINATOR_ADDRESS: the job JAX's own cluster detection finds
    in SLURM's variables (a step of 2 tasks on localhost) trains; and a setting that needs one
    process is refused by key once the job is joined (its size came from no config key)."""
    port = _free_port()

    def slurm(rank: int) -> dict[str, str]:
        return {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank), "SLURM_STEP_NODELIST": "localhost",
                "JAX_COORDINATOR_PORT": str(port)}

    overrides = ["model=hf", f"model.path={char_model}", *LEARN, "trainer.max_steps=2",
                 "trainer.batch_prompts=4", "algo.group_size=4", "trainer.max_new_tokens=8",
                 "trainer.eval_at_ends=false", "trainer.save_every=0"]
    run = tmp_path / "run"
    logs = [tmp_path / f"p{r}.log" for r in range(2)]
    _finish([_train(run, 2, overrides, None, logs[r], slurm(r)) for r in range(2)], logs)
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [0, 1]
    for r, log in enumerate(logs):
        text = log.read_text()
        assert "(found by slurm)" in text and f"jax.distributed: process {r} of 2" in text

    logs = [tmp_path / f"off{r}.log" for r in range(2)]
    procs = [_train(tmp_path / "off", 2, [*overrides, "trainer.off_policy_steps=1"], None,
                    logs[r], slurm(r)) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] != [0, 0]
    assert "trainer.off_policy_steps: =1 runs the rollout on a second host thread, which a " \
           "multi-process job (jax.process_count()=2)" in logs[0].read_text()


def _memory(run: Path) -> dict:
    from rl.run.checkpoint import Checkpointer

    ckpt = Checkpointer(run / "checkpoints")
    try:
        return ckpt.read_meta(ckpt.latest_step())["reward_state"]
    finally:
        ckpt.close()


def _kill_process_1_after(run: Path, procs: list[subprocess.Popen], logs: list[Path],
                          lines: int) -> float:
    """Kill process 1 once the run has logged `lines` metrics records; process 0 must then
    end with an error naming the lost task. Returns how long process 0 took to end."""
    try:
        deadline = time.time() + 600
        while (not (run / "metrics.jsonl").exists()
               or len((run / "metrics.jsonl").read_text().splitlines()) < lines):
            assert procs[0].poll() is None, logs[0].read_text()[-3000:]
            assert time.time() < deadline, f"no {lines} steps finished in 600 s"
            time.sleep(0.5)
        procs[1].kill()
        t0 = time.time()
        rc = procs[0].wait(timeout=120)
        waited = time.time() - t0
    finally:
        for p in procs:
            p.kill()
    assert rc != 0
    text = logs[0].read_text()
    assert "heartbeat" in text or "another task died" in text, text[-3000:]
    return waited


def test_arbor_with_an_http_judge_sends_each_request_once(tmp_path):
    """ARBOR on the search task (scripted trajectories, as ``tests.rl.rewarders.test_arbor_e2e``: a
    random model never answers, so its memory would stay empty and the judge idle), FSDP over
    the job's 4 devices, a checkpoint every step. Process 1 is killed after 2 steps; the job
    started again resumes from its newest checkpoint (memory and judge cache included) and
    ends with the rubric memory, the memory's events and the weights of the uninterrupted
    1-process run, and the judge server has seen each distinct request once (process 0 sends
    it; what it answered before the kill comes from the cache)."""
    base = ["model=tiny", "mesh.shape={data:1,fsdp:4,tensor:1}", "task=search_qa",
            "task.name=search_qa_scripted", "algo=arbor",
            "algo.embedder=hashing", "algo.k_consol=4", "trainer.sample_every=1",
            "task.n_entities=200", "task.n_train=40", "task.n_dev=4", "task.n_test=4",
            f"task.cache_dir={tmp_path / 'world'}", "task.max_turns=1",
            "task.max_response_tokens=64", "task.max_obs_tokens=40", "trainer.batch_prompts=4",
            "algo.group_size=4", "trainer.max_new_tokens=16", "trainer.eval_at_ends=false",
            "trainer.save_every=1", "judge=openai", "judge.model=fake",
            "judge.api_key_env=null", "judge.timeout_s=20", "judge.max_retries=1"]
    runs, bodies = {"two": tmp_path / "two"}, {}
    with FakeJudgeServer() as srv:
        judged = [*base, f"judge.base_url={srv.base_url}",
                  f"judge.cache_dir={tmp_path / 'cache_two'}"]
        port, logs = _free_port(), [tmp_path / f"killed_{r}.log" for r in range(2)]
        procs = [_train(runs["two"], 2, [*judged, "trainer.max_steps=200"], (port, 2, r),
                        logs[r]) for r in range(2)]
        _kill_process_1_after(runs["two"], procs, logs, lines=2)
        steps = len((runs["two"] / "metrics.jsonl").read_text().splitlines()) + 1
        _two_processes(tmp_path, [*judged, f"trainer.max_steps={steps}",
                                  "trainer.resume=true"], leg="_resumed")
        bodies["two"] = Counter(srv.bodies)
    with FakeJudgeServer() as srv:
        runs["one"] = _one_process(tmp_path, [*base, f"judge.base_url={srv.base_url}",
                                              f"judge.cache_dir={tmp_path / 'cache_one'}",
                                              f"trainer.max_steps={steps}"])
        bodies["one"] = Counter(srv.bodies)
    assert sum(bodies["one"].values()) > 0
    assert max(bodies["two"].values()) == 1  # each distinct request once
    assert bodies["two"] == bodies["one"]
    memory = _memory(runs["two"])
    assert memory == _memory(runs["one"])
    # the memory's decisions, step by step (the fake judge's verdicts leave no variance, so
    # its drafts are rejected at the gate: the same rejections in both runs)
    events = _lines(runs["two"] / "memory_events.jsonl")
    assert len(events) >= 4 and events == _lines(runs["one"] / "memory_events.jsonl")
    assert [h["resumed"] for h in _lines(runs["two"] / "config_history.jsonl")] == [False, True]
    assert [r["step"] for r in _lines(runs["two"] / "metrics.jsonl")] == list(range(steps))
    (p2, s2), (p1, s1) = _final_params(runs["two"], "tiny"), _final_params(runs["one"], "tiny")
    assert s1 == s2 == steps
    assert _max_abs_diff(p1, p2) <= 1e-5


def test_a_killed_process_ends_the_job_in_bounded_time_and_the_job_resumes(tmp_path,
                                                                           char_model):
    """GRPO with a KL term, FSDP over both processes, a checkpoint every step: process 1 is
    killed mid-run; process 0 ends with an error naming the lost task within the heartbeat
    timeout. The job started again resumes from the newest checkpoint that verifies (one cut
    off by the kill is set aside) and ends with the weights of an uninterrupted 1-process
    run."""
    overrides = ["model=hf", f"model.path={char_model}", *LEARN, "algo.beta=0.05",
                 "mesh.shape={data:1,fsdp:4,tensor:1}", "optim.lr=5e-2",
                 "trainer.batch_prompts=4", "algo.group_size=4", "trainer.max_new_tokens=8",
                 "trainer.eval_at_ends=false", "trainer.save_every=1",
                 "trainer.skip_zero_advantage=false"]
    run, port = tmp_path / "two", _free_port()
    logs = [tmp_path / f"p{r}.log" for r in range(2)]
    procs = [_train(run, 2, [*overrides, "trainer.max_steps=400"], (port, 2, r), logs[r])
             for r in range(2)]
    waited = _kill_process_1_after(run, procs, logs, lines=2)
    assert waited < 60  # heartbeat_timeout_s=10 plus the service's polling
    # started again: it resumes where the checkpoints end and trains to the end
    steps = len((run / "metrics.jsonl").read_text().splitlines()) + 2
    _two_processes(tmp_path, [*overrides, f"trainer.max_steps={steps}",
                              "trainer.resume=true"], leg="_resumed")
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == list(range(steps))
    assert [h["resumed"] for h in _lines(run / "config_history.jsonl")] == [False, True]
    one = _one_process(tmp_path, [*overrides, f"trainer.max_steps={steps}"])
    (p2, s2), (p1, s1) = _final_params(run, str(char_model)), _final_params(one, str(char_model))
    assert s1 == s2 == steps
    assert _max_abs_diff(p1, p2) <= 1e-5


def test_an_unreachable_coordinator_is_named_within_the_connect_timeout(tmp_path):
    log = tmp_path / "p1.log"
    t0 = time.time()
    proc = _train(tmp_path / "run", 2, ["model=tiny", "mesh.connect_timeout_s=3"],
                  (_free_port(), 2, 1), log)
    assert proc.wait(timeout=120) != 0
    assert time.time() - t0 < 60
    assert "mesh.coordinator: nothing answers at 127.0.0.1" in log.read_text()
    assert not (tmp_path / "run").exists()


SAMPLER_SCRIPT = """
import os, sys
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2")
os.environ["JAX_PLATFORMS"] = "cpu"
from core.cluster import join_cluster
join_cluster(f"127.0.0.1:{sys.argv[1]}", 2, int(sys.argv[2]), 60, 10)
import jax, numpy as np
import models.sampler as S
from core.search_r1 import search_prompt
from core.types import Prompt
from models import load_params
from models.continuation import Continuation
from models.sharding import make_mesh, param_shardings, shard
from rl.tasks.envs import SamplerPolicy
from rl.run.multihost import Exchange, shared_env
from rl.tasks.search.corpus import Doc
from rl.tasks.search.env import SearchEnv

assert len(jax.devices()) == 4 and len(jax.local_devices()) == 2
mesh = make_mesh({"data": 4})
cfg, params, tok = load_params("tiny", seed=3)
one = SamplerPolicy(cfg, params, tok)  # this process's first device alone: the reference
many = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok, mesh=mesh)

def same(a, b):
    assert a.token_lists() == b.token_lists() and a.finish == b.finish
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)

rows = [tok.encode(t) for t in ["hello", "a much longer prompt", "x"] for _ in range(3)]
sp = S.SamplingParams(10, temperature=0)
g1, gm = one.generate(rows, sp, 0), many.generate(rows, sp, 0)
same(g1, gm)
k = gm.state.cache.k[0]
assert not k.is_fully_addressable and len(k.addressable_shards) == 2  # rows stay spread
cont = Continuation([8, 0, 3, 4], [[5, 6, 7], [9] * 12, [], [11]])
c1, cm = one.continue_from(g1.state, cont, sp, 1), many.continue_from(gm.state, cont, sp, 1)
same(c1, cm)
assert not cm.state.cache.k[0].is_fully_addressable
print("SAMPLER_OK", flush=True)

class Retriever:
    def __init__(self):
        self.queries = []
    def retrieve(self, queries, topk=3):
        self.queries += list(queries)
        return [[Doc(id="d", title=q, text="about " + q, score=1.0)] * topk for q in queries]

questions = [Prompt(id=str(i), messages=({"role": "user", "content": search_prompt(q)},))
             for i, q in enumerate(["who?", "where is the big old tower of the city?"])]
local, job = Retriever(), Retriever()
kw = dict(topk=1, max_turns=2, max_response_tokens=120, chunk_tokens=5)
env1 = SearchEnv(tok, S.SamplingParams(12, temperature=0), local, **kw)
envm = shared_env(SearchEnv(tok, S.SamplingParams(12, temperature=0), job, **kw), Exchange(60))
r1, rm = env1.rollout(one, questions, 3, 3), envm.rollout(many, questions, 3, 3)
for g_one, g_many in zip(r1, rm):
    for a, b in zip(g_one.trajectories, g_many.trajectories):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask and a.info == b.info
assert any(t.info["turns"] > 1 for g in rm for t in g.trajectories)
# process 0 alone asked the retriever, the same queries as the 1-device rollout
assert job.queries == (local.queries if jax.process_index() == 0 else []), job.queries
print("SEARCH_ENV_OK", len(local.queries), flush=True)
"""


def test_sampler_and_search_env_over_two_processes_equal_one_device(tmp_path):
    """Generation, a continuation and a 2-turn search rollout (chunked decoding) on a mesh
    over 2 processes x 2 devices: greedy results equal each process's 1-device run, the KV
    cache stays spread over the processes between turns, and the retriever is asked once."""
    port, logs = _free_port(), [tmp_path / f"s{r}.log" for r in range(2)]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", SAMPLER_SCRIPT, str(port), str(r)],
                              cwd=ROOT, env=env, stdout=open(logs[r], "w"),  # noqa: SIM115
                              stderr=subprocess.STDOUT) for r in range(2)]
    for p, log in zip(procs, logs):
        assert p.wait(timeout=600) == 0, log.read_text()[-4000:]
        text = log.read_text()
        assert "SAMPLER_OK" in text and "SEARCH_ENV_OK" in text, text[-3000:]


LOAD_SCRIPT = """
import logging, os, sys
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2")
os.environ["JAX_PLATFORMS"] = "cpu"
from core.cluster import join_cluster
join_cluster(f"127.0.0.1:{sys.argv[1]}", 2, int(sys.argv[2]), 60, 10)
import jax, jax.numpy as jnp, numpy as np
from collections import Counter
from models import load_params, loaders
from models.sharding import make_mesh

assert len(jax.devices()) == 4 and len(jax.local_devices()) == 2
mesh = make_mesh({"data": 1, "fsdp": 4})
read_bytes = Counter()  # bytes this process read of each stored tensor
files_read = loaders.SafetensorsFiles.read
def counting(self, name, index):
    part = files_read(self, name, index)
    read_bytes[name] += part.size * 4  # the char model is stored in float32
    return part
loaders.SafetensorsFiles.read = counting

compiled = []  # any program compiled while loading (an all-gather would be one)
handler = logging.Handler()
handler.emit = lambda record: compiled.append(record.getMessage())
logging.getLogger("jax._src.interpreters.pxla").addHandler(handler)
jax.config.update("jax_log_compiles", True)
_, params, _ = load_params(sys.argv[3], jnp.float32, mesh=mesh)
jax.config.update("jax_log_compiles", False)
assert not [m for m in compiled if "Compiling" in m], compiled

loaders.SafetensorsFiles.read = files_read
weights = loaders.hf_weights(sys.argv[3])
_, whole = loaders.load_hf_folder(sys.argv[3])
is_leaf = lambda x: isinstance(x, loaders.LeafSource)
for leaf, array, ref in zip(jax.tree.leaves(weights.leaves, is_leaf=is_leaf),
                            jax.tree.leaves(params), jax.tree.leaves(whole)):
    stored = sum(int(np.prod(weights.files.shape(n))) * 4 for n in leaf.tensors)
    got = sum(read_bytes[n] for n in leaf.tensors)
    share = 1.0 if array.sharding.is_fully_replicated else 0.5  # 2 of the 4 fsdp shards
    assert got <= share * stored, (leaf.tensors[0], got, stored)
    for s in array.addressable_shards:  # every local shard holds the whole load's values
        np.testing.assert_array_equal(np.asarray(s.data), ref[s.index])
split = [a for a in jax.tree.leaves(params) if not a.sharding.is_fully_replicated]
assert len(split) >= 8, len(split)
print("LOAD_OK", sum(read_bytes.values()), flush=True)
"""


def test_each_process_reads_only_its_shards_of_the_weights(tmp_path, char_model):
    """fsdp over 2 processes x 2 devices: each process reads from the safetensors at most half
    of every split parameter's bytes (all of a replicated one), runs no program while
    loading (no all-gather), and its shards hold the whole-file load's values."""
    port, logs = _free_port(), [tmp_path / f"l{r}.log" for r in range(2)]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(port), str(r),
                               str(char_model)], cwd=ROOT, env=env,
                              stdout=open(logs[r], "w"),  # noqa: SIM115
                              stderr=subprocess.STDOUT) for r in range(2)]
    totals = []
    for p, log in zip(procs, logs):
        assert p.wait(timeout=300) == 0, log.read_text()[-4000:]
        text = log.read_text()
        assert "LOAD_OK" in text, text[-3000:]
        totals.append(int(text.split("LOAD_OK")[1].split()[0]))
    whole = (char_model / "model.safetensors").stat().st_size
    assert all(t < 0.75 * whole for t in totals), (totals, whole)


def test_the_smoke_command_passes_over_two_processes_with_fsdp_across_them(tmp_path,
                                                                         char_model):
    """``rl.smoke`` as a new slice runs it, here 2 processes x 2 CPU devices with FSDP over all
    4 (each process holds half of every split weight), GRPO with a KL reference: load sharded,
    3 steps straight against 2 steps + save + restore + 1 step, verdict PASS everywhere; and
    the job's final weights equal those of the same smoke in 1 process on 4 devices."""
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=device_flags(2))
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    run, logs = tmp_path / "smoke", [tmp_path / f"smoke{r}.log" for r in range(2)]
    args = ["model=hf", f"model.path={char_model}", "task=arith", "task.size=16",
            "trainer.batch_prompts=4", "algo.group_size=2", "trainer.max_new_tokens=8",
            "algo.beta=0.05", "optim.lr=5e-2", "mesh.shape={data:1,fsdp:4,tensor:1}",
            "trainer.progress=false", "trainer.loggers=[]", f"trainer.run_dir={run}",
            f"mesh.coordinator=127.0.0.1:{port}", "mesh.num_processes=2",
            "mesh.heartbeat_timeout_s=10"]
    procs = [subprocess.Popen([sys.executable, "-m", "rl.smoke", *args, f"mesh.process_id={r}",
                               f"hydra.run.dir={run}_hydra{r}"], cwd=ROOT, env=env,
                              stdout=open(logs[r], "w"),  # noqa: SIM115
                              stderr=subprocess.STDOUT) for r in range(2)]
    _finish(procs, logs, timeout=600)
    for log in logs:
        text = log.read_text()
        assert "on 2 process(es), 4 cpu device(s)" in text and "fsdp=4" in text, text[-3000:]
        assert "rl.smoke: PASS" in text, text[-3000:]
    result = json.loads((run / "smoke.json").read_text())
    assert result["passed"] and result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    # each process's two devices, printed (the devices of every process, by process)
    assert [len(d.split(", ")) for d in result["process_devices"]] == [2, 2]
    assert f"process 1: devices {result['process_devices'][1]}" in text
    assert len(result["straight_step_s"]) == 3
    # the same smoke in 1 process on 4 devices: its saved-and-resumed run ends where the
    # 2-process job's does
    one, log = tmp_path / "smoke_one", tmp_path / "smoke_one.log"
    single = [a for a in args if not a.startswith(("mesh.coordinator", "mesh.num_processes",
                                                   "trainer.run_dir"))]
    env_one = dict(env, XLA_FLAGS=device_flags(4))
    proc = subprocess.Popen([sys.executable, "-m", "rl.smoke", *single, f"trainer.run_dir={one}",
                             f"hydra.run.dir={one}_hydra"], cwd=ROOT, env=env_one,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    _finish([proc], [log], timeout=600)
    (p2, s2), (p1, s1) = (_final_params(run / "resumed", str(char_model)),
                          _final_params(one / "resumed", str(char_model)))
    assert s1 == s2 == 3
    assert _max_abs_diff(p1, p2) <= 1e-5


def test_a_shard_failing_on_one_process_makes_every_process_fall_back(tmp_path, char_model):
    """FSDP over 2 processes x 2 devices: each process checksums the shards it holds and the
    checkpoint records both processes' digests. A digest of a shard only process 1 holds is
    changed in the newest checkpoint: process 1 finds it on restore, and both processes
    resume from the previous checkpoint together; process 0 alone moves the broken one aside.
    The folder carries process 0's token."""
    overrides = ["model=hf", f"model.path={char_model}", *LEARN, "trainer.batch_prompts=4",
                 "algo.group_size=2", "trainer.max_new_tokens=8", "trainer.eval_at_ends=false",
                 "mesh.shape={data:1,fsdp:4,tensor:1}", "trainer.save_every=1",
                 "trainer.keep_checkpoints=all", "trainer.skip_zero_advantage=false"]
    run = _two_processes(tmp_path, [*overrides, "trainer.max_steps=2"], leg="_first")
    assert (run / TOKEN).exists()
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    newest = steps[-1]
    meta_file = next(p for p in (run / "checkpoints" / str(newest) / "meta").rglob("*")
                     if p.is_file() and p.read_text().lstrip().startswith("{"))
    meta = json.loads(meta_file.read_text())
    arrays = meta["integrity"]["arrays"]
    spread = {k: v["shards"] for k, v in arrays.items() if isinstance(v, dict)}
    assert spread and all(set(v) == {"0", "1"} for v in spread.values())
    key, hosts = next((k, v) for k, v in spread.items() if set(v["1"]) - set(v["0"]))
    index = sorted(set(hosts["1"]) - set(hosts["0"]))[0]
    arrays[key]["shards"]["1"][index] = "0" * 64
    meta_file.write_text(json.dumps(meta))
    _two_processes(tmp_path, [*overrides, "trainer.max_steps=3", "trainer.resume=true"])
    for r in range(2):
        text = (tmp_path / f"two_{r}.log").read_text()
        assert f"fails its checksum on process 1 (shard(s) {index})" in text, text[-3000:]
        assert f"Resuming from step {steps[-2]} instead" in text, text[-3000:]
    assert (run / "checkpoints_corrupt" / str(newest)).is_dir()
    assert not (run / "checkpoints_corrupt" / f"{newest}.1").exists()  # moved once
    assert [r["step"] for r in _lines(run / "metrics.jsonl")][-1] == 2
    # resumed under another mesh shape, whose shards cut the arrays otherwise: a changed
    # layout-free sum in the newest checkpoint makes both processes fall back again
    newest = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    meta_file = next(p for p in (run / "checkpoints" / str(newest) / "meta").rglob("*")
                     if p.is_file() and p.read_text().lstrip().startswith("{"))
    meta = json.loads(meta_file.read_text())
    sums = meta["integrity"]["arrays"][key]["sums"]
    sums[index] = f"{(int(sums[index], 16) + 1) % 2**64:016x}"
    meta_file.write_text(json.dumps(meta))
    other = [o for o in overrides if not o.startswith("mesh.shape")]
    _two_processes(tmp_path, [*other, "mesh.shape={data:2,fsdp:2,tensor:1}",
                              "trainer.max_steps=4", "trainer.resume=true"], leg="_other_mesh")
    for r in range(2):
        text = (tmp_path / f"two_other_mesh_{r}.log").read_text()
        assert f"array {key} fails its checksum over the shards of every process" in text, \
            text[-3000:]
        assert f"Resuming from step {newest - 1} instead" in text, text[-3000:]
    assert [r["step"] for r in _lines(run / "metrics.jsonl")][-1] == 3
