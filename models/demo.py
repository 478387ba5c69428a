"""Generate from a model on the command line (``make demo ARGS='"Why is the sky blue?"'``):

    python -m models.demo "Why is the sky blue?" ["Another prompt" ...]
        [--model smollm2_135m | PRESET | HF_FOLDER | FILE.gguf] [--max-new-tokens 128]
        [--temperature 0] [--top-p 1.0] [--seed 0] [--dtype float32|bfloat16]

Each prompt is one user turn in the model's chat template; the prompts are sampled as one batch
by the jitted KV-cache sampler. Prints each reply, then tokens generated and the decode speed
(the first call compiles; the speed line says how long that took).
"""

from __future__ import annotations

import argparse
import time

from models import load_params
from models.sampler import SamplingParams, decode_params, generate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the decode matmuls' dtype (decode_params)")
    a = ap.parse_args(argv)

    cfg, params, tok = load_params(a.model)
    weights = decode_params(params, a.dtype)
    ids = [tok.encode_chat([{"role": "user", "content": p}]) for p in a.prompts]
    sampling = SamplingParams(a.max_new_tokens, a.temperature, a.top_p)
    t0 = time.perf_counter()
    out = generate(cfg, weights, tok, ids, sampling, seed=a.seed)
    seconds = time.perf_counter() - t0
    for prompt, text, finish in zip(a.prompts, out.texts, out.finish):
        print(f"> {prompt}\n{text.strip()}\n[{finish}]\n")
    n = int(out.lengths.sum())
    print(f"{n} tokens in {seconds:.1f} s including compilation ({n / seconds:.0f} tok/s), "
          f"model {a.model}, batch {len(ids)}")


if __name__ == "__main__":
    main()
