"""Export a training run's checkpoint (or a base model) as a Hugging Face folder.

    python -m rl.export RUN_DIR OUT_DIR                 # the run's latest checkpoint
    python -m rl.export RUN_DIR OUT_DIR --step 200      # a given checkpoint
    python -m rl.export --model smollm2_135m OUT_DIR    # a base model (preset, HF folder, GGUF)
      [--dtype float32|bfloat16|float16] [--force] [--max-shard-size 5GB]

The run's parameters are restored as ``rl.eval`` does (the base model named in the run's
config.yaml, then its checkpoint with checksums verified) and written by
``models.export.export_hf``; a LoRA run's adapters are merged into its base first
(W + alpha/rank A @ B, ``rl.run.lora.restore_merged``; refused, naming ``model.path``, when the
base weights are not the ones the adapters were trained on).
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads the folder with our
logits. The dtype defaults to the source config.json's (float32 for a GGUF or a preset).
Bad input (no run folder, no checkpoint, an unknown step, an OUT_DIR that exists and is not
empty without --force) is named on stderr with exit code 2 before anything is loaded or
written. The command lives in ``rl`` because run folders do; the writer is in ``models``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from models.config import ModelLoadError
from models.export import DTYPES, ExportError, ExportOptions, check_out_dir, export_hf
from models.presets import PRESETS
from rl.run.checkpoint import CheckpointError
from rl.run.config import ConfigError

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20,
         "GIB": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9 bytes (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"--max-shard-size {text!r}: expected e.g. 5GB, 200MB")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def _parser() -> argparse.ArgumentParser:
    usage = ("python -m rl.export RUN_DIR OUT_DIR [--step N] [options]\n"
             "       python -m rl.export --model PATH_OR_PRESET OUT_DIR [options]")
    ap = argparse.ArgumentParser(prog="python -m rl.export", usage=usage, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="RUN_DIR OUT_DIR, or only OUT_DIR with --model")
    ap.add_argument("--model", help="export this base model (preset, HF folder, GGUF) instead")
    ap.add_argument("--step", type=int, help="the checkpoint step (default: the latest)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="default: the source's")
    ap.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    ap.add_argument("--max-shard-size", type=parse_size, default="5GB",
                    help="safetensors shard size (default 5GB; index file when sharded)")
    return ap


def checked_step(run_dir: Path, step: int | None) -> int:
    """The checkpoint step to export, or FileNotFoundError / ExportError naming what is
    missing (nothing is created in the run folder)."""
    from rl.run.checkpoint import Checkpointer
    from rl.run.evaluation import run_config

    run_config(run_dir)  # FileNotFoundError: not a run folder
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no checkpoints in this run folder")
    ckpt = Checkpointer(folder)
    steps = sorted(ckpt.manager.all_steps())
    ckpt.close()
    if not steps:
        raise FileNotFoundError(f"{folder}: no finished checkpoint in this run folder")
    if step is not None and step not in steps:
        raise ExportError(f"{folder}: no checkpoint of step {step}; steps: "
                          f"{', '.join(map(str, steps))}")
    return steps[-1] if step is None else step


def _source(model_path: str) -> Path | None:
    """The files the model came from (None for a preset: config and tokenizer are built)."""
    return None if model_path in PRESETS else Path(model_path).expanduser()


def export(args: argparse.Namespace) -> str:
    """Do the export; the line to print."""
    from models import load_params
    from rl.run.evaluation import restore_run_params, run_model

    run_dir = None if args.model else Path(args.paths[0])
    out_dir = Path(args.paths[-1])
    check_out_dir(out_dir, args.force)
    step = None if run_dir is None else checked_step(run_dir, args.step)
    model_path, revision = ((args.model, None) if args.model or run_dir is None
                            else run_model(run_dir))
    cfg, params, tok = load_params(model_path, revision=revision)
    if run_dir is not None:
        params, step = restore_run_params(run_dir, params, step)
    options = ExportOptions(dtype=args.dtype, force=args.force,
                            max_shard_bytes=args.max_shard_size)
    s = export_hf(cfg, params, tok, _source(model_path), out_dir, options)
    what = f"model {model_path}" if run_dir is None else f"step {step} of {run_dir}"
    return (f"exported {what} to {s.out_dir}: {cfg.arch}, {s.num_params / 1e6:.1f}M "
            f"parameters, {s.dtype}, weights {', '.join(s.weight_files)}, tokenizer "
            f"{', '.join(s.tokenizer_files) or '(none)'}; load it with transformers."
            f"AutoModelForCausalLM.from_pretrained({str(s.out_dir)!r})")


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if len(args.paths) != (1 if args.model else 2):
        ap.error("expected RUN_DIR OUT_DIR, or --model PATH OUT_DIR")
    if args.step is not None and args.model:
        ap.error("--step is for a run folder, not --model")
    try:
        print(export(args))
    except (ExportError, ModelLoadError, FileNotFoundError, CheckpointError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
