"""In-process JAX judge backend on the library's own models (embedded default: SmolLM2-135M).

``JaxBackend`` implements the ``Backend`` seam of ``LLMJudge``:

* ``choice_probs`` (criterion checks with ``check_mode="logprob"``): ONE forward pass per
  batch, no generation. The chat template's assistant-turn prefix is appended
  (``add_generation_prompt``), the next-token distribution is read at the last prompt position
  only (hidden state of that position -> unembedding, so no [B, T, V] logits), and the
  probability mass of each choice's tokens ("Yes", " Yes", "yes", ...) is normalised over the
  choices;
* ``complete`` (JSON verdicts, rubric induction, consolidation, bundling, equivalence, and the
  re-asks): short batched generation with the jitted KV-cache sampler.

Batches are sorted by prompt length and cut into chunks of at most ``max_batch`` rows and about
``max_batch_tokens`` padded tokens, so similar lengths share a chunk (little padding) and a long
prompt cannot blow up the attention memory of a whole batch. Chunks are padded to a power-of-two
number of rows for scoring, which bounds the number of distinct shapes jit has to compile.

A prompt longer than ``max_prompt_tokens`` is never truncated (cutting a trajectory would change
what is judged): ``complete`` returns a ``Completion`` with ``error`` set and ``choice_probs``
returns ``{}``, so the judge scores the item with its defined fallback and counts it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from judges.base import BACKEND_STAT_KEYS, Counters, Judge, OptionAttributes
from judges.llm import LLMJudge, as_type, split_llm_options
from judges.types import Completion, Messages
from models import load_params
from models.config import ModelConfig
from models.padding import left_pad
from models.sampler import SamplingParams, generate
from models.tokenizer import Tokenizer
from models.transformer import Params, forward, unembed

# Counters of this backend on top of the shared ``BACKEND_STAT_KEYS`` (where the HTTP ones stay
# 0, ``backend_calls`` counts every item asked for, ``prompt_tokens``/``completion_tokens`` the
# tokens actually run through the model).
LOCAL_STAT_KEYS = (
    "forward_passes",  # jitted scoring passes (one per chunk of choice_probs)
    "generate_calls",  # jitted sampler calls (one per chunk of complete)
    "decode_steps",  # sequential decode steps over all sampler calls (the latency driver)
    "prompt_too_long",  # items refused because the prompt exceeds max_prompt_tokens
)

Loaded = tuple[ModelConfig, Params, Tokenizer]


@functools.partial(jax.jit, static_argnames=("cfg",))
def _choice_logmass(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array,
                    ids: jax.Array, id_mask: jax.Array) -> jax.Array:
    """log P(next token in choice c's token set) for each row, [B, C].

    tokens/mask [B, T] are left padded, so position -1 is every row's last real token; ids
    [C, K] lists each choice's token ids, id_mask [C, K] which of them are real.
    """
    hidden = forward(cfg, params, tokens, mask, return_hidden=True)
    logp = jax.nn.log_softmax(unembed(cfg, params, hidden[:, -1]), axis=-1)  # [B, V]
    picked = jnp.where(id_mask[None], logp[:, ids], -jnp.inf)  # [B, C, K]
    return jax.nn.logsumexp(picked, axis=-1)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class LocalOptions:
    """The keyword options of :class:`JaxBackend` (documented there), checked once."""

    max_batch: int = 16
    max_new_tokens: int = 256
    seed: int = 0
    dtype: str = "float32"
    max_batch_tokens: int = 16384
    max_prompt_tokens: int | None = None
    min_choice_mass: float = 0.0
    top_p: float = 1.0
    length_bucket: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # config values may arrive as strings or floats
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, as_type(str(f.type), value))
        if min(self.max_batch, self.max_new_tokens, self.max_batch_tokens,
               self.length_bucket) < 1:
            raise ValueError("need max_batch, max_new_tokens, max_batch_tokens, "
                             "length_bucket >= 1")


def _firsts(prompts: Sequence[list[int] | None], chunk: Sequence[Sequence[int]]
            ) -> list[list[int]]:
    """The prompt each group of a chunk computes (its first item's; never a dropped one)."""
    firsts = [prompts[g[0]] for g in chunk]
    return [p for p in firsts if p is not None]


class JaxBackend(OptionAttributes):
    """Judge backend running a ``models`` LLM in this process (``complete`` + ``choice_probs``).

    Args:
        model: a preset name (``"smollm2_135m"``, ``"tiny"``), an HF folder or GGUF path for
            ``models.load_params``, or an already loaded ``(cfg, params, tokenizer)``.
        max_batch: most rows per jitted call.
        max_new_tokens: cap on generated tokens (the judge's ``max_tokens`` is cut to it).
        seed: seeds sampling when the judge samples (temperature > 0); each sampler call folds
            in its call index, so re-asks differ and a rerun is identical.
        dtype: parameter dtype when loading (``"float32"``, ``"bfloat16"``).
        max_batch_tokens: soft cap on rows x padded length per call (attention memory).
        max_prompt_tokens: longest accepted prompt; default: the model's context minus
            ``max_new_tokens``.
        min_choice_mass: when the choices together get less next-token probability than this,
            ``choice_probs`` returns ``{}`` for the item (the model is not answering with a
            choice; the judge then asks for a JSON verdict). 0 always trusts the probabilities.
        top_p: nucleus sampling for ``complete`` at temperature > 0.
        length_bucket: prompts are left padded to a multiple of this for scoring (fewer shapes
            to compile; the sampler uses its own buckets).
    """

    def __init__(self, model: str | Loaded = "smollm2_135m", **options: Any):
        o = LocalOptions(**options)
        if isinstance(model, str):
            self.model_name = model
            self.cfg, self.params, self.tokenizer = load_params(model, jnp.dtype(o.dtype))
        else:
            self.cfg, self.params, self.tokenizer = model
            self.model_name = "<loaded>"
        limit = o.max_prompt_tokens or self.cfg.max_position_embeddings - o.max_new_tokens
        o = dataclasses.replace(o, max_prompt_tokens=limit)
        if limit < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1 (model context "
                             f"{self.cfg.max_position_embeddings}, max_new_tokens "
                             f"{o.max_new_tokens})")
        self.options = o
        self._c = Counters((*BACKEND_STAT_KEYS, *LOCAL_STAT_KEYS))
        # JAX dispatch is thread-safe, but two batches interleaving on 2 CPU cores only thrash;
        # the lock also keeps the sampler's call counter (seeding) deterministic.
        self._lock = threading.Lock()
        self._key = jax.random.key(self.seed)
        self._n_generate = 0
        self._choice_ids: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray] | None] = {}
        self._closed = False

    def __repr__(self) -> str:
        return (f"JaxBackend(model={self.model_name!r}, max_batch={self.max_batch}, "
                f"max_new_tokens={self.max_new_tokens}, seed={self.seed})")

    # --- public API -----------------------------------------------------------------------

    def complete(
        self, batch: Sequence[Messages], max_tokens: int, temperature: float
    ) -> list[Completion]:
        """One completion per message list, same order (greedy at temperature 0)."""
        self._check_open()
        self._c.inc("backend_calls", len(batch))
        n_new = max(1, min(int(max_tokens), self.max_new_tokens))
        sampling = SamplingParams(max_new_tokens=n_new, temperature=float(temperature),
                                  top_p=self.top_p if temperature > 0 else 1.0)
        out: list[Completion | None] = [None] * len(batch)
        prompts = self._encode(batch, out, lambda n: Completion(
            text="", error=f"prompt too long ({n} tokens > {self.max_prompt_tokens})"))
        # Greedy decoding is deterministic: identical conversations are generated once.
        groups = self._dedupe(prompts, dedupe=temperature == 0)
        width = lambda n: -(-n // 16) * 16 + n_new  # noqa: E731  (the sampler's cache length)
        with self._lock:
            for chunk in self._chunks(groups, prompts, width):
                comps = self._generate_chunk(_firsts(prompts, chunk), sampling)
                for g, comp in zip(chunk, comps):
                    for n, i in enumerate(g):
                        if n:
                            self._c.inc("cache_hits")
                        out[i] = comp if n == 0 else Completion(
                            comp.text, comp.prompt_tokens, comp.completion_tokens, cached=True)
        return [c if c is not None else Completion("", error="internal: no result") for c in out]

    def choice_probs(
        self, batch: Sequence[Messages], choices: Sequence[str] = ("Yes", "No")
    ) -> list[dict[str, float]]:
        """P(the assistant's first token spells each choice), normalised over ``choices``, from
        one forward pass per chunk; ``{}`` for an item that cannot be scored."""
        self._check_open()
        choices = tuple(choices)
        self._c.inc("backend_calls", len(batch))
        table = self._choice_table(choices)
        if table is None:  # e.g. two choices starting with the same token: cannot tell apart
            self._c.inc("logprob_unsupported", len(batch))
            return [{} for _ in batch]
        out: list[dict[str, float] | None] = [None] * len(batch)
        prompts = self._encode(batch, out, lambda n: {})
        groups = self._dedupe(prompts, dedupe=True)
        width = lambda n: -(-n // self.length_bucket) * self.length_bucket  # noqa: E731
        ids, id_mask = table
        with self._lock:
            for chunk in self._chunks(groups, prompts, width):
                logmass = self._score_chunk(_firsts(prompts, chunk), ids, id_mask)
                for g, row in zip(chunk, logmass):
                    probs = self._normalise(choices, row)
                    for n, i in enumerate(g):
                        out[i] = dict(probs)  # callers may mutate their dicts
                        if n:
                            self._c.inc("cache_hits")
        result = [p if p is not None else {} for p in out]
        self._c.inc("logprob_unsupported", sum(not p for p in result))
        return result

    def stats(self) -> dict[str, int]:
        return self._c.snapshot()

    def sampling_state(self) -> dict[str, int]:
        """What the next sampled completion depends on besides ``seed``: the number of sampler
        calls so far (each folds its index into the key). Saved in a trainer checkpoint, so a
        resumed run samples the same judge completions as an uninterrupted one."""
        return {"n_generate": self._n_generate}

    def restore_sampling_state(self, state: Mapping[str, Any]) -> None:
        n = state.get("n_generate") if isinstance(state, Mapping) else None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"judge sampling state: n_generate must be an integer >= 0, got "
                             f"{state!r}")
        with self._lock:
            self._n_generate = n

    def close(self) -> None:
        """Drop the parameters (frees the model's memory); idempotent."""
        with self._lock:
            self._closed = True
            self.params = {}

    # --- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("JaxBackend is closed")

    def _encode(self, batch: Sequence[Messages], out: list[Any],
                too_long: Any) -> list[list[int] | None]:
        """Chat-template token ids (with the assistant prefix) per item; ``None`` (and ``out``
        filled with ``too_long(n)``) for prompts over the limit."""
        prompts: list[list[int] | None] = []
        for i, messages in enumerate(batch):
            ids = self.tokenizer.encode_chat([dict(m) for m in messages],
                                             add_generation_prompt=True)
            if not ids or len(ids) > self.max_prompt_tokens:
                self._c.inc("prompt_too_long")
                out[i] = too_long(len(ids))
                prompts.append(None)
            else:
                prompts.append(ids)
        return prompts

    @staticmethod
    def _dedupe(prompts: list[list[int] | None], dedupe: bool) -> list[list[int]]:
        """Groups of item indices sharing one computation (first index is computed)."""
        groups: dict[Any, list[int]] = {}
        for i, p in enumerate(prompts):
            if p is not None:
                groups.setdefault(tuple(p) if dedupe else i, []).append(i)
        return list(groups.values())

    def _chunks(self, groups: list[list[int]], prompts: list[list[int] | None],
                width: Callable[[int], int]) -> list[list[list[int]]]:
        """Groups sorted by prompt length, cut into chunks of <= max_batch rows whose rows x
        padded width stays within max_batch_tokens (a single over-budget row gets its own)."""
        length = lambda g: len(prompts[g[0]] or ())  # noqa: E731
        chunks: list[list[list[int]]] = []
        cur: list[list[int]] = []
        for g in sorted(groups, key=length):
            w = width(length(g))  # ascending, so the newest row sets the chunk width
            if cur and (len(cur) >= self.max_batch or (len(cur) + 1) * w > self.max_batch_tokens):
                chunks.append(cur)
                cur = []
            cur.append(g)
        if cur:
            chunks.append(cur)
        return chunks

    def _padded_rows(self, n: int, width: int) -> int:
        """Rows to run for n real ones: the next power of two when it fits the budgets."""
        rows = min(_pow2_at_least(n), self.max_batch)
        return rows if rows * width <= self.max_batch_tokens else n

    def _score_chunk(self, prompts: list[list[int]], ids: np.ndarray,
                     id_mask: np.ndarray) -> np.ndarray:
        tokens, mask = left_pad(prompts, self.tokenizer.pad_id, bucket=self.length_bucket)
        n, width = tokens.shape
        rows = self._padded_rows(n, width)
        if rows > n:  # dummy rows: one real token each, results dropped
            tokens = np.concatenate([tokens, np.full((rows - n, width), self.tokenizer.pad_id,
                                                     np.int32)])
            mask = np.concatenate([mask, np.zeros((rows - n, width), bool)])
            mask[n:, -1] = True
        logmass = _choice_logmass(self.cfg, self.params, jnp.asarray(tokens), jnp.asarray(mask),
                                  jnp.asarray(ids), jnp.asarray(id_mask))
        self._c.inc("forward_passes")
        self._c.inc("prompt_tokens", sum(len(p) for p in prompts))
        return np.asarray(jax.device_get(logmass), np.float64)[:n]

    def _generate_chunk(self, prompts: list[list[int]],
                        sampling: SamplingParams) -> list[Completion]:
        # No dummy rows here (unlike scoring): the sampler's shapes depend on the number of
        # distinct prompts too, so padding the batch would not save compiles.
        key = jax.random.fold_in(self._key, self._n_generate)
        self._n_generate += 1
        gen = generate(self.cfg, self.params, self.tokenizer, prompts, sampling, seed=key)
        lengths = [int(k) for k in gen.lengths]
        self._c.inc("generate_calls")
        self._c.inc("decode_steps", max(lengths))
        self._c.inc("prompt_tokens", sum(len(p) for p in prompts))
        self._c.inc("completion_tokens", sum(lengths))
        return [Completion(text=text, prompt_tokens=len(p), completion_tokens=k)
                for text, p, k in zip(gen.texts, prompts, lengths)]

    def _choice_table(self, choices: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """[C, K] token ids per choice (+ validity mask), or None when choices collide.

        A choice counts through every single-token spelling of it, with and without a leading
        space and in any case ("Yes", " Yes", "yes", "YES"), like the HTTP backend's
        case/space-insensitive reading of top logprobs. A choice with no single-token spelling
        counts through the first token of its plain spelling. A token claimed by two choices is
        dropped from both; a choice left with no token makes the table unusable.
        """
        if choices in self._choice_ids:
            return self._choice_ids[choices]
        sets: list[set[int]] = []
        for ch in choices:
            ids: set[int] = set()
            for form in dict.fromkeys((ch, ch.lower(), ch.upper(), ch.capitalize())):
                for variant in (form, " " + form):
                    enc = self.tokenizer.encode(variant)
                    if len(enc) == 1:
                        ids.add(enc[0])
            if not ids:
                enc = self.tokenizer.encode(ch)
                ids = {enc[0]} if enc else set()
            sets.append(ids)
        shared = {t for i, a in enumerate(sets) for b in sets[i + 1:] for t in a & b}
        sets = [s - shared for s in sets]
        table: tuple[np.ndarray, np.ndarray] | None = None
        if choices and all(sets):
            k = max(len(s) for s in sets)
            ids_arr = np.zeros((len(sets), k), np.int32)
            mask = np.zeros((len(sets), k), bool)
            for c, s in enumerate(sets):
                ids_arr[c, :len(s)] = sorted(s)
                mask[c, :len(s)] = True
            table = (ids_arr, mask)
        self._choice_ids[choices] = table
        return table

    def _normalise(self, choices: tuple[str, ...], logmass: np.ndarray) -> dict[str, float]:
        """Softmax over the choices' log masses (stable even when every mass underflows)."""
        if not np.all(np.isfinite(logmass)) or (
            self.min_choice_mass > 0 and np.logaddexp.reduce(logmass) < np.log(self.min_choice_mass)
        ):
            return {}
        p = np.exp(logmass - logmass.max())
        p /= p.sum()
        return {ch: float(v) for ch, v in zip(choices, p)}


def make_local_judge(cfg: dict[str, Any]) -> Judge:
    """LLM judge on an in-process model; backend options are ``JaxBackend``'s keywords.

    ``seed`` is a judge option (order/tie coins) and also seeds the backend's sampling.
    """
    llm, rest = split_llm_options(cfg)
    allowed = {f.name for f in dataclasses.fields(LocalOptions)} - {"seed"} | {"model"}
    unknown = sorted(set(rest) - allowed)
    if unknown:
        raise ValueError(f"unknown local judge option(s): {', '.join(unknown)}")
    return LLMJudge(JaxBackend(**rest, seed=int(llm.get("seed", 0))), **llm)
