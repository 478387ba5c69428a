#!/usr/bin/env bash
# The accelerator check: one command on a bare NVIDIA GPU machine, each part bounded in time.
#
#   bash bench/gpu_check.sh [OUT_DIR]          (default bench/results/gpu_check)
#
# 1. JAX with CUDA: kept if `python3` already has a GPU backend, else `pip install -e
#    '.[cuda12]'`. Offline, WHEELS=<folder> installs the project's other dependencies from
#    wheels there (no index, no dependencies resolved) into $OUT_DIR/site.
# 2. Prints the device, then runs, most important first, each part under `timeout` and all
#    under BUDGET seconds (default 420; a part that would start with under 20 s left is skipped):
#    - bench.sampling_check (the sampler's drawn distribution against the softmax, at HIGHEST
#      and at the backend's default matmul precision) and the sampler's distribution tests;
#    - bench.accelerator at its defaults (decode tokens/s, a decode step's time against the
#      bytes it must read, update MFU), then its decode again with XLA's command buffers
#      taking in while loops and conditionals (COMMAND_BUFFERS);
#    - the Pallas GPU decode kernel (trainer.decode_kernel=pallas_gpu): its tests compiled for
#      the GPU (on a CPU they run in Pallas' interpreter), then the decode timed through it;
#    - one prompt per group (trainer.shared_prompts): its tests, then the decode timed with
#      prompts shared by groups of 8;
#    - the paged KV cache with the Pallas GPU paged-attention kernel
#      (trainer.decode_kernel=paged_gpu): its tests compiled for the GPU, then the decode,
#      then the decode with groups of 8 sharing their prompt's pages;
#    - bench.scoring_precision (a float32 policy's log-probs against float32-true, sampler
#      against scoring pass, at the default precision, at ours and at HIGHEST);
#    - 3 steps of rl.train on a random-weight Qwen3-0.6B-shaped HF folder (bench.random_model,
#      no download) with the settings recommended for accelerators: bfloat16 compute, bfloat16
#      rollouts and KV cache, remat, response logits in chunks; beta 0.04 so the reference
#      pass runs; then a resume of that run for 1 more step from its checkpoint;
#    - rl.smoke (3 steps straight against 2 + save + restore + 1, memory per chip);
#    - bench.accelerator at a larger batch.
# Each part's output goes to OUT_DIR/<part>.log, the figures to OUT_DIR/*.jsonl.
# TOKENIZER=<HF folder or GGUF> names the tokenizer (default: the shipped SmolLM2 GGUF).
# ONLY=<regex> runs the parts whose names match (sampling_check sampler_tests accelerator
# decode_command_buffers pallas_kernel_tests decode_pallas_kernel shared_prompts_tests
# decode_shared_prompts paged_kernel_tests decode_paged_kernel decode_paged_shared
# scoring_precision train
# resume smoke accelerator_large). A dry run
# on a CPU, small: SHAPES=tiny, and extra arguments appended (so they win) with
# ACCEL_ARGS (bench.accelerator), SAMPLING_ARGS (bench.sampling_check), PRECISION_ARGS
# (bench.scoring_precision), TRAIN_ARGS (rl.train).
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results/gpu_check}}
BUDGET=${BUDGET:-420}
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-qwen3_0_6b}
COMMAND_BUFFERS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL
read -r -a ACCEL <<< "${ACCEL_ARGS:-}"
read -r -a SAMPLING <<< "${SAMPLING_ARGS:-}"
read -r -a PRECISION <<< "${PRECISION_ARGS:-}"
read -r -a EXTRA_TRAIN <<< "${TRAIN_ARGS:-}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
START=$(date +%s)
TOK_ARGS=()
[ -n "${TOKENIZER:-}" ] && TOK_ARGS=(--tokenizer "$TOKENIZER")
export PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS command...: run it under the smaller of SECONDS and what is left
  local name=$1 limit=$2; shift 2
  if [[ ! $name =~ ${ONLY:-.} ]]; then return; fi
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 20 ]; then echo "== $name: skipped (budget spent)"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit} s)"
  local t0; t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  grep -v "^\s*$" "$OUT_DIR/$name.log" | grep -iv "warning\|^  warnings.warn\|compil" |
    tail -n 25
  echo "== $name: exit $rc in $(($(date +%s) - t0)) s$([ $rc = 124 ] && echo ' (timed out)')"
}

if [ "${JAX_PLATFORMS:-}" != cpu ] &&
   ! "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
  "$PY" -m pip install -q -e '.[cuda12]' || exit 1
fi
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$OUT_DIR/site" \
    "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$OUT_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PY" - <<'EOF'
import importlib.metadata as md, platform, jax
print("python", platform.python_version(), "| jax", jax.__version__, "| devices", jax.devices())
for name in ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "optax", "orbax-checkpoint",
             "numpy", "hydra-core", "tokenizers"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
EOF
} 2>&1 | tee "$OUT_DIR/env.log"

# the random-weight model is written on the CPU while the GPU parts run
MODEL=$OUT_DIR/${SHAPES}_random
JAX_PLATFORMS=cpu timeout 300 "$PY" -m bench.random_model --shapes "$SHAPES" --out "$MODEL" \
  --force "${TOK_ARGS[@]}" > "$OUT_DIR/random_model.log" 2>&1 &
WRITER=$!

part sampling_check 90 "$PY" -m bench.sampling_check "${SAMPLING[@]}"
part sampler_tests 90 env JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" "$PY" -m pytest -q \
  -p no:cacheprovider tests/models/test_sampler.py -k "frequencies or float32_true or grid_of"
part accelerator 150 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" \
  --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
# the decode again with XLA's command buffers (CUDA graphs) taking in loops and conditionals:
# a decode step is a while loop's body, whose condition XLA otherwise checks on the host
part decode_command_buffers 90 env XLA_FLAGS="${XLA_FLAGS:-} $COMMAND_BUFFERS" \
  "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --parts decode \
  --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
# the Pallas GPU decode kernel: each row reads its own slots (not checked on a GPU before)
part pallas_kernel_tests 120 env JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" "$PY" -m pytest -q \
  -p no:cacheprovider tests/models/test_decode_attention.py \
  tests/models/test_kv_layout.py::test_the_pallas_kernels_rows_generate_what_the_default_does
part decode_pallas_kernel 90 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --parts decode \
  --decode-kernel pallas_gpu --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
# one prompt per group (trainer.shared_prompts): the decode's prompts in groups of 8, each
# group reading its prompt's cache once; its tests compiled for the GPU first
part shared_prompts_tests 90 env JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" "$PY" -m pytest -q \
  -p no:cacheprovider tests/models/test_prompt_sharing.py -k "softmax or sample_what"
part decode_shared_prompts 90 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --parts decode \
  --shared-prompts --group 8 --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
# a paged KV cache read by the Pallas GPU paged-attention kernel: each row its own pages
part paged_kernel_tests 120 env JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" "$PY" -m pytest -q \
  -p no:cacheprovider tests/models/test_paged_attention.py tests/models/test_paged_cache.py \
  -k "not tpu"
part decode_paged_kernel 90 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --parts decode \
  --decode-kernel paged_gpu --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
# and groups of 8 rows sharing their prompt's pages, each group's prompt read once
part decode_paged_shared 90 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --parts decode \
  --decode-kernel paged_gpu --shared-prompts --group 8 --json "$OUT_DIR/accelerator.jsonl" \
  "${ACCEL[@]}"
part scoring_precision 120 "$PY" -m bench.scoring_precision --shapes "$SHAPES" "${TOK_ARGS[@]}" \
  --json "$OUT_DIR/scoring_precision.jsonl" "${PRECISION[@]}"

wait $WRITER; echo "== random_model: exit $?"; tail -n 3 "$OUT_DIR/random_model.log"
RUN=$OUT_DIR/train_run
TRAIN=(model=hf "model.path=$MODEL" model.dtype=bfloat16 algo.beta=0.04
  trainer.batch_prompts=16 algo.group_size=8 trainer.max_new_tokens=256
  trainer.rollout_dtype=bfloat16 trainer.kv_cache_dtype=bfloat16 trainer.remat=true
  trainer.logits_chunk=128 trainer.skip_zero_advantage=false trainer.eval_at_ends=false
  trainer.progress=false trainer.sample_every=0 trainer.loggers=[] "trainer.run_dir=$RUN")
part train 210 env JAX_LOG_COMPILES=1 "$PY" -m rl.train "${TRAIN[@]}" trainer.max_steps=3 \
  trainer.save_every=3 "${EXTRA_TRAIN[@]}"
if [ -f "$OUT_DIR/train.log" ]; then
  echo "programs compiled in those steps (the rollout's, the scoring passes', the update's):"
  grep -o "Compiling jit([a-z_]*)" "$OUT_DIR/train.log" | sort | uniq -c |
    grep "_generate\|batch_logprobs\|train_step"
fi
part resume 90 env JAX_LOG_COMPILES=1 "$PY" -m rl.train "${TRAIN[@]}" trainer.max_steps=4 \
  trainer.resume=true "${EXTRA_TRAIN[@]}"
if [ -f "$OUT_DIR/resume.log" ]; then  # a resume should find its programs in the cache
  echo "the resumed process's programs in the persistent compile cache (hits, then misses):"
  grep -o "compilation cache hit for 'jit_[a-z_]*'" "$OUT_DIR/resume.log" | sort | uniq -c |
    grep "_generate\|batch_logprobs\|train_step" || echo "      no hits"
  grep -o "COMPILATION CACHE MISS for 'jit_[a-z_]*'" "$OUT_DIR/resume.log" | sort | uniq -c |
    grep "_generate\|batch_logprobs\|train_step" || echo "      no misses"
fi
cp "$RUN/metrics.jsonl" "$OUT_DIR/train_metrics.jsonl" 2>/dev/null &&
  "$PY" - "$OUT_DIR/train_metrics.jsonl" <<'EOF'
import json, sys
print("step  rollout_s  reference_s  update_s  step_s  generated_tokens  rollout_tok/s")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['step']:4d} {r['time/rollout_s']:10.2f} {r['time/reference_s']:12.2f} "
          f"{r['time/train_s']:9.2f} {r['time/step_s']:7.2f} {r['rollout/generated_tokens']:17d} "
          f"{r['rollout/tokens_per_s']:14.0f}")
EOF
part smoke 240 "$PY" -m rl.smoke "${TRAIN[@]}" "trainer.run_dir=$OUT_DIR/smoke" \
  trainer.batch_prompts=4 algo.group_size=4 trainer.max_new_tokens=32 "${EXTRA_TRAIN[@]}"
part accelerator_large 150 "$PY" -m bench.accelerator "${TOK_ARGS[@]}" --batch 256 \
  --new-tokens 256 --json "$OUT_DIR/accelerator.jsonl" "${ACCEL[@]}"
rm -rf "$MODEL" "$RUN/checkpoints" "$OUT_DIR/smoke"/*/checkpoints "$OUT_DIR/site"
echo "== done in $(($(date +%s) - START)) s"
