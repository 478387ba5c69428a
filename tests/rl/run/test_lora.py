"""LoRA runs on the tiny character model: only adapters trained, in the optimizer state and
in checkpoints; exact resume; a resume on other base weights refused; the export merged."""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.lora import adapted
from models.transformer import forward
from rl.run.checkpoint import Checkpointer
from rl.run.config import ConfigError, parse, parse_plan
from rl.run.trainer import build_trainer
from tests.conftest import write_char_model
from tests.rl.run.test_trainer import LEARN, make_cfg

RANK = 2
TARGETS = ("wq", "wv", "w_down")
COMMON = [*LEARN, "trainer.batch_prompts=2", "algo.group_size=4", "trainer.max_new_tokens=6",
          "optim.lr=1e-2", "trainer.eval_at_ends=false", "trainer.skip_zero_advantage=false",
          "algo.beta=0.04", f"model.lora.rank={RANK}", "model.lora.alpha=4.0",
          f"model.lora.targets=[{','.join(TARGETS)}]"]


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    """A char model folder of this test's own (one test rewrites its weights)."""
    folder = write_char_model(tmp_path / "model")
    monkeypatch.setenv("CHAR_MODEL", str(folder))
    return folder


def _adapter_count():
    """Adapter parameters of the char model (hidden 32, 2 layers, KV width 16, MLP 64), by
    hand: L * (D + F) * rank per target."""
    shapes = {"wq": (32, 32), "wv": (32, 16), "w_down": (64, 32)}
    return sum(2 * (d + f) * RANK for d, f in (shapes[t] for t in TARGETS))


def test_two_steps_train_adapters_only(tmp_path, model_dir):
    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "trainer.max_steps=2",
                               "trainer.micro_batches=2"))
    _, base, _ = load_params(str(model_dir))
    before = jax.device_get(t.state.params)
    assert sorted(before) == sorted(TARGETS) and all(
        not np.any(ab["b"]) for ab in before.values())
    # optimizer state: Adam's two moments of every adapter parameter (+ scalar counters)
    big = [x.size for x in jax.tree.leaves(t.state.opt_state) if x.size > 1]
    assert sum(big) == 2 * _adapter_count()
    history = t.run()
    t.close()
    assert all(h["update/skipped"] == 0 for h in history)
    after = jax.device_get(t.state.params)
    assert all(np.any(ab["b"]) for ab in after.values())  # B left zero: adapters trained
    assert any(not np.array_equal(after[k]["a"], before[k]["a"]) for k in TARGETS)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(t.parts.lora.base), base)
    # the KL reference is the base itself, adapters off (no copy)
    assert t.parts.ref_params["layers"]["wq"] is t.parts.lora.base["layers"]["wq"]
    ck = Checkpointer(tmp_path / "r" / "checkpoints")
    meta = ck.read_meta(ck.latest_step())
    ck.close()
    saved = meta["integrity"]["arrays"]
    assert not any("embed" in k or "norm" in k for k in saved), sorted(saved)
    assert any("['params']['wq']['a']" in k for k in saved)
    assert meta["lora_base"]["model.path"] == str(model_dir)


def test_rollouts_use_the_adapted_weights(tmp_path, model_dir):
    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "trainer.max_steps=1"))
    t.run()
    t.close()
    c, lr = t.parts, t.parts.lora
    tokens = jnp.asarray([[5, 9, 13, 2, 7]])
    adapted_logits = forward(c.model_cfg, adapted(lr.base, t.state.params, lr.config), tokens)
    merged = lr.sampling(t.state.params)
    np.testing.assert_allclose(forward(c.model_cfg, merged, tokens), adapted_logits, atol=1e-5)
    assert float(jnp.abs(adapted_logits - forward(c.model_cfg, lr.base, tokens)).max()) > 1e-4
    # the sampler the rollouts run holds the merged weights (per layer)
    sampler_layers = c.policy(t.state.params).params["layers"]
    for i, layer in enumerate(sampler_layers):
        np.testing.assert_array_equal(layer["wq"], merged["layers"]["wq"][i])


def test_resume_is_exact(tmp_path, model_dir):
    common = [*COMMON, "trainer.max_steps=4", "trainer.save_every=2", "trainer.ppo_epochs=2"]
    straight = build_trainer(make_cfg(tmp_path / "a", *common))
    straight.run()
    straight.close()
    first = build_trainer(make_cfg(tmp_path / "b", *common))
    first.run(until=2)
    first.close()
    resumed = build_trainer(make_cfg(tmp_path / "b", *common, "trainer.resume=true"))
    assert resumed.start_step == 2
    resumed.run()
    resumed.close()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.state.params),
                 jax.device_get(straight.state.params))


def test_resume_on_other_base_weights_is_refused(tmp_path, model_dir):
    common = [*COMMON, "trainer.max_steps=2"]
    t = build_trainer(make_cfg(tmp_path / "r", *common, "trainer.max_steps=1"))
    t.run()
    t.close()
    write_char_model(model_dir, seed=5)  # same path, same architecture, other weights
    with pytest.raises(ConfigError, match=r"model.path.*other base weights"):
        build_trainer(make_cfg(tmp_path / "r", *common, "trainer.resume=true"))


def test_export_merges_the_adapters(tmp_path, model_dir):
    from rl.export import main

    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "trainer.max_steps=2"))
    t.run()
    t.close()
    out = tmp_path / "hf"
    assert main([str(tmp_path / "r"), str(out)]) == 0
    cfg, exported, _ = load_params(str(out))
    tokens = jnp.asarray([[3, 8, 21, 4, 30, 11]])
    want = forward(t.parts.model_cfg, adapted(t.parts.lora.base, t.state.params,
                                              t.parts.lora.config), tokens)
    np.testing.assert_allclose(forward(cfg, exported, tokens), want, atol=1e-5)


def test_export_refuses_adapters_on_other_base_weights(tmp_path, model_dir, capsys):
    from rl.export import main

    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "trainer.max_steps=1"))
    t.run()
    t.close()
    write_char_model(model_dir, seed=5)
    assert main([str(tmp_path / "r"), str(tmp_path / "hf")]) == 2
    assert "model.path" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "key"), [
    ("model.lora.targets=[wq,embed]", "model.lora.targets[1]"),
    ("model.lora.rank=-1", "model.lora.rank"),
    ("model.lora.alpha=0", "model.lora.alpha"),
    ("model.lora.rank=40", "model.lora.rank"),  # above the model's widths (checked on load)
    ("model.lora.quant=fp8", "model.lora.quant"),
    ("model.lora.quant=nf4", "model.lora.quant"),  # widths of 32: not blocks of 64
])
def test_bad_lora_config_names_the_key_before_compute(tmp_path, model_dir, override, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        build_trainer(make_cfg(tmp_path / "x", *COMMON, override))
    assert not (tmp_path / "x" / "checkpoints").exists() or not any(
        (tmp_path / "x" / "checkpoints").iterdir())


def test_sft_refuses_lora_and_plan_takes_it(tmp_path, model_dir):
    from rl.sft import _checked

    cfg = make_cfg(tmp_path / "p", *COMMON)
    parse(cfg)  # valid for rl.train
    run, _ = parse_plan({**cfg, "plan": {"topology": "cpu", "model_shapes": "tiny",
                                         "prompt_len": 8, "response_budget": 8,
                                         "rollout_fit": False, "slices": 1}})
    assert run.model.lora.rank == RANK  # rl.plan plans LoRA runs (tests/rl/test_plan.py)
    with pytest.raises(ConfigError, match="model.lora.rank"):
        _checked({**cfg, "sft": {"split": "train", "examples": 1, "epochs": 1,
                                 "batch_size": 1, "eval_split": "dev", "eval_examples": 0}})


def test_rank_zero_keeps_full_weight_training(tmp_path, model_dir):
    t = build_trainer(make_cfg(tmp_path / "r", *LEARN, "trainer.max_steps=1",
                               "model.lora.alpha=0", "model.lora.targets=[]"))
    assert t.parts.lora is None and "embed" in t.state.params
    t.close()
    shutil.rmtree(tmp_path / "r")
    assert Path(model_dir).exists()


def test_lora_on_an_init_from_run_trains_on_and_exports_from_those_weights(tmp_path,
                                                                          model_dir):
    from rl.export import main
    from rl.run.evaluation import restore_run_params

    warm = build_trainer(make_cfg(tmp_path / "warm", *LEARN, "trainer.max_steps=1",
                                  "trainer.batch_prompts=2", "algo.group_size=4",
                                  "trainer.max_new_tokens=6", "optim.lr=1e-2",
                                  "trainer.eval_at_ends=false",
                                  "trainer.skip_zero_advantage=false"))
    warm.run()
    warm.close()
    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "trainer.max_steps=1",
                               f"trainer.init_from={tmp_path / 'warm'}"))
    _, loaded, _ = load_params(str(model_dir))
    warm_params, _ = restore_run_params(tmp_path / "warm", loaded)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(t.parts.lora.base), warm_params)
    t.run()
    t.close()
    assert main([str(tmp_path / "r"), str(tmp_path / "hf")]) == 0
    cfg, exported, _ = load_params(str(tmp_path / "hf"))
    tokens = jnp.asarray([[3, 8, 21, 4, 30, 11]])
    want = forward(cfg, adapted(warm_params, t.state.params, t.parts.lora.config), tokens)
    np.testing.assert_allclose(forward(cfg, exported, tokens), want, atol=1e-5)


def test_sharded_lora_step_matches_single_device():
    """Base sharded over an 8-device mesh, adapters replicated (rl.run.lora.fresh_adapters): the
    adapters' update equals the single-device one."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import functools
        import jax, numpy as np, optax
        from models.lora import LoraConfig
        from models.presets import tiny_config
        from models.sharding import batch_sharding, make_mesh, param_shardings, shard
        from models.transformer import init_params
        from rl.run.lora import LoraRun, fresh_adapters
        from rl.grpo.train_step import LossConfig, init_train_state, make_train_step
        cfg = tiny_config(vocab_size=256)
        base = init_params(cfg, jax.random.key(0))
        lora = LoraConfig(4, 8.0, ("wq", "w_up", "w_down"))
        rng = np.random.default_rng(0)
        adapters = fresh_adapters(LoraRun(lora, base, "", {}), 0)
        adapters = jax.tree.map(lambda a: a + 0.01 * rng.standard_normal(a.shape), adapters)
        opt = optax.sgd(1.0)
        lc = LossConfig(beta=0.01, on_policy=False, micro_batches=2)
        n, g, p, r = 16, 2, 6, 10
        batch = {"prefix": rng.integers(0, 256, (n, p)).astype(np.int32),
                 "prefix_mask": np.ones((n, p), bool),
                 "tokens": rng.integers(0, 256, (n, g, r)).astype(np.int32),
                 "attn_mask": np.ones((n, g, r), bool),
                 "loss_mask": (rng.random((n, g, r)) < 0.7).astype(np.float32),
                 "advantages": rng.normal(size=(n, g)).astype(np.float32),
                 "logp_old": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32),
                 "logp_ref": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32)}
        step = make_train_step(cfg, lc, opt, donate=False, lora=lora)
        ref, _ = step(init_train_state(adapters, opt), batch, base)
        mesh = make_mesh({"data": 4, "fsdp": 2, "tensor": 1})
        sbase = shard(base, param_shardings(base, mesh))
        sad = fresh_adapters(LoraRun(lora, sbase, "", {}), 0, mesh)
        sad = jax.tree.map(lambda s, a: jax.device_put(a, s.sharding), sad, adapters)
        state, _ = step(init_train_state(sad, opt), jax.device_put(
            batch, batch_sharding(mesh, 1, None)), sbase)
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
        assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in zip(
            jax.tree.leaves(state.params), jax.tree.leaves(adapters)))
        print("SHARDED_LORA_OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=str(Path(__file__).resolve().parents[3]))
    assert "SHARDED_LORA_OK" in res.stdout, res.stderr[-3000:]


def test_qlora_trains_adapters_over_an_nf4_base_and_exports_them_merged(tmp_path,
                                                                       monkeypatch):
    """model.lora.quant=nf4 on a char model of width 64: the run's base holds every layer
    matmul as NF4 codes (two a byte), the adapters train, and the export is the dequantized
    base plus the adapters: its forward equals the run's factored one."""
    from models.quant import Quantized
    from rl.export import main

    folder = write_char_model(tmp_path / "model64", hidden=64)
    monkeypatch.setenv("CHAR_MODEL", str(folder))
    t = build_trainer(make_cfg(tmp_path / "r", *COMMON, "model.lora.quant=nf4",
                               "trainer.max_steps=2"))
    base = t.parts.lora.base["layers"]
    assert all(isinstance(base[k], Quantized) and base[k].codes.dtype == jnp.uint8
               for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
    # the KL reference is that base (adapters off), not the float32 weights it came from
    assert t.parts.ref_params["layers"]["wq"] is base["wq"]
    before = jax.device_get(t.state.params)
    t.run()
    t.close()
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                     jax.tree.leaves(t.state.params))]
    assert any(moved)
    assert main([str(tmp_path / "r"), str(tmp_path / "hf")]) == 0
    cfg, exported, _ = load_params(str(tmp_path / "hf"))
    tokens = jnp.asarray([[3, 8, 21, 4, 30, 11]])
    want = forward(t.parts.model_cfg, adapted(t.parts.lora.base, t.state.params,
                                              t.parts.lora.config), tokens)
    np.testing.assert_allclose(forward(cfg, exported, tokens), want, atol=1e-4)
