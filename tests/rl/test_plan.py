"""``python -m rl.plan``: the step's programs compiled ahead of time for a topology (#17 item
6). The plans run in subprocesses: compiling for a TPU topology (libtpu) stays apart from the
test process's CPU JAX, and the 8-device CPU mesh needs its own XLA_FLAGS."""

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.types import Group, Trajectory
from models.presets import tiny_config
from models.shapes import SHAPE_PRESETS, model_shapes
from models.transformer import forward, init_params
from rl.grpo.batch import build_batch
from rl.plan import (
    CHIPS,
    Affine,
    Chip,
    Layout,
    Plan,
    Program,
    RolloutFit,
    Sizes,
    _row,
    abstract_params,
    abstract_state,
    affine_fit,
    batch_groups,
    compiled_program,
    continue_programs,
    decode_flops,
    even_micro_batches,
    fit_line,
    forward_flops,
    gathered_per_step,
    header,
    largest_batch,
    make_plan,
    prefill_flops,
    refused_sizes,
    remedies,
    report,
    rollout_advice,
    rollout_fit,
    sampler_rows,
    second_batch,
    startup_row,
    time_bound,
    update_flops,
    verdict,
)
from rl.run.config import ConfigError, parse_plan
from tests.paths import CONF, ROOT

PROGRAMS = ("prefill", "decode", "reference", "update")
TINY = ["model=tiny", "trainer.batch_prompts=4", "plan.prompt_len=20", "plan.response_budget=24"]
NEEDS_LIBTPU = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[tpu-plan]'): no TPU topology to compile for")
ROW = re.compile(r"^\s+(prefill|decode|reference|update)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                 r"([\d.]+)\s+([\d.]+)\s+(\d+)%\s+([\d.e+]+)\s")


def _plan_cli(*overrides: str, devices: int | None = None, timeout: int = 600):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run([sys.executable, "-m", "rl.plan", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _rows(stdout: str) -> dict[str, tuple[float, ...]]:
    rows = {}
    for line in stdout.splitlines():
        if m := ROW.match(line):
            rows[m.group(1)] = tuple(float(x) for x in m.groups()[1:])
    return rows


def _check_table(stdout: str) -> None:
    rows = _rows(stdout)
    assert set(rows) == set(PROGRAMS), stdout
    for name, (args, temp, out, total, peak, _share, flops) in rows.items():
        assert args > 0 and flops > 0, (name, stdout)
        assert peak >= total, (name, stdout)
        # the printed total is arguments + temporaries + outputs less the donated aliases
        assert total <= args + temp + out + 0.002, (name, stdout)


def test_plan_of_the_tiny_model_on_an_8_device_cpu_mesh():
    proc = _plan_cli(*TINY, "plan.topology=cpu", devices=8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "on cpu: 8 chips" in out and "mesh data=8 fsdp=1 tensor=1" in out, out
    # 4 prompts x 4 = 16 trajectories cut into 8 data-parallel slices: 8 groups of 2
    assert "4 prompts x 4 = 16 trajectories" in out and "8 groups x 2" in out, out
    assert "prompt 32 tokens, response budget 32" in out, out  # rounded as rl.grpo.batch pads
    _check_table(out)
    assert re.search(r"^  start-up\s+[\d.]+\s+0\.000\s", out, re.M), out
    assert "verdict: fits" in out, out
    assert "float32 KV cache" in out, out
    # one host: one granule, nothing over a network between nodes
    assert "network: 1 node(s); mesh axes across them: none" in out, out
    assert re.search(r"over host memory, 0\.00 GiB over the network between them", out), out
    # the evaluation during training (trainer.eval_at_ends): its own rows
    for name in ("eval prefill", "eval decode"):
        assert re.search(rf"^  {name}\s+[\d.]+\s+[\d.]+\s", out, re.M), out
    # progress: a line before and after each compile (a large slice compiles for an hour)
    for name in PROGRAMS:
        assert re.search(rf"^rl\.plan: compiling {name} \.\.\.\n(.*\n)*rl\.plan: "
                         rf"compiled {name} in \d+ s$", out, re.M), out
    # the fit: 16 and 8 trajectories compiled (second_batch: half of 4 prompts, in units of
    # lcm(8, 4) / 4 = 2), then the predicted batch, a multiple of lcm(8 shards, 4) = 8
    m = re.search(r"rollout: largest rollout batch that fits: (\d+) trajectories \((\d+) "
                  r"prompts x 4; prefill [\d.]+ GiB, decode [\d.]+ GiB per chip; .*the "
                  r"rollout compiled at 16, 8, ", out, re.M)
    assert m and int(m.group(1)) % 8 == 0 and int(m.group(1)) > 16, out
    bf16 = _plan_cli(*TINY, "plan.topology=cpu", "trainer.kv_cache_dtype=bfloat16",
                     "plan.rollout_fit=false", devices=8)
    assert bf16.returncode == 0, bf16.stderr[-3000:]
    assert "bfloat16 KV cache" in bf16.stdout, bf16.stdout
    assert "largest rollout batch" not in bf16.stdout  # plan.rollout_fit=false: not searched
    # the prefill's output is the 16 rows' cache: keys and values of 2 layers x 2 KV heads x
    # 16 dims x 64 slots, float32 -> bfloat16 halves it (the logits stay float32)
    cache32 = 16 * 2 * 2 * (2 * 16 * 64) * 4 / 2**30 / 8
    out32, out16 = _rows(out)["prefill"][2], _rows(bf16.stdout)["prefill"][2]
    assert out32 - out16 == pytest.approx(cache32 / 2, abs=0.002), (out32, out16)


@NEEDS_LIBTPU
def test_plan_of_the_tiny_model_on_a_v5e_2x2_slice():
    # no batch search (plan.rollout_fit, checked on the CPU mesh above): a tiny model's
    # largest batch is 66,000 trajectories, and the TPU compiler took 150 s for each program
    # near the HBM limit (16 min in all, libtpu 0.0.42.1 on the 2-core AMD EPYC)
    proc = _plan_cli(*TINY, "plan.topology=v5e:2x2", "mesh=fsdp", "plan.rollout_fit=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "on v5e:2x2: 4 chips, TPU v5e: 16 GiB HBM, 197 TFLOP/s bf16, 819 GB/s" in out, out
    assert "mesh data=1 fsdp=4 tensor=1" in out, out
    _check_table(out)
    assert "verdict: fits: every program this config runs is within 16.0 GiB per chip" in out, out
    # a multi-turn task: the continuation's programs for TPU, the read compiled with its own
    # options (models.continuation.TPU_READ_OPTIONS: libtpu must accept them) and a read
    # block wider than the whole cache
    multi = _plan_cli(*TINY, "task=search_qa", "plan.topology=v5e:2x2", "mesh=fsdp",
                      "plan.rollout_fit=false")
    assert multi.returncode == 0, multi.stderr[-3000:]
    for name in ("read", "continue", "part"):
        assert re.search(rf"^  {name}\s+[\d.]+\s+[\d.]+\s", multi.stdout, re.M), multi.stdout
    assert "verdict: fits" in multi.stdout, multi.stdout


@NEEDS_LIBTPU
def test_a_multi_slice_plan_puts_data_across_the_slices():
    """plan.slices=2: two v5e 2x2 slices (libtpu's devices carry their slice_index); data 2
    goes across them, fsdp 4 stays inside one, so only the data all-reduce crosses the
    network."""
    proc = _plan_cli(*TINY, "plan.topology=v5e:2x2", "plan.slices=2", "plan.rollout_fit=false",
                     "mesh.shape={data:2,fsdp:4,tensor:1}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "network: 2 slice(s); mesh axes across them: data=2 (mesh.dcn_shape)" in out, out
    assert re.search(r"update weight gathers \(fsdp\) [\d.]+ MiB / 0\.00 GiB", out), out
    assert re.search(r"gradient all-reduce \(data\) 0\.00 GiB / [\d.]+ MiB", out), out


def test_unknown_topology_is_refused_naming_the_key_before_any_compute():
    proc = _plan_cli(*TINY, "plan.topology=v9z:4x4", timeout=120)
    assert proc.returncode != 0
    assert "plan.topology: unknown topology 'v9z:4x4'" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not _rows(proc.stdout)


def _config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("plan", overrides=["trainer.run_dir=unused", *TINY, *overrides])
    return parse_plan(OmegaConf.to_container(cfg, resolve=True))


@pytest.mark.parametrize("name", ["v5e", "v5e:4", "tpu:4x4", "v5e:4x4x4x4", "V5E:4x4"])
def test_malformed_topology_names_are_refused(name, monkeypatch):
    def no_compile(*a, **k):
        raise AssertionError("compiled before the topology was checked")

    monkeypatch.setattr("rl.plan.model_shapes", no_compile)
    run, plan = _config(f"plan.topology={name}")
    with pytest.raises(ConfigError, match=r"^plan\.topology: unknown topology"):
        make_plan(run, plan)


def test_plan_keys_are_checked():
    with pytest.raises(ConfigError, match=r"plan\.response_budget: must be >= 1"):
        _config("plan.response_budget=0")
    with pytest.raises(ConfigError, match=r"plan\.colour: unknown key"):
        _config("+plan.colour=red")


def test_the_layout_is_rl_batchs_filler_groups_included():
    """64 x 5 trajectories, 8 micro-batches, 16 data-parallel shards: 128 slices. 320 is not
    a multiple of 128, so rl.grpo.batch.build_batch adds -64 % 128 = 64 filler groups of 5, and 128
    groups of 5 cut into 128 slices (a test of the real build_batch checks the same)."""
    assert batch_groups(64, 5, 128) == (128, 5, 64)
    # 4 micro-batches: 64 slices of 64 groups of 5, no filler; 8 prompts x 4 over 32 slices:
    # sub-groups of 1 (32 of them)
    assert batch_groups(64, 5, 64) == (64, 5, 0)
    assert batch_groups(8, 4, 32) == (32, 1, 0)
    traj = Trajectory(prompt_tokens=(1, 2, 3), tokens=(4, 5), loss_mask=(1, 1),
                      logprobs=(0.0, 0.0), text="", finish="eos")
    groups = [Group(prompt=None, trajectories=(traj,) * 5) for _ in range(64)]
    built = build_batch(groups, np.zeros((64, 5)), pad_id=0, resp_len=16, slices=128)
    assert built["tokens"].shape[:2] == (128, 5)


def test_the_micro_batch_count_that_leaves_no_filler_by_hand():
    """Search-R1's 512 x 5 in 2 mini-batches: on 16 shards 1,280 / 16 = 80 rows per shard cut
    into 16 micro-batches of 5; on 128 shards 10 rows per shard, so 16 micro-batches need
    filler (2 x 16 x 128 = 4,096 slices > 2,560 rows) and 10 (one row each) is the largest
    count <= 16 that divides 10; on 32 shards 40 rows: 10 (8 and 5 divide 40 too, 10 is the
    largest). 64 x 5 on 64 shards: 5 rows per shard, only 1 of 1..4 divides 5. On 128
    shards no count cuts 320 rows evenly; 1 adds the fewest filler groups (64, to 128 groups
    of 5, against 192 for 2 and 448 for 4)."""
    assert even_micro_batches(512, 5, 2, 16, 16) == 16
    assert even_micro_batches(512, 5, 2, 128, 16) == 10
    assert even_micro_batches(512, 5, 2, 32, 16) == 10
    assert even_micro_batches(64, 5, 1, 64, 4) == 1
    assert even_micro_batches(64, 5, 1, 128, 4) == 1
    assert [batch_groups(64, 5, m * 128)[2] for m in (1, 2, 4)] == [64, 192, 448]


def test_a_layout_with_filler_names_the_micro_batch_count_that_has_none():
    """8 prompts x 5 = 40 rows on the fake plan's 4 shards: 20 micro-batches need 80 slices
    (-8 % 80 = 72 filler groups); no count in 21..160 divides 40 / 4 = 10 rows per shard, 10
    does (one row each)."""
    run, _ = _config("trainer.batch_prompts=8", "algo.group_size=5",
                     "trainer.micro_batches=20")
    plan = _fake_plan(run, update_gib=20.0)
    groups, size, filler = batch_groups(8, 5, 80)
    assert filler == 72
    plan = dataclasses.replace(plan, lay=dataclasses.replace(
        plan.lay, rows=40, groups=groups, size=size, filler=filler))
    assert "trainer.micro_batches=10" in remedies(run, plan, "update")[0]
    line = next(x for x in header(run, plan) if "filler" in x)
    assert "adds 72 filler group(s)" in line and "trainer.micro_batches=10 cuts it evenly" in line


# ------------------------------------------------------------------------------ FLOPs by hand

# tiny_config(): d=64, f=128, L=2, h=4, kv=2, hd=16, V=49152. Layer matmul parameters:
# M = L (d hd (h + 2 kv) + h hd d + 3 d f) = 2 (64*16*8 + 4*16*64 + 3*64*128) = 73,728


def test_forward_flops_by_hand():
    cfg = tiny_config()
    layers, attention, output = forward_flops(cfg, tokens=10, scored_keys=100, logit_rows=3)
    assert layers == 2 * 73_728 * 10                 # 1,474,560
    assert attention == 4 * 2 * 4 * 16 * 100         # 4 L h hd K = 51,200
    assert output == 2 * 64 * 49_152 * 3             # 18,874,368


def test_update_prefill_and_decode_flops_by_hand():
    cfg = tiny_config()
    # 1 group of 2 continuations of 3 tokens after a 4-token prompt: 4 + 6 = 10 tokens
    # through the layers, 4*4 prompt + 6*(4+3) continuation (query, key) pairs = 58, 6 logits
    fwd_layers, fwd_attn, fwd_out = 2 * 73_728 * 10, 4 * 2 * 4 * 16 * 58, 2 * 64 * 49_152 * 6
    fwd = fwd_layers + fwd_attn + fwd_out
    assert update_flops(cfg, 1, 2, 4, 3, remat=False) == 3 * fwd + fwd_attn
    assert update_flops(cfg, 1, 2, 4, 3, remat=True) == 3 * fwd + fwd_attn + fwd_layers
    lay = Layout(prompts=2, rows=6, groups=2, size=3, prompt=32, response=16, mini_batches=1)
    # prefill: 2 prompts x 32 tokens against 48 cache slots; logits for the 6 rows
    assert prefill_flops(cfg, lay) == (2 * 73_728 * 64 + 4 * 2 * 4 * 16 * 64 * 48
                                       + 2 * 64 * 49_152 * 6)
    # decode: 6 rows x 16 steps, every step scoring 48 slots and computing logits
    assert decode_flops(cfg, lay) == (2 * 73_728 * 96 + 4 * 2 * 4 * 16 * 96 * 48
                                      + 2 * 64 * 49_152 * 96)


def test_forward_flops_agree_with_xla_on_an_unscanned_model():
    """With one layer, cost_analysis's count of the scan body is the whole forward: the
    derived matmul FLOPs are within the elementwise work (norms, softmax, RoPE) of XLA's."""
    cfg = tiny_config(num_layers=1, vocab_size=4096)
    params = init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((2, 64), jnp.int32)
    cost = jax.jit(lambda p, t: forward(cfg, p, t)).lower(params, tokens).compile()
    cost = cost.cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    derived = sum(forward_flops(cfg, tokens=128, scored_keys=2 * 64 * 64, logit_rows=128))
    assert 1.0 <= xla / derived < 1.15, (xla, derived)


# ------------------------------------------------------------------------------ verdicts


def _fake_plan(run, update_gib: float) -> Plan:
    """A plan of 16 v5e chips meshed data=2 x fsdp=2 (4 data-parallel shards) whose update
    needs 1 GiB of arguments and `update_gib` of temporaries."""
    g = 2**30
    progs = tuple(Program(n, g, int(update_gib * g) if n == "update" else 0, 0, 0, 0, 1e12,
                          1e9, True) for n in PROGRAMS)
    lay = Layout(prompts=8, rows=32, groups=8, size=4, prompt=32, response=32, mini_batches=1)
    return Plan("tiny", tiny_config(), "v5e:4x4", CHIPS["v5e"], 16,
                {"data": 2, "fsdp": 2, "tensor": 1}, lay, 0, 0, progs)


def test_verdict_names_what_does_not_fit_and_the_keys_that_help():
    # 8 prompts x 4 over 4 shards: micro_batches=3 would need 12 equal slices of 8 groups
    # (sub-groups of 4, 2 or 1: 8, 16 or 32 of them, none a multiple of 12), 4 needs 16
    # (sub-groups of 2); 4 prompts still split into 2 x 4 = 8 slices; 2 mini-batches: 16
    run, _ = _config("trainer.batch_prompts=8", "trainer.micro_batches=2")
    text = verdict(run, _fake_plan(run, update_gib=20.0))
    assert text.startswith("verdict: update does NOT fit: 21.00 GiB per chip"), text
    assert "> 16.0 GiB; try" in text
    for key in ("trainer.micro_batches=4", "trainer.remat=true", "trainer.mini_batches=2",
                "mesh.shape={data:1,fsdp:16,tensor:1}", "trainer.batch_prompts=4"):
        assert key in text, (key, text)
    assert "trainer.micro_batches=3" not in text and "prefill" not in text
    assert verdict(run, _fake_plan(run, update_gib=1.0)).startswith("verdict: fits")


def test_a_gpu_plan_is_an_estimate_held_against_jaxs_share_of_the_gpus_memory(monkeypatch):
    """plan.topology=h100:8 / h200:8: the programs compiled for a TPU v5p slice of as many
    chips stand in for the GPUs (no GPU compiler without a GPU); the verdict holds them
    against JAX's preallocated share of NVIDIA's memory figure (81,559 / 143,771 MiB as
    nvidia-smi reports the 80 GB and 141 GB parts; XLA_PYTHON_CLIENT_MEM_FRACTION, .75 by
    default) and says it is an estimate."""
    from rl.plan import GPUS, check_topology, stand_in_topology

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # libtpu "there"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    h100 = check_topology("h100:8")
    assert h100.usable == 0.75 * 81559 * 2**20 and h100.hbm_bytes == GPUS["h100"].hbm_bytes
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".95")
    assert check_topology("h200:16").usable == pytest.approx(0.95 * 143771 * 2**20)
    # one stand-in slice per node of 8: h200:16 is two of them
    assert (stand_in_topology("h100:8"), stand_in_topology("h200:16")) == ("v5p:2x2x2",
                                                                           "v5p:2x2x2")
    assert stand_in_topology("v5e:4x4") is None
    with pytest.raises(ConfigError, match=r"plan.topology: h100:6: .* multiples of 4"):
        check_topology("h100:6")
    with pytest.raises(ConfigError, match=r"unknown topology 'a100:8'.*h100:8, an estimate"):
        check_topology("a100:8")
    run, _ = _config("trainer.batch_prompts=8")
    plan = dataclasses.replace(_fake_plan(run, update_gib=70.0), topology="h200:8",
                               chip=check_topology("h200:8"), chips=8)
    # 71 GiB: within .95 x 140.4 GiB of an H200; refused by the 95 GiB stand-in or not
    refused = dataclasses.replace(plan.programs[3], refused="RESOURCE_EXHAUSTED: ...")
    plan = dataclasses.replace(plan, programs=(*plan.programs[:3], refused))
    text = verdict(run, plan).splitlines()
    assert text[0] == "verdict: fits: every program this config runs is within 133.4 GiB per chip"
    assert text[-1] == "verdict: an ESTIMATE (above): confirm on one GPU host with rl.smoke"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    h100_plan = dataclasses.replace(plan, topology="h100:8", chip=check_topology("h100:8"))
    text = verdict(run, h100_plan)  # 71 GiB > .75 x 79.6
    assert text.startswith("verdict: update does NOT fit: 71.00 GiB per chip (program 71.00 "
                           "+ resident 0.00) > 59.7 GiB; try"), text
    lines = header(run, h100_plan)
    assert lines[0].endswith("NVIDIA H100 SXM 80GB: 79.6 GiB HBM, 989 TFLOP/s bf16, 3350 GB/s "
                             "(NVIDIA datasheet); mesh data=2 fsdp=2 tensor=1"), lines[0]
    assert lines[1].startswith("  ESTIMATE: no GPU compiler runs here; the programs were "
                               "compiled by libtpu for a TPU slice of as many chips "
                               "(v5p:2x2x2)"), lines[1]
    assert "Held against 75% of each GPU's memory (59.7 GiB" in lines[1]


@NEEDS_LIBTPU  # the GPU estimate compiles for a TPU stand-in
def test_a_gpu_estimate_of_the_tiny_model_compiles_on_its_stand_in():
    proc = _plan_cli(*TINY, "plan.topology=h100:8", "mesh=gpu_8", "plan.rollout_fit=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "on h100:8: 8 chips, NVIDIA H100 SXM 80GB" in out and "(v5p:2x2x2)" in out, out
    _check_table(out)
    assert "verdict: an ESTIMATE" in out, out


def test_a_pass_the_config_does_not_run_does_not_spoil_the_fit():
    run, _ = _config("trainer.batch_prompts=8")
    plan = _fake_plan(run, update_gib=1.0)
    g = 2**30
    big = dataclasses.replace(plan.programs[2], temporaries=40 * g, runs=False)
    plan = dataclasses.replace(plan, programs=(*plan.programs[:2], big, plan.programs[3]))
    text = verdict(run, plan).splitlines()
    assert text[0] == "verdict: fits: every program this config runs is within 16.0 GiB per chip"
    assert text[1].startswith("verdict: reference would NOT fit if run (algo.beta > 0"), text


def test_the_sizes_of_a_tpu_out_of_memory_refusal_are_read_from_its_message():
    """The TPU compiler refuses a program larger than HBM instead of compiling it; the plan
    reports the sizes its message states (both forms libtpu 0.0.42 prints). Both state the
    whole program, arguments included: a program of 1 GiB of arguments and 2 GiB of
    temporaries, refused at 2.44 GiB, reads "HLO temporaries (3.00G)"."""
    g = 2**30
    temps = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
             "temporaries (197.53G) exceeds available HBM (15.75G).")
    sizes = refused_sizes(temps, arguments=2 * g)
    assert sizes.argument_size_in_bytes == 2 * g
    assert sizes.temp_size_in_bytes == int(197.53 * g) - 2 * g
    used = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
            "space hbm. Used 39.70G of 15.75G hbm. Exceeded hbm capacity by 23.95G.")
    sizes = refused_sizes(used, arguments=3 * g)
    assert sizes.argument_size_in_bytes + sizes.temp_size_in_bytes == int(39.70 * g)
    assert refused_sizes("RESOURCE_EXHAUSTED: something else", 0) is None


def test_a_programs_total_is_the_compilers_peak_where_it_states_one():
    """The TPU compiler's temp_size_in_bytes can count a buffer twice (the v5e-16 part program:
    9.97 GiB of temporaries reported, yet it compiled within a 12.5 GiB HBM limit; its peak
    11.94 GiB); the plan's total is the peak, the temporaries what it holds beyond the
    arguments and outputs. XLA:CPU's peak leaves out buffers (the CPU plan's part program
    below): there the sum stands."""
    g = 2**30
    on_tpu = SimpleNamespace(sharding=SimpleNamespace(device_set=[SimpleNamespace(platform="tpu")]))

    class Lowered:
        def __init__(self, sizes):
            self.sizes = sizes

        def compile(self):
            return SimpleNamespace(memory_analysis=lambda: self.sizes)

    def program(sizes, args=(on_tpu,)):
        return compiled_program("part", Lowered(sizes), args, resident=g, flops=1.0,
                                min_bytes=lambda m: 0.0)

    # 6.9 GiB of arguments, 6.34 of outputs all donated: 5.04 GiB beyond them at the peak
    part = program(Sizes(int(6.9 * g), int(9.97 * g), int(6.34 * g), int(6.34 * g),
                         int(11.94 * g)))
    assert part.temporaries == int(11.94 * g) - int(6.9 * g)
    assert part.total == int(11.94 * g) and part.peak == part.total + g
    # no peak stated (a refusal's sizes), or not on TPU: the sum
    for sizes, args in ((Sizes(2 * g, 3 * g, g, g), (on_tpu,)),
                        (Sizes(2 * g, 3 * g, g, g, 3 * g), (jnp.zeros(2),))):
        summed = program(sizes, args)
        assert summed.temporaries == 3 * g and summed.total == 5 * g


def test_rollout_remedies_offer_a_bfloat16_kv_cache_and_the_fitted_batch():
    run, _ = _config("trainer.batch_prompts=8")
    plan = _fake_plan(run, 1.0)
    assert "trainer.kv_cache_dtype=bfloat16 (half the KV cache)" in remedies(run, plan, "prefill")
    run16, _ = _config("trainer.batch_prompts=8", "trainer.kv_cache_dtype=bfloat16")
    assert not any("kv_cache_dtype" in k for k in remedies(run16, plan, "prefill"))
    # a fit of 16 trajectories = 4 prompts x 4 (4 prompts split over the fake plan's 4 shards)
    fit = RolloutFit(15.75 * 2**30, 4, 4, (), (Affine(0, 1),) * 2, 16)
    keys = remedies(run, dataclasses.replace(plan, fit=fit), "decode")
    assert "trainer.batch_prompts=4 (the largest rollout batch that fits)" in keys, keys
    # or the same 8 prompts in 2 sampler calls of 4 (the fewest parts within the fit)
    assert ("trainer.rollout_chunks=2 (the same batch, rolled out in 2 sampler calls of 4 "
            "prompts one after another)") in keys, keys
    assert keys.index(next(k for k in keys if "rollout_chunks" in k)) < keys.index(
        "trainer.batch_prompts=4 (the largest rollout batch that fits)")
    # fits of 3 prompts: 8 prompts in parts of at most 3 -> 4 parts of 2 (3 does not divide)
    fit3 = dataclasses.replace(fit, trajectories=12)
    assert any(k.startswith("trainer.rollout_chunks=4 ") for k in remedies(
        run, dataclasses.replace(plan, fit=fit3), "prefill"))
    assert any("task.max_obs_tokens" in k for k in remedies(run, plan, "continue"))
    assert not any("max_obs_tokens" in k for k in remedies(run, plan, "prefill"))
    # the gathered sub-batch's copy of the cache goes with the sub-batches: first for part
    assert remedies(run, plan, "part")[0].startswith("trainer.rollout_sub_batches=false")
    assert not any("sub_batches" in k for k in remedies(run, plan, "continue"))


def test_a_prefill_that_misses_is_offered_the_other_activation_layout():
    """The prefill's layout changes only its own memory: offered for the prefill, flipped
    from the config's, and for no other program."""
    run, _ = _config("trainer.batch_prompts=8")
    plan = _fake_plan(run, 1.0)
    assert run.trainer.prefill_pin_rows is True
    assert ("trainer.prefill_pin_rows=false (the prefill's other activation layout)"
            in remedies(run, plan, "prefill"))
    unpinned, _ = _config("trainer.batch_prompts=8", "trainer.prefill_pin_rows=false")
    assert any(k.startswith("trainer.prefill_pin_rows=true") for k in
               remedies(unpinned, plan, "prefill"))
    for name in ("decode", "reference", "update"):
        assert not any("prefill_pin_rows" in k for k in remedies(run, plan, name))


def test_rollout_remedies_offer_bfloat16_weights_only_when_float32():
    run, _ = _config()
    assert "trainer.rollout_dtype=bfloat16" in remedies(run, _fake_plan(run, 1.0), "decode")
    run, _ = _config("trainer.rollout_dtype=bfloat16")
    assert not any("rollout_dtype" in k for k in remedies(run, _fake_plan(run, 1.0), "decode"))


def test_chip_table_is_the_cloud_tpu_docs_figures():
    gib = 2**30
    # the last figure: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)"
    assert CHIPS["v5e"] == Chip("TPU v5e", 197e12, 16 * gib, 819e9, 400e9)
    assert CHIPS["v5p"] == Chip("TPU v5p", 459e12, 95 * gib, 2765e9, 1200e9)
    assert CHIPS["v4"] == Chip("TPU v4", 275e12, 32 * gib, 1200e9)
    assert CHIPS["v6e"] == Chip("TPU v6e", 918e12, 32 * gib, 1640e9, 800e9)


def test_the_decode_time_bound_counts_the_gathered_weights_by_hand():
    """A v5e decode of 100 steps gathering 80 MB of weights per step: 8 GB at 400 GB/s is
    20 ms, more than its FLOPs (1e12 / (4 x 197e12) = 1.3 ms) and HBM reads (1 GB / 819
    GB/s = 1.2 ms): the bound is the interconnect's."""
    decode = Program("decode", 0, 0, 0, 0, 0, 1e12, 1e9, True, ici_bytes=100 * 80e6)
    plan = Plan("m", None, "v5e:2x2", CHIPS["v5e"], 4, {"data": 1, "fsdp": 4, "tensor": 1},
                None, 0, 0, (decode,))
    assert time_bound(plan, decode) == pytest.approx(8e9 / 400e9)
    no_ici = dataclasses.replace(plan, chip=CHIPS["v4"])  # no ICI figure: the HBM floor
    assert time_bound(no_ici, decode) == pytest.approx(
        max(1e12 / (4 * 275e12), 1e9 / 1200e9))


# ------------------------------------------------------------------------------ shape presets

# (total, non-embedding) parameters in billions, as the Qwen3 model cards state them
MODEL_CARDS = {"qwen3_0_6b": (0.6, 0.44), "qwen3_1_7b": (1.7, 1.4), "qwen3_4b": (4.0, 3.6),
               "qwen3_8b": (8.2, 6.95), "qwen3_14b": (14.8, 13.2)}


@pytest.mark.parametrize("name", sorted(MODEL_CARDS))
def test_qwen3_presets_have_the_model_cards_parameter_counts(name):
    cfg = model_shapes(name)
    total, non_embedding = MODEL_CARDS[name]
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_embeddings else 2)
    assert cfg.arch == "qwen3" and cfg.qk_norm
    # to the cards' precision: half a unit of the last digit they print
    half = lambda x: 0.5 * 10 ** -len(str(x).split(".")[1])  # noqa: E731
    assert cfg.num_params / 1e9 == pytest.approx(total, abs=half(total))
    assert (cfg.num_params - embeddings) / 1e9 == pytest.approx(non_embedding,
                                                                abs=half(non_embedding))


def test_llama_preset_is_llama_3_1_8b():
    cfg = model_shapes("llama3_1_8b")
    assert cfg.arch == "llama" and cfg.rope_freq_factors is not None  # llama3 RoPE scaling
    assert cfg.num_params == 8_030_261_248  # the published safetensors' parameter count


def test_presets_and_unknown_shapes(tmp_path):
    assert {"tiny", "qwen3_4b", "qwen3_14b", "llama3_1_8b", "smollm2_135m"} <= set(
        SHAPE_PRESETS)
    assert model_shapes("smollm2_135m").num_params == 134_515_008  # SmolLM2-135M
    with pytest.raises(ValueError, match="neither a shape preset"):
        model_shapes(str(tmp_path / "nope"))


def test_a_mesh_that_does_not_divide_the_topology_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr("rl.plan.topology_devices", lambda name, slices=1: jax.devices() * 16)
    run, plan = _config("plan.topology=cpu", "mesh.shape={data: 3, fsdp: 1, tensor: 1}")
    with pytest.raises(ConfigError, match=r"^mesh\.shape: .*needs 3 devices, have 16"):
        make_plan(run, plan)


def test_the_header_says_how_many_filler_trajectories_the_update_computes():
    # 3 prompts x 2 = 6 trajectories over the fake plan's 2 x 2 = 4 shards: build_batch adds
    # -3 % 4 = 1 filler group of 2 (4 groups, one per slice)
    run, _ = _config("trainer.batch_prompts=3", "algo.group_size=2")
    plan = _fake_plan(run, update_gib=1.0)
    plan = dataclasses.replace(plan, lay=dataclasses.replace(plan.lay, filler=1, groups=4,
                                                             rows=6, prompts=3, size=2))
    text = "\n".join(header(run, plan))
    assert "filler: rl.grpo.batch adds 1 filler group(s) (loss mask 0) so that 6 trajectories " \
           "cut into 1 x 1 x 4 equal slices: the update computes 2 trajectories for " \
           "nothing" in text, text
    assert "filler" not in "\n".join(header(run, _fake_plan(run, 1.0)))


# ------------------------------------------------------------------------------ rollout fit

GIB = 2**30


def test_affine_fit_and_the_largest_batch_by_hand():
    # 5 GiB at 10 rows per shard, 7 GiB at 20: 0.2 GiB a row, 3 GiB fixed
    line = affine_fit(10, 5 * GIB, 20, 7 * GIB)
    assert line.per_row == pytest.approx(0.2 * GIB) and line.fixed == pytest.approx(3 * GIB)
    # against 15.75 GiB: (15.75 - 3) / 0.2 = 63.75 rows per shard (the other line allows
    # (15.75 - 4) / 0.1 = 117.5); x 16 shards = 1020 trajectories, in whole units of
    # lcm(16, 5) = 80: 960 (60 rows per shard: 15 GiB; 1040 would need 16 GiB)
    lines = [line, Affine(4 * GIB, 0.1 * GIB)]
    assert largest_batch(lines, 15.75 * GIB, shards=16, group=5) == 960
    assert largest_batch([Affine(16 * GIB, 0.1 * GIB)], 15.75 * GIB, 16, 5) == 0
    assert largest_batch([Affine(1 * GIB, 0.0)], 15.75 * GIB, 16, 5) == -1
    # 4 shards, groups of 2: units of 4 trajectories; (10 - 1) / 0.5 = 18 rows per shard,
    # 72 trajectories
    assert largest_batch([Affine(1.0, 0.5)], 10.0, shards=4, group=2) == 72


def test_the_rollout_layout_is_the_samplers():
    """rows per shard as models.sampler lays them out."""
    from models.sampler import _sharded_prompts

    for prompts, group, shards in ((64, 5, 16), (4, 3, 8), (3, 2, 4), (7, 4, 2)):
        lists = [[p + 1, 100] for p in range(prompts) for _ in range(group)]
        batch, _ = _sharded_prompts(lists, np.ones(len(lists), np.int32), shards, 0)
        assert batch.rows.shape == (shards, sampler_rows(prompts, group, shards))
    # by hand: 320 rows over 16 shards, 20 each; 12 rows over 8 shards, 2 each
    assert sampler_rows(64, 5, 16) == 20
    assert sampler_rows(4, 3, 8) == 2


def test_the_second_batch_of_the_fit():
    assert second_batch(64, 5, 16) == 32   # half, in units of lcm(16, 5) / 5 = 16 prompts
    assert second_batch(4, 4, 8) == 2      # units of lcm(8, 4) / 4 = 2
    assert second_batch(1, 4, 8) == 2      # half is none: twice, at least one unit
    assert second_batch(16, 5, 16) == 32   # half (8) is under a unit (16): twice


def test_the_fit_refines_a_prediction_that_does_not_fit(monkeypatch):
    """Peaks that grow faster than affinely (a quadratic term): the first prediction, from
    320 and 160 trajectories, overshoots; the lines through the closest batches that fit and
    do not then close in on the largest that fits, and the one above it is compiled too. The
    true answer by brute force over multiples of lcm(16, 5) = 80."""
    run, _ = _config("algo.group_size=5", "trainer.batch_prompts=64")
    usable = 15.75 * GIB

    def peak(rows_per_shard: int) -> float:
        return 3 * GIB + 0.1 * GIB * rows_per_shard + 0.0005 * GIB * rows_per_shard**2

    def fake_rollout(run, cfg, lay, mesh, dparams, resident):
        b = int(peak(lay.rows // 16))
        return [Program(n, b, 0, 0, 0, 0, 1.0, 1.0, True) for n in ("prefill", "decode")]

    monkeypatch.setattr("rl.plan.rollout_programs", fake_rollout)
    monkeypatch.setattr("rl.plan.batch_shards", lambda mesh: 16)
    lay = Layout(prompts=64, rows=320, groups=64, size=5, prompt=32, response=32,
                 mini_batches=1)
    fit = rollout_fit(run, None, lay, None, None, 0, usable, fake_rollout(run, 0, lay, 0, 0, 0))
    truth = max(n for n in range(80, 4000, 80) if peak(n // 16) <= usable)
    assert fit.trajectories == truth, (fit, truth)
    assert [n for n, _, _ in fit.measured][:2] == [320, 160]
    assert fit.exact and max(fit.compiled(truth + 80)) > usable
    assert len(fit.measured) <= 2 + 4
    text = fit_line(run, fit)
    up = peak((truth + 80) // 16) / GIB
    assert text.startswith(f"rollout: largest rollout batch that fits: {truth} trajectories "
                           f"({truth // 5} prompts x 5; prefill {peak(truth // 16) / GIB:.2f} "
                           f"GiB, decode {peak(truth // 16) / GIB:.2f} GiB per chip; "
                           f"{truth + 80} needs {up:.2f} GiB;"), text


def test_a_multi_turn_continuation_reads_and_decodes_in_place(monkeypatch):
    """task.chunk_tokens (search_qa) plans the sampler's continuation as the search env runs
    it at its largest, every row at once, in the rollout's one cache of prompt + budget
    slots: ``read`` reads an observation line per row and ``continue`` decodes a chunk, each
    taking the cache over (aliased: one cache in memory). Sizes by hand: rows x KV heads x
    head dim x slots x 2 bytes (bfloat16) per layer's keys or values, 2 x layers of them."""
    from models.sharding import make_mesh
    from rl.plan import (
        abstract_params,
        bytes_per_chip,
        layout,
        rollout_programs,
        sampler_weights,
    )

    run, plan = _config("task=search_qa", "trainer.kv_cache_dtype=bfloat16",
                        "plan.response_budget=200", "task.chunk_tokens=24")
    cfg = tiny_config()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    # one chip gathers nothing; say each pass over the layer weights gathered 1,000 bytes
    monkeypatch.setattr("rl.plan.gathered_per_step", lambda dparams: 1000)
    lay = layout(run, plan, mesh)
    dparams = sampler_weights(run, abstract_params(cfg, mesh), mesh)
    with jax.set_mesh(mesh):
        programs = rollout_programs(run, cfg, lay, mesh, dparams, resident=5)
    assert [p.name for p in programs] == ["prefill", "decode", "read", "continue", "part"]
    read, cont, part = programs[2:]
    rows, per_slot = 16, cfg.num_kv_heads * cfg.head_dim * 2  # one layer's keys, per row
    slots = 32 + 208  # prompt 20 -> 32, budget 200 -> 208
    layers = 2 * cfg.num_layers
    # the state: the cache + valid [rows, slots] bool, next-token logits [rows, vocab]
    # float32 and three int32 counters per row; the weights beside
    cache = layers * rows * per_slot * slots + rows * slots
    state = cache + rows * cfg.vocab_size * 4 + 3 * rows * 4
    lines = rows * 256 * 5  # max_obs_tokens 256: int32 tokens and a bool mask
    # every row in 8 groups of 2 (int32 row indices), each group's cache gathered by turns
    assert read.arguments == bytes_per_chip(dparams) + state + lines + rows * 4, read
    assert 0 <= read.outputs - state < 2**10 and read.aliased >= cache, read
    assert read.temporaries >= cache * 2 // 16, read
    # the chunk's decode: under 1 MiB of token budgets, stop tables and sampled tokens
    rest = cont.arguments - bytes_per_chip(dparams) - state
    assert 0 <= rest < 2**20, (rest, cont)
    assert 0 <= cont.outputs - state < 2**20 and cont.aliased >= cache, cont
    assert cont.resident == read.resident == 5 and cont.runs and cont.flops > read.flops > 0
    # half the rows (8 of 16) gathered: their cache, half of it, is temporary; arguments:
    # the row index [1, 8] int32 more; 8 fewer resume flags (bool) and token budgets (int32)
    assert part.arguments == cont.arguments + 8 * 4 - 8 * 1 - 8 * 4, (part, cont)
    assert part.temporaries >= cache // 2 and part.aliased >= cache, part
    assert abs(cont.flops / part.flops - 16 / 8) < 0.06
    # passes over the weights: the read's 8 groups x 2 blocks of 128 (256 tokens); a chunk's
    # 24 decode steps
    assert (read.ici_bytes, cont.ici_bytes, part.ici_bytes) == (16_000, 24_000, 24_000)
    # without sub-batches every continuation runs on the whole cache: no gathered program
    whole, _ = _config("task=search_qa", "trainer.kv_cache_dtype=bfloat16",
                       "plan.response_budget=200", "trainer.rollout_sub_batches=false")
    with jax.set_mesh(mesh):
        names = [p.name for p in rollout_programs(whole, cfg, layout(whole, plan, mesh), mesh,
                                                  dparams, resident=5)]
    assert names == ["prefill", "decode", "read", "continue"]
    # a single-turn task (arith) has no continuation
    run1, _ = _config()
    with jax.set_mesh(mesh):
        names = [p.name for p in rollout_programs(run1, cfg, layout(run1, plan, mesh), mesh,
                                                  dparams, resident=0)]
    assert names == ["prefill", "decode"] and continue_programs


def _reads_line(cfg, lay, reads):
    """rl.plan's reads line of a decode program with `reads` (208 steps)."""
    from rl.plan import reads_lines

    program = dataclasses.replace(
        Program("decode", 0, 0, 0, 0, 0, 1.0, 208 * reads.per_step, True), reads=reads)
    line, = reads_lines(Plan("m", cfg, "cpu", CHIPS["v5e"], 1, {"data": 1}, lay, 0, 0,
                             (program,)))
    return line


@pytest.mark.parametrize("kernel", ["xla", "pallas_gpu", "paged_xla", "paged_gpu"])
def test_a_decode_step_reads_the_slots_its_kernel_reads_by_hand(kernel):
    """The decode's bytes a step: the weights and loop state, and of the KV cache the slots
    the configured kernel reads. Prompts of 64 tokens (width 64), a budget of 208: 272
    slots, extents 128, 272 (blocks of 128; on CPU none past half the cache). Step t =
    1..207 writes slot 63 + t: 64 steps read 128 slots, 143 read 272 (the XLA paths, dense
    or paged: rows from slot 0, the longest at 63 + t too); the rows hold 64 + t, 168 on
    average, which the Pallas kernels read. A paged cache (planned here, on CPU, with XLA's
    attention) holds 17 pages of 16 slots a row and a page table instead of the mask."""
    from models.sampler import generation_kernels
    from models.sharding import make_mesh
    from rl.plan import (
        bytes_per_chip,
        decode_reads,
        layout,
        rollout_sampling,
        sampler_weights,
    )

    run, plan = _config("plan.prompt_len=64", "plan.response_budget=208",
                        f"trainer.decode_kernel={kernel}")
    cfg = tiny_config()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    lay = layout(run, plan, mesh)
    assert (lay.prompt, lay.response) == (64, 208)
    dparams = sampler_weights(run, abstract_params(cfg, mesh), mesh)
    prompts = [[p + 1] * 64 for p in range(lay.prompts) for _ in range(lay.rows // lay.prompts)]
    sampling = rollout_sampling(run, lay, mesh)
    assert sampling.decode_kernel == {"pallas_gpu": "xla", "paged_gpu": "paged_xla"}.get(
        kernel, kernel)  # a GPU kernel is planned off a GPU by XLA's attention
    _, dec = generation_kernels(cfg, dparams, prompts, sampling, mesh)
    reads = decode_reads(run, lay, dec)
    rows, slots = lay.rows, 272
    # keys and values of 2 layers x 2 KV heads x 16 dims per slot, float32; the valid mask
    # (a byte a slot), or a paged cache's table (an int32 a page)
    cache = 2 * cfg.num_layers * rows * 2 * 16 * 4 * slots + (
        rows * 17 * 4 if kernel.startswith("paged") else rows * slots)
    assert (reads.capacity, reads.cache, reads.held) == (slots, cache, 168)
    read = 168 if kernel.endswith("gpu") else (64 * 128 + 143 * 272) / 207
    assert reads.read == pytest.approx(read)
    assert reads.fixed >= bytes_per_chip(dparams)
    assert reads.per_step == pytest.approx(reads.fixed + cache * read / slots)
    line = _reads_line(cfg, lay, reads)
    assert f"{read:.0f} of 272 slots a row on average" in line and "hold 168" in line, line


def _grouped_decode_reads(*overrides):
    """(model config, layout, the decode's reads) of a plan with trainer.shared_prompts on
    one CPU device: groups of rows continuing prompts of 64 tokens, a budget of 208."""
    from models.sampler import generation_kernels
    from models.sharding import make_mesh
    from rl.plan import decode_reads, layout, rollout_sampling, sampler_weights

    run, plan = _config("plan.prompt_len=64", "plan.response_budget=208",
                        "trainer.shared_prompts=true", *overrides)
    cfg = tiny_config()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    lay = layout(run, plan, mesh)
    assert lay.rows > lay.prompts  # groups of more than one row
    dparams = sampler_weights(run, abstract_params(cfg, mesh), mesh)
    prompts = [[p + 1] * 64 for p in range(lay.prompts) for _ in range(lay.rows // lay.prompts)]
    _, dec = generation_kernels(cfg, dparams, prompts, rollout_sampling(run, lay, mesh), mesh)
    return cfg, lay, decode_reads(run, lay, dec)


@pytest.mark.parametrize("kernel", ["paged_gpu", "paged_tpu"])
def test_the_plans_decode_reads_with_prompt_pages_shared_by_their_groups(kernel):
    """A paged cache whose groups share their prompts' pages (trainer.shared_prompts; planned
    on CPU with XLA's attention over the same pages): prompts of 64 tokens (4 full pages)
    stored once a group, each row 14 pages of its own (208 slots after the width, the
    prompt's last page included: ceil(208 / 16) + 1), so 18 table entries a row, 288 slots.
    The rows hold 64 + t at step t = 1..207, 168 on average; a step reads each group's 64
    prompt slots once and each row's 104 after them (the TPU kernel as the GPU one)."""
    cfg, lay, reads = _grouped_decode_reads(f"trainer.decode_kernel={kernel}")
    page = 2 * cfg.num_layers * 2 * 16 * 4 * 16  # keys and values of 16 slots, float32
    pages = lay.prompts * 4 + lay.rows * 14
    assert (reads.capacity, reads.held) == (288, 168)
    # the pools, the int32 table, the prompts' table of their 4 pages and their slots, and
    # their groups' rows
    assert reads.cache == (pages * page + lay.rows * 18 * 4 + lay.prompts * (4 + 1) * 4
                           + lay.rows * 4)
    line = _reads_line(cfg, lay, reads)
    # (with a share of the table's bytes)
    assert reads.read == 104
    assert reads.cache_read == pytest.approx(lay.rows * 104 * page / 16, rel=0.01)
    assert reads.shared == pytest.approx(lay.prompts * 64 * page / 16, rel=0.01)
    assert "prompt pages read once a group" in line and "of 288 slots" in line, line


def test_the_plans_decode_reads_with_prompts_shared_by_their_groups():
    """trainer.shared_prompts: the rows' cache holds the 208 new tokens' slots only (on CPU
    one extent, the whole cache: none past half of it), the rows hold t = 1..207 of them,
    104 on average; the groups' prompts, one of 64 slots a group, are read whole every step."""
    cfg, lay, reads = _grouped_decode_reads()
    # a slot: keys and values of 2 layers x 2 KV heads x 16 dims, float32, and its valid flag
    slot = 2 * cfg.num_layers * 2 * 16 * 4 + 1
    assert (reads.capacity, reads.held, reads.read) == (208, 104, 208)
    assert (reads.cache, reads.shared) == (lay.rows * 208 * slot, lay.prompts * 64 * slot)
    assert reads.per_step == pytest.approx(reads.fixed + reads.shared + reads.cache)
    line = _reads_line(cfg, lay, reads)
    assert "the groups' shared prompts" in line and "hold 104" in line, line


def test_the_start_up_row_is_the_loaded_weights_adam_and_the_reference_by_hand():
    """One chip, so every byte is on it: N float32 weights loaded (4 N bytes), then Adam's two
    float32 moments (8 N) and the bfloat16 reference (2 N), the step counters beside; the
    step's programs hold the temporaries, the start-up row none."""
    import optax

    from models.sharding import make_mesh

    cfg = tiny_config()
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = abstract_params(cfg, mesh)
    state = abstract_state(params, optax.adamw(1e-3), mesh)
    state_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))
    assert 12 * n <= state_bytes <= 12 * n + 16  # + the step counters
    from rl.plan import TrainSide

    row = startup_row(params, TrainSide(None, None, None, state_bytes, 0, ref_bytes=2 * n))
    assert row.name == "start-up" and row.runs and row.temporaries == 0
    assert row.arguments == 4 * n
    assert row.peak == row.total == state_bytes + 2 * n


def test_the_weights_a_decode_step_gathers_by_hand():
    """A layer matrix split 8 ways: each chip receives the other 7 eighths every decode step;
    a replicated norm nothing; the unembedding is read by vocabulary slices, not gathered."""
    from types import SimpleNamespace as NS

    def leaf(shape, shard):
        return NS(shape=shape, dtype=jnp.bfloat16, sharding=NS(shard_shape=lambda s: shard))

    dparams = {"layers": ({"wq": leaf((64, 128), (8, 128)), "attn_norm": leaf((64,), (64,))},
                          {"wq": leaf((64, 128), (64, 128))}),  # replicated in layer 2
               "unembed": leaf((64, 1000), (64, 125))}
    assert gathered_per_step(dparams) == (64 * 128 - 8 * 128) * 2


def test_the_rollout_layout_advice_by_hand():
    """v5e (15.75 GiB usable): a rollout peaking at 10 GiB that gathers 2 GiB of layer weights
    per decode step over 32 steps: whole weights fit (12 GiB) and save 2 GiB / 400 GB/s =
    5.37 ms per step, 0.17 s per rollout; gathering 6 GiB they would not (16 GiB)."""
    g = 2**30
    progs = tuple(Program(n, 0, 0, 0, 0, 10 * g, 1.0, 1.0, True, ici_bytes=32 * 2 * g)
                  for n in ("prefill", "decode"))
    plan = Plan("m", None, "v5e:4x4", CHIPS["v5e"], 16, {"data": 1, "fsdp": 16, "tensor": 1},
                None, 0, 0, progs, gathered=2 * g)
    advice = rollout_advice(plan)
    assert "recommended mesh.rollout_shape={data:-1}" in advice and "2.00 GiB more" in advice
    assert f"{2 * g / 400e9 * 1e3:.2f} ms" in advice and f"{64 * g / 400e9:.2f} s" in advice
    six = dataclasses.replace(plan, gathered=6 * g)
    assert "keep the training layout" in rollout_advice(six)
    none = dataclasses.replace(plan, gathered=0)
    assert "gathers none" in rollout_advice(none)


def test_the_evaluation_is_planned_in_its_own_dtype_and_batch_by_hand():
    """The evaluation during training rolls out trainer.eval_batch_size greedy trajectories
    at a time in trainer.eval_dtype: 8 rows in float32 while the rollout samples 16 in
    bfloat16. One chip, so every byte is on it: the weights (N float32 numbers) among its
    arguments, and the prefill's output the 8 rows' state (float32 keys and values of
    2 x layers x rows x KV heads x head dim x slots, the valid mask, float32 next-token
    logits, three int32 counters per row)."""
    from models.sharding import make_mesh
    from rl.plan import evaluation_programs, layout

    run, plan = _config("trainer.rollout_dtype=bfloat16", "trainer.kv_cache_dtype=bfloat16",
                        "trainer.eval_dtype=float32", "trainer.eval_batch_size=8")
    cfg = tiny_config()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    with jax.set_mesh(mesh):
        programs = evaluation_programs(run, cfg, layout(run, plan, mesh), mesh,
                                       abstract_params(cfg, mesh), resident=7)
    assert [p.name for p in programs] == ["eval prefill", "eval decode"]
    prefill, decode = programs
    assert prefill.runs and decode.runs and prefill.resident == decode.resident == 7
    rows, slots = 8, 32 + 32  # prompt 20 -> 32 slots, budget 24 -> 32
    state = (2 * cfg.num_layers * rows * cfg.num_kv_heads * cfg.head_dim * slots * 4
             + rows * slots + rows * cfg.vocab_size * 4 + 3 * rows * 4)
    assert 0 <= prefill.outputs - state < 2**10, (prefill, state)
    assert 4 * n <= prefill.arguments < 4 * n + 2**10 + rows * 32 * 4, (prefill, n)
    # not evaluated during training: planned, marked as not run
    quiet, _ = _config("trainer.eval_at_ends=false", "trainer.eval_every=0")
    with jax.set_mesh(mesh):
        assert not any(p.runs for p in evaluation_programs(
            quiet, cfg, layout(quiet, plan, mesh), mesh, abstract_params(cfg, mesh), 0))


def test_an_evaluation_that_does_not_fit_is_offered_the_evaluations_keys():
    run, _ = _config("trainer.eval_batch_size=64")
    g = 2**30
    fake = _fake_plan(run, update_gib=1.0)
    plan = dataclasses.replace(fake, programs=(*fake.programs, Program(
        "eval decode", 20 * g, 0, 0, 0, 0, 1.0, 1.0, True)))
    text = verdict(run, plan)
    assert text.startswith("verdict: eval decode does NOT fit: 20.00 GiB per chip"), text
    assert "trainer.eval_batch_size=32" in text and "trainer.eval_dtype=bfloat16" in text
    assert "rollout_chunks" not in text and "kv_cache_dtype" not in text, text
    # the program column widened to the longest name and a space: 12, then "args" in 8
    assert "\n  program" + " " * 9 + "args" in report(run, plan)
    off = dataclasses.replace(plan, programs=(*fake.programs, Program(
        "eval decode", 20 * g, 0, 0, 0, 0, 1.0, 1.0, False)))
    text = verdict(run, off)
    assert text.startswith("verdict: fits"), text
    assert ("eval decode would NOT fit if run (trainer.eval_at_ends or trainer.eval_every)"
            in text), text


def test_the_step_bound_by_hand():
    """v5e-16 (197 TFLOP/s a chip, 819 GB/s): a prefill of 16 x 197e12 FLOPs takes >= 1 s, a
    decode reading 8.19 TB per chip >= 10 s and runs twice (trainer.rollout_chunks=2), the
    reference pass is not run, an update of 3 x 16 x 197e12 FLOPs >= 3 s, 2 mini-batches x 1
    epoch of them: 1 + 20 + 0 + 6 = 27 s."""
    from rl.plan import step_bound, step_line

    run, _ = _config("trainer.mini_batches=2")
    flops = 16 * 197e12
    progs = (Program("prefill", 0, 0, 0, 0, 0, flops, 0.0, True),
             Program("decode", 0, 0, 0, 0, 0, 0.0, 8.19e12, True, calls=2),
             Program("reference", 0, 0, 0, 0, 0, 5 * flops, 0.0, False),
             Program("update", 0, 0, 0, 0, 0, 3 * flops, 0.0, True),
             Program("eval decode", 0, 0, 0, 0, 0, 7 * flops, 0.0, True))
    plan = dataclasses.replace(_fake_plan(run, 1.0), programs=progs)
    total, parts = step_bound(run, plan)
    assert parts == pytest.approx({"rollout": 21.0, "reference": 0.0, "update": 6.0})
    assert total == pytest.approx(27.0)
    assert step_line(run, plan).startswith("step: >= 27.00 s (rollout 21.00 s, reference "
                                           "0.0 ms, update 6.00 s for 2 update(s)")


def test_a_gpu_estimate_of_several_nodes_plans_a_stand_in_slice_per_node():
    from rl.plan import gpu_nodes, stand_in_topology, topology_devices

    assert (stand_in_topology("h100:8"), gpu_nodes("h100:8")) == ("v5p:2x2x2", 1)
    assert (stand_in_topology("h200:16"), gpu_nodes("h200:16")) == ("v5p:2x2x2", 2)
    assert (stand_in_topology("h100:12"), gpu_nodes("h100:12")) == ("v5p:2x2x3", 1)
    assert stand_in_topology("v5e:4x4") is None and gpu_nodes("v5e:4x4") == 1
    with pytest.raises(ConfigError, match=r"^plan\.slices: a GPU estimate's nodes come from"):
        topology_devices("h100:16", slices=2)
    with pytest.raises(ConfigError, match=r"^plan\.slices: plan\.topology=cpu"):
        topology_devices("cpu", slices=2)


def test_a_tensor_split_is_computed_in_place_not_gathered_by_hand():
    """A [64, 128] bfloat16 layer matrix: split 4 ways over tensor only, a chip computes with
    its own columns (nothing gathered); split 2 ways over fsdp and 4 over tensor, it gathers
    the other fsdp half of its tensor quarter: 64 x 128 / 4 - 32 x 32 values."""
    from types import SimpleNamespace as NS

    from jax.sharding import PartitionSpec as P

    def leaf(spec, shard, **mesh):
        sharding = NS(spec=spec, mesh=NS(shape={"data": 1, "fsdp": 1, "tensor": 1, **mesh}),
                      shard_shape=lambda s: shard)
        return NS(shape=(64, 128), dtype=jnp.bfloat16, sharding=sharding)

    assert gathered_per_step({"layers": ({"w": leaf(P(None, "tensor"), (64, 32),
                                                     tensor=4)},)}) == 0
    mixed = leaf(P("fsdp", "tensor"), (32, 32), fsdp=2, tensor=4)
    assert gathered_per_step({"layers": ({"w": mixed},)}) == (64 * 128 // 4 - 32 * 32) * 2


def test_the_rollout_advice_falls_back_to_a_tensor_parallel_layout_by_hand():
    """An 8B-like model (32 query heads, 8 KV heads) on v5e-16 (15.75 GiB usable) whose layer
    weights are 16 GiB whole, 1 GiB a chip under FSDP, with a rollout peaking at 10 GiB:
    whole weights need 15 GiB more (25 > 15.75), tensor 2 holds 8 GiB (7 more: 17), tensor
    4 holds 4 GiB (3 more: 13 GiB): {data:-1,tensor:4} is recommended."""
    from rl.plan import tensor_options

    g = 2**30
    cfg = tiny_config(num_heads=32, num_kv_heads=8, intermediate_size=256)
    assert tensor_options(cfg, 16) == [2, 4, 8]
    assert tensor_options(tiny_config(num_heads=4, num_kv_heads=2), 8) == [2]
    progs = tuple(Program(n, 0, 0, 0, 0, 10 * g, 1.0, 1.0, True, ici_bytes=32 * 15 * g)
                  for n in ("prefill", "decode"))
    plan = Plan("m", cfg, "v5e:4x4", CHIPS["v5e"], 16, {"data": 1, "fsdp": 16, "tensor": 1},
                None, 0, 0, progs, gathered=15 * g, layer_bytes=16 * g)
    advice = rollout_advice(plan)
    assert advice.startswith("rollout layout: recommended mesh.rollout_shape="
                             "{data:-1,tensor:4}: the heads and MLP columns split 4 ways"), advice
    assert "3.00 GiB more per chip (rollout peak 13.00 of 15.75 GiB)" in advice, advice
    tight = dataclasses.replace(plan, programs=tuple(
        dataclasses.replace(p, resident=15 * g) for p in progs))
    assert "keep the training layout: the narrowest other one, {data:-1,tensor:8}, would " \
        "need 1.00 GiB more" in rollout_advice(tight)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_qlora_step_is_planned_with_its_quantized_base_by_hand(dtype):
    """model.lora.rank=4, quant=nf4 on the tiny model, one chip: the base holds every layer
    matmul as NF4 (half a byte a value, and a float32 maximum per 64) and the rest in
    float32; the train state is the adapters' (float32, with Adam's two moments); the KL
    reference shares the quantized matmuls and, in bfloat16, copies the rest."""
    from models.sharding import make_mesh
    from models.transformer import layer_shapes
    from rl.plan import TrainSide, startup_row, train_side

    run, _ = _config("model.lora.rank=4", "model.lora.quant=nf4", "algo.beta=0.04",
                     f"model.dtype={dtype}")
    cfg = tiny_config()
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = abstract_params(cfg, mesh)
    side = train_side(run, cfg, params, mesh)
    assert isinstance(side, TrainSide)
    shapes = layer_shapes(cfg)
    matmuls = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    layers = cfg.num_layers
    quant = sum(layers * (d * f // 2 + d // 64 * f * 4) for d, f in
                (shapes[k] for k in matmuls))
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    rest = total - sum(layers * d * f for d, f in (shapes[k] for k in matmuls))
    assert side.base_bytes == quant + 4 * rest
    adapters = sum(layers * (d + f) * 4 for d, f in (shapes[k] for k in matmuls))
    assert 12 * adapters <= side.state_bytes <= 12 * adapters + 16
    assert side.ref_bytes == (2 * rest if dtype == "bfloat16" else 0)
    row = startup_row(params, side)
    assert row.arguments == 4 * total  # the loaded float32 weights, then quantized beside
    assert row.total == 4 * total + side.base_bytes + side.state_bytes + side.ref_bytes


def test_a_qlora_run_is_planned_from_the_command_line():
    proc = _plan_cli(*TINY, "plan.topology=cpu", "plan.rollout_fit=false", "mesh=fsdp",
                     "model.lora.rank=4", "model.lora.quant=nf4", devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"resident per chip: LoRA rank 4 on wq, .*: adapters \+ optimizer "
                     r"[\d.]+ GiB, frozen base \(nf4\) [\d.]+ GiB", out), out
    _check_table(out)
    assert "verdict: fits" in out, out


def test_a_compiler_failure_is_reported_and_the_plan_goes_on():
    """The TPU compiler may fail on a program with an INTERNAL error that is not a memory
    refusal (a bitcast of different sizes on a multi-turn read: the benchmarks page): the
    program is reported as not sized, the plan goes on, and the verdict does not say
    'fits'."""
    class Lowered:
        def compile(self):
            raise jax.errors.JaxRuntimeError("INTERNAL: during context [post-optimization]: "
                                             "Bitcast cannot have different shape sizes\nmore")

    args = jnp.zeros((4, 8), jnp.float32)
    p = compiled_program("eval read", Lowered(), args, resident=5, flops=1.0,
                         min_bytes=lambda m: 0.0)
    assert p.failed.startswith("INTERNAL: during context") and "\n" not in p.failed
    assert p.arguments == 4 * 8 * 4 and p.runs
    run, _ = _config()
    fake = _fake_plan(run, update_gib=1.0)
    text = verdict(run, dataclasses.replace(fake, programs=(*fake.programs, p)))
    assert not text.startswith("verdict: fits"), text
    assert "verdict: eval read was not sized: the compiler failed on it (INTERNAL" in text
    assert "the compiler FAILED on it" in _row(fake, p)


def test_a_program_no_key_helps_says_so(monkeypatch):
    run, _ = _config("trainer.batch_prompts=8", "trainer.micro_batches=2")
    monkeypatch.setattr("rl.plan.remedies", lambda run, plan, name: [])
    text = verdict(run, _fake_plan(run, update_gib=20.0))
    assert text.startswith("verdict: update does NOT fit: 21.00 GiB per chip"), text
    assert text.endswith("> 16.0 GiB; no key of this config lowers it on this slice (a larger "
                         "slice, or a smaller batch or model)"), text
