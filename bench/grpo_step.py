"""One GRPO step on the shipped SmolLM2-135M: our loop vs TRL's GRPOTrainer (PyTorch CPU),
same model, prompts, group size and completion length, in one run; plus training
forward+backward of 8x256 tokens vs PyTorch and the achieved fraction of the f32 matmul peak.

    python -m bench.grpo_step [--prompts 2] [--group 4] [--completion 64] [--steps 2]

Needs `trl` (pip install trl) for the TRL column; prints "n/a" without it.
EOS is ignored on both sides so every completion has exactly --completion tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import numpy as np

PROMPTS = ["Explain why the sky is blue.", "Write a short poem about rivers.",
           "Give three tips for learning to cook.", "Describe how a bicycle works."]


def matmul_peak_gflops() -> float:
    import jax
    import jax.numpy as jnp

    a = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(5):
        r = f(a, a)
    r.block_until_ready()
    return 2 * 2048**3 * 5 / (time.perf_counter() - t0) / 1e9


def ours_fwd_bwd(batch: int = 8, seq: int = 256, remat: bool = False) -> float:
    import jax
    import jax.numpy as jnp

    from models import load_params
    from models.scoring import token_logprobs

    cfg, params, _ = load_params("smollm2_135m")
    ids = jnp.asarray(np.random.default_rng(0).integers(100, 40000, (batch, seq)), jnp.int32)
    mask = jnp.ones((batch, seq), bool)
    loss = jax.jit(jax.grad(lambda p: -token_logprobs(cfg, p, ids, mask, remat=remat).mean()))
    jax.block_until_ready(loss(params))
    t0 = time.perf_counter()
    jax.block_until_ready(loss(params))
    return time.perf_counter() - t0


def hf_float_model():
    """The shipped model as a plain float32 transformers LlamaForCausalLM, built from our
    dequantized parameters (transformers refuses to fine-tune a model loaded from a quantized
    GGUF, and will not re-save one), with the GGUF's own tokenizer."""
    import torch
    import transformers

    from models import load_params
    from models.presets import shipped_gguf_path

    cfg, params, _ = load_params("smollm2_135m")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=True,
        max_position_embeddings=cfg.max_position_embeddings, bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_ids), pad_token_id=cfg.pad_token_id)
    model = transformers.LlamaForCausalLM(hf_cfg).float()
    names = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
             "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
             "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
             "w_down": "mlp.down_proj"}
    state = {"model.embed_tokens.weight": params["embed"], "model.norm.weight":
             params["final_norm"], "lm_head.weight": params["embed"]}
    for key, name in names.items():
        for i in range(cfg.num_layers):
            w = np.asarray(params["layers"][key][i])
            state[f"model.layers.{i}.{name}.weight"] = w.T if w.ndim == 2 else w
    model.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in state.items()})
    path = shipped_gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tok


def torch_fwd_bwd(batch: int = 8, seq: int = 256) -> float:
    import torch

    model, _ = hf_float_model()
    model.train()
    torch.manual_seed(0)
    ids = torch.tensor(np.random.default_rng(0).integers(100, 40000, (batch, seq)))
    model(ids, labels=ids).loss.backward()  # warm-up
    model.zero_grad()
    t0 = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    return time.perf_counter() - t0


@dataclasses.dataclass(frozen=True)
class _FixedTask:
    """Prompts only; reward = response length parity (any reward does: we time the step)."""

    prompts_text: tuple[str, ...]
    name: str = "bench"

    def prompts(self, split):
        from core.types import Prompt

        return [Prompt(id=str(i), messages=({"role": "user", "content": t},))
                for i, t in enumerate(self.prompts_text)]

    def make_env(self, tokenizer, sampling):
        from rl.tasks.envs import SingleTurnEnv

        return SingleTurnEnv(tokenizer, sampling)

    def outcome(self, prompt, traj):
        return float(len(traj.text) % 2)


def ours_grpo(n_prompts: int, group: int, completion: int, steps: int,
              beta: float) -> dict[str, float]:
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from rl.run import trainer as tr
    from rl.run.resolve import resolved_config
    from rl.run.wiring import TASKS

    if "bench" not in TASKS:
        TASKS.register("bench")(lambda **kw: _FixedTask(tuple(PROMPTS[:n_prompts])))

    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with tempfile.TemporaryDirectory() as d, initialize_config_dir(conf, version_base="1.3"):
        cfg = compose("config", overrides=[
            "task=arith", "task.name=bench", "~task.size", "~task.eval_size",
            "~task.max_operand", "~task.ops", "~task.seed", "~task.format_reward",
            f"trainer.batch_prompts={n_prompts}", f"algo.group_size={group}",
            f"trainer.max_new_tokens={completion}", f"trainer.max_steps={steps + 1}",
            f"algo.beta={beta}", "trainer.progress=false", "trainer.loggers=[]",
            "trainer.save_every=0", "trainer.ignore_eos=true", f"trainer.run_dir={d}"])
        t = tr.build_trainer(resolved_config(cfg))
        hist = [t.step() for _ in range(steps + 1)][1:]  # step 0 includes compilation
        t.close()
    keys = ["time/rollout_s", "time/reference_s", "time/train_s", "time/step_s", "tokens_per_s"]
    return {k: float(np.mean([h[k] for h in hist])) for k in keys}


def trl_grpo(n_prompts: int, group: int, completion: int, steps: int, beta: float) -> float:
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = hf_float_model()
    folder = tempfile.mkdtemp()  # TRL builds its reference model from a path
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]}
                              for p in PROMPTS[:n_prompts]] * (steps + 2))
    times: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(output_dir=d, per_device_train_batch_size=n_prompts * group,
                          num_generations=group, max_completion_length=completion,
                          max_steps=steps + 1, beta=beta, learning_rate=1e-6, use_cpu=True,
                          report_to=[], logging_steps=1000, save_strategy="no",
                          generation_kwargs={"min_new_tokens": completion}, bf16=False)
        trainer = GRPOTrainer(model=folder, processing_class=tok, args=args, train_dataset=data,
                              reward_funcs=[lambda completions, **kw: [float(len(str(c)) % 2)
                                                                       for c in completions]],
                              callbacks=[Timer()])
        trainer.train()
    return float(np.mean(times[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--skip-ours", action="store_true", help="only TRL and fwd+bwd")
    a = ap.parse_args()
    peak = matmul_peak_gflops()
    nan = float("nan")
    ours = {k: nan for k in ("time/rollout_s", "time/reference_s", "time/train_s",
                             "time/step_s", "tokens_per_s")}
    if not a.skip_ours:
        ours = ours_grpo(a.prompts, a.group, a.completion, a.steps, a.beta)
        print(f"ours: {ours}", flush=True)
    try:
        trl_s = trl_grpo(a.prompts, a.group, a.completion, a.steps, a.beta)
    except ImportError as e:
        trl_s = nan
        print(f"TRL unavailable ({e})")
    print(f"GRPO step, SmolLM2-135M f32 CPU: {a.prompts} prompts x {a.group} completions x "
          f"{a.completion} tokens, beta={a.beta}, mean of {a.steps} steps after a warm-up")
    print(f"  ours: step {ours['time/step_s']:.2f} s = rollout {ours['time/rollout_s']:.2f} + "
          f"reference {ours['time/reference_s']:.2f} + train {ours['time/train_s']:.2f} "
          f"(+ rewards/host); {ours['tokens_per_s']:.0f} tokens/s")
    print(f"  TRL GRPOTrainer: step {trl_s:.2f} s   ratio ours/TRL = "
          f"{ours['time/step_s'] / trl_s:.2f} (target <= 0.5)")
    jt, pt = ours_fwd_bwd(), torch_fwd_bwd()
    n_params = 134.5e6
    gflops = 6 * n_params * 8 * 256 / jt / 1e9
    print(f"forward+backward 8x256 tokens: ours {jt:.2f} s, PyTorch {pt:.2f} s "
          f"(ratio {jt / pt:.2f}); ours ~{gflops:.0f} GFLOP/s = {gflops / peak:.0%} of the "
          f"measured f32 matmul peak {peak:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
