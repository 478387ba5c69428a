"""Sentence embedders: the NumPy MiniLM against transformers, paraphrase similarity, and the
hashing stand-in used by unit tests."""

from __future__ import annotations

import numpy as np
import pytest

from judges import Draft
from memory import (
    CommonRubric,
    Embedder,
    HashingEmbedder,
    MemoryConfig,
    MiniLMEmbedder,
    RubricMemory,
    get_embedder,
    merge_or_add,
)

SENTENCES = [
    "Searches for an entity that is named in the question.",
    "Issues a search query targeting the entity the question names.",
    "Stops searching once retrieved information already mentions its final answer.",
    "The weather in Paris is sunny today.",
    "",
    "word " * 400,  # longer than 256 word pieces: truncated
    "Ünïcödé text, with punctuation!? And CAPITALS.",
]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return get_embedder("minilm")  # type: ignore[return-value]


def test_hashing_embedder_is_deterministic_and_normalised():
    e = HashingEmbedder(dim=64)
    assert isinstance(e, Embedder)
    a = e.embed(["Entity-targeted search", "Search economy", "Entity-targeted search"])
    assert a.shape == (3, 64) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(a[0], a[2])
    np.testing.assert_array_equal(a, HashingEmbedder(dim=64).embed(
        ["Entity-targeted search", "Search economy", "Entity-targeted search"]))
    assert e.embed([]).shape == (0, 64)
    # Sharing words raises similarity.
    v = e.embed(["search for the named entity", "search for the named entities",
                 "a concise final answer"])
    assert v[0] @ v[1] > v[0] @ v[2]


def test_minilm_shapes_norms_and_cache(minilm):
    v = minilm.embed(SENTENCES)
    assert v.shape == (len(SENTENCES), 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    # Cached and batched calls give the same vectors as single calls.
    np.testing.assert_allclose(minilm.embed([SENTENCES[2]])[0], v[2], atol=1e-6)
    assert get_embedder("minilm") is minilm
    assert minilm.embed([]).shape == (0, 384)


def test_minilm_paraphrases_are_closer_than_unrelated(minilm):
    v = minilm.embed(SENTENCES[:4])
    cos = v @ v.T
    # paraphrase pair (0, 1) vs unrelated pairs
    assert cos[0, 1] > cos[0, 3] + 0.3
    assert cos[0, 1] > cos[1, 3] + 0.3
    assert cos[0, 1] > cos[0, 2]  # a different process criterion is farther than a paraphrase


def test_minilm_merges_a_reworded_rubric(minilm):
    old = Draft("Entity-targeted search", "Searches for an entity that is named in the "
                "question, so retrieval targets the question's key subject.")
    new = Draft("Targeted entity search", "Searches for an entity named in the question so that "
                "retrieval targets the key subject of the question.")
    other = Draft("Concise final answer", "Gives a final answer of at most 5 words.")
    mem = RubricMemory(commons=(CommonRubric("c0", old, (), 0),), next_id=1)
    cfg = MemoryConfig(merge_threshold=0.9)
    _, ev = merge_or_add(mem, new, ("d1",), minilm, cfg, 0)
    assert ev.kind == "merged" and ev.cosine > 0.9
    _, ev = merge_or_add(mem, other, ("d2",), minilm, cfg, 0)
    assert ev.kind == "consolidated"


@pytest.mark.slow
def test_minilm_matches_transformers_reference(minilm):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm.model_dir)
    model = AutoModel.from_pretrained(minilm.model_dir).eval()
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    ref = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    ours = minilm.embed(SENTENCES)
    assert np.abs(ours - ref).max() < 1e-4
