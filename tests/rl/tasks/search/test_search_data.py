"""QA dataset loaders, corpus files and the generated multi-hop world."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewards.qa import normalize_answer
from rl.tasks.search.corpus import (
    CorpusError,
    Doc,
    load_corpus,
    parse_contents,
    render_docs,
    write_corpus,
)
from rl.tasks.search.datasets import QA_FORMATS, DatasetError, detect_format, load_qa
from rl.tasks.search.world import build_world, make_questions, make_splits, write_world
from tests.paths import FIXTURES

FIX = FIXTURES / "qa"


# ---------------------------------------------------------------- loaders on fixtures


def test_searchr1_parquet():
    ds = load_qa(FIX / "searchr1.parquet")
    assert ds.fmt == "searchr1" and len(ds) == 3 and ds.n_skipped == 0
    ex = ds[0]
    assert ex.question == "total number of death row inmates in the us"
    assert ex.golds == ("2,718",)
    assert ex.source == "nq"
    assert ex.id == "nq_train_0"
    assert ds[1].question == (
        "Which magazine was started first Arthur's Magazine or First for Women?")
    assert ds[2].golds == ("David Dinkins", "David N. Dinkins")
    assert ds[2].meta["extra_info"] == {"split": "test", "index": 2}


def test_flashrag_jsonl():
    ds = load_qa(FIX / "flashrag.jsonl")
    assert ds.fmt == "flashrag" and [e.id for e in ds] == ["test_0", "test_1", "test_2"]
    assert ds[0].golds == ("Wilhelm Conrad Röntgen",)
    assert ds[1].golds == ("May 18, 2018", "2018")
    assert ds[2].source == "nq" and ds[0].source == "flashrag"


def test_hotpotqa_json():
    ds = load_qa(FIX / "hotpotqa.json")
    assert ds.fmt == "hotpotqa" and len(ds) == 2
    assert ds[0].id == "5a8b57f25542995d1e6f1371" and ds[0].golds == ("yes",)
    assert ds[1].meta["type"] == "bridge" and ds[1].meta["level"] == "hard"
    assert ds[0].source == "hotpotqa"


def test_2wiki_json():
    ds = load_qa(FIX / "2wikimultihopqa.json")
    assert ds.fmt == "2wikimultihopqa" and len(ds) == 2
    assert ds[1].golds == ("Małgorzata Braunek",)
    assert ds[0].meta["type"] == "bridge_comparison"
    assert ds[1].meta["evidences"][1] == ["Xawery Żuławski", "mother", "Małgorzata Braunek"]


def test_musique_jsonl():
    ds = load_qa(FIX / "musique.jsonl")
    assert ds.fmt == "musique" and len(ds) == 2
    assert ds[0].golds == ("1960",)
    assert ds[0].meta["answerable"] is True and ds[0].meta["hops"] == 2
    assert len(ds[0].meta["question_decomposition"]) == 2
    assert ds[1].golds == ("mid-June", "June")
    assert ds[1].meta["answerable"] is False and ds[1].meta["hops"] == 3


def test_bamboogle_csv():
    ds = load_qa(FIX / "bamboogle.csv")
    assert ds.fmt == "bamboogle" and len(ds) == 3
    assert ds[0].id == "bamboogle_0" and ds[0].golds == ("james madison",)
    assert ds[1].question.startswith("What rocket was")  # quoted csv field
    assert ds[2].golds == ("David Dinkins",)


def test_explicit_format_and_source_override():
    ds = load_qa(FIX / "flashrag.jsonl", fmt="flashrag", source="mine")
    assert {e.source for e in ds} == {"mine"}


def test_detect_format_all_fixtures():
    expected = {"searchr1.parquet": "searchr1", "flashrag.jsonl": "flashrag",
                "hotpotqa.json": "hotpotqa", "2wikimultihopqa.json": "2wikimultihopqa",
                "musique.jsonl": "musique", "bamboogle.csv": "bamboogle"}
    for name, fmt in expected.items():
        assert detect_format(FIX / name) == fmt
    assert set(expected.values()) == set(QA_FORMATS.names())


# ---------------------------------------------------------------- errors


def test_bad_row_named():
    msg = r"flashrag_bad\.jsonl: line 2: missing or empty question"
    with pytest.raises(DatasetError, match=msg):
        load_qa(FIX / "flashrag_bad.jsonl")


def test_skip_bad_counts():
    ds = load_qa(FIX / "flashrag_bad.jsonl", skip_bad=True)
    assert [e.id for e in ds] == ["b0", "b4"]
    assert ds.n_skipped == 3 and ds.skipped_rows == (1, 2, 3)


def test_bad_rows_each_reason(tmp_path):
    cases = {
        '{"id": 1, "question": "q?"}': "missing answers",
        '{"id": 1, "question": "q?", "golden_answers": [""]}': "no non-empty answer",
        '{"id": 1, "question": "  ", "golden_answers": ["a"]}': "missing or empty question",
        '{"id": 1, "question": "q?", "golden_answers": [{"x": 1}]}': "not a string",
        "[1, 2]": "expected an object",
        "{not json": "invalid JSON",
    }
    for i, (line, msg) in enumerate(cases.items()):
        p = tmp_path / f"f{i}.jsonl"
        p.write_text('{"id": 0, "question": "ok?", "golden_answers": ["ok"]}\n' + line + "\n")
        with pytest.raises(DatasetError, match=rf"f{i}\.jsonl: line 2: .*{re.escape(msg)}"):
            load_qa(p, fmt="flashrag")


def test_rows_of_unexpected_shape_are_named(tmp_path):
    """Blank lines count (line numbers are an editor's), fields that should be objects are
    checked, and a file that is not UTF-8 is named."""
    p = tmp_path / "f.jsonl"
    p.write_text('{"id": 0, "question": "ok?", "golden_answers": ["ok"]}\n\n'
                 '{"id": 1, "question": "q?", "golden_answers": ["a"], "metadata": ["x"]}\n')
    with pytest.raises(DatasetError, match=r"f\.jsonl: line 3: metadata must be an object"):
        load_qa(p, fmt="flashrag")
    assert load_qa(p, fmt="flashrag", skip_bad=True).skipped_rows == (2,)
    p = tmp_path / "latin1.jsonl"
    p.write_bytes('{"id": 0, "question": "caf\u00e9?", "golden_answers": ["x"]}\n'
                  .encode("latin-1"))
    for fmt in ("flashrag", None):
        with pytest.raises(DatasetError, match=r"latin1\.jsonl: not UTF-8"):
            load_qa(p, fmt=fmt)
    p = tmp_path / "extra.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: a?\n"}],
         "reward_model": {"ground_truth": {"target": ["x"]}}, "extra_info": "oops"}]), p)
    with pytest.raises(DatasetError, match=r"extra\.parquet: row 0: extra_info must be an obj"):
        load_qa(p)


def test_task_evaluates_real_datasets_next_to_the_shipped_world():
    from rl.tasks.search.task import SearchQATask

    task = SearchQATask(n_entities=200, n_train=20, n_dev=5, n_test=5,
                        eval_paths={"musique": str(FIX / "musique.jsonl")})
    assert set(task.split_paths()) == {"train", "dev", "test", "musique"}
    rows = load_qa(FIX / "musique.jsonl")
    answerable = [ex.id for ex in rows if ex.meta["answerable"]]
    assert 0 < len(answerable) < len(rows)  # the fixture has both kinds
    assert [p.id for p in task.prompts("musique")] == answerable


def test_searchr1_bad_row_in_generated_parquet(tmp_path):
    p = tmp_path / "bad.parquet"
    rows = [
        {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: a?\n"}],
         "reward_model": {"ground_truth": {"target": ["x"]}}, "extra_info": {"index": 0}},
        {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: b?\n"}],
         "reward_model": {"ground_truth": {"target": []}}, "extra_info": {"index": 1}},
        {"data_source": "nq", "prompt": [{"role": "user", "content": "no marker here"}],
         "reward_model": {"ground_truth": {"target": ["z"]}}, "extra_info": {"index": 2}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), p)
    with pytest.raises(DatasetError, match=r"bad\.parquet: row 1: no non-empty answer"):
        load_qa(p)
    ds = load_qa(p, skip_bad=True)
    assert ds.n_skipped == 1
    assert [e.question for e in ds] == ["a?", "no marker here"]  # whole content w/o marker


def test_unknown_and_undetectable_format(tmp_path):
    with pytest.raises(DatasetError, match="unknown QA format 'squad'"):
        load_qa(FIX / "flashrag.jsonl", fmt="squad")
    p = tmp_path / "x.jsonl"
    p.write_text('{"q": "what?", "a": "that"}\n')
    with pytest.raises(DatasetError, match="cannot detect the QA format"):
        load_qa(p)
    t = tmp_path / "x.txt"
    t.write_text("hello")
    with pytest.raises(DatasetError, match="cannot detect"):
        load_qa(t)
    with pytest.raises(DatasetError, match="no such file"):
        load_qa(tmp_path / "missing.jsonl")


def test_all_rows_bad_is_an_error(tmp_path):
    p = tmp_path / "allbad.jsonl"
    p.write_text('{"id": 1, "question": "q?", "golden_answers": []}\n')
    with pytest.raises(DatasetError, match=r"no examples \(all 1 rows were bad\)"):
        load_qa(p, fmt="flashrag", skip_bad=True)


def test_json_not_a_list(tmp_path):
    p = tmp_path / "h.json"
    p.write_text('{"_id": "1"}')
    with pytest.raises(DatasetError, match="expected a JSON list"):
        load_qa(p, fmt="hotpotqa")


# ---------------------------------------------------------------- corpus


def test_parse_and_render():
    assert parse_contents('"Paris"\nParis is a city.\nSecond line.') == (
        "Paris", "Paris is a city.\nSecond line.")
    assert parse_contents("No quotes\ntext") == ("No quotes", "text")
    assert parse_contents('"Only title"') == ("Only title", "")
    docs = [Doc("1", "Paris", "Capital of France."), Doc("2", "Lyon", "A city.")]
    assert render_docs(docs) == (
        "Doc 1(Title: Paris) Capital of France.\nDoc 2(Title: Lyon) A city.\n")
    assert render_docs(docs[:1], quote_titles=True) == 'Doc 1(Title: "Paris") Capital of France.\n'
    assert render_docs([]) == ""


def test_corpus_roundtrip(tmp_path):
    docs = [Doc("0", "A", "alpha"), Doc("1", 'B "quoted"', "beta\nmore")]
    p = write_corpus(docs, tmp_path / "c.jsonl")
    assert load_corpus(p) == tuple(docs)


def test_empty_corpus_error(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(CorpusError, match=r"empty\.jsonl: empty corpus"):
        load_corpus(p)


@pytest.mark.parametrize(
    "line, msg",
    [
        ('{"id": "1"}', r"missing field\(s\) \['contents'\]"),
        ('{"id": "1", "contents": 5}', "'contents' must be a string"),
        ("not json", "invalid JSON"),
        ('{"id": "0", "contents": "\\"T\\"\\nx"}', "duplicate id '0' \\(first on line 1\\)"),
    ],
)
def test_corpus_bad_row(tmp_path, line, msg):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "0", "contents": "\\"T\\"\\nfine"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=rf"c\.jsonl:2: {msg}"):
        load_corpus(p)


# ---------------------------------------------------------------- world: determinism


def test_world_deterministic_per_seed():
    a, b, c = build_world(3, 400), build_world(3, 400), build_world(4, 400)
    assert a.docs == b.docs
    assert a.docs != c.docs
    qa, qb, qc = (make_questions(w, 40, seed=7) for w in (a, b, c))
    assert qa == qb
    assert [q.question for q in qa] != [q.question for q in qc]
    assert make_questions(a, 40, seed=8) != qa


def test_world_files_deterministic(tmp_path):
    sizes = {"train": 30, "dev": 10, "test": 10}
    write_world(tmp_path / "a", seed=1, n_entities=300, sizes=sizes)
    write_world(tmp_path / "b", seed=1, n_entities=300, sizes=sizes)
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_world_splits_disjoint_and_loadable(tmp_path):
    sizes = {"train": 60, "dev": 15, "test": 25}
    paths = write_world(tmp_path, seed=2, n_entities=400, sizes=sizes)
    texts = []
    for split, n in sizes.items():
        ds = load_qa(paths[split])
        assert ds.fmt == "flashrag" and len(ds) == n
        assert all(e.id.startswith(f"{split}-") for e in ds)
        texts += [e.question for e in ds]
    assert len(set(texts)) == len(texts)
    assert len(load_corpus(paths["corpus"])) == 400


def test_world_too_small_or_bad_request():
    w = build_world(0, 60)
    with pytest.raises(ValueError, match="no question kind"):
        make_questions(w, 1, 0, hops=(7,))
    with pytest.raises(ValueError, match="unknown question kinds"):
        make_questions(w, 1, 0, kinds=("riddle",))
    with pytest.raises(ValueError, match="too small"):
        build_world(0, 30)


# ---------------------------------------------------------------- world: answers from the docs
# The checker below reads facts with its own regexes over the written documents; it trusts
# only the question's recorded legs (which fact to read next), never the generator's state.

FACT_RE = {
    "birth_year": r"\(born (\d{4})\)",
    "occupation": r"\) is an? ([^.]+)\.",
    "born_in": r" was born in ([^.]+)\.",
    "father": r"'s father is ([^.]+)\.",
    "mother": r"'s mother is ([^.]+)\.",
    "spouse": r" is married to ([^.]+)\.",
    "member_of": r" is a member of ([^.]+)\.",
    "located_in": r" is a city in ([^.]+)\.",
    "founding_year": r" was founded in (\d{4})",
    "capital": r"The capital of .+? is ([^.]+)\.",
    "industry": r" is an? (.+?) company\.",
    "founded_by": r" was founded in \d{4} by ([^.]+)\.",
    "headquartered_in": r" is headquartered in ([^.]+)\.",
    "formation_year": r" was formed in (\d{4})",
    "formed_in": r" was formed in \d{4} in ([^.]+)\.",
    "genre": r" is an? (\w+) (?:band|film)\.",
    "release_year": r" was released in (\d{4})\.",
    "directed_by": r" was directed by ([^.]+)\.",
}


def read_fact(doc: Doc, fact: str) -> str:
    found = re.findall(FACT_RE[fact], doc.text)
    assert len(found) == 1, (fact, doc)
    return found[0]


def mentions(doc: Doc, answer: str) -> bool:
    return f" {normalize_answer(answer)} " in f" {normalize_answer(doc.title + ' ' + doc.text)} "


def check_question(q: dict, by_title: dict[str, Doc], by_id: dict[str, Doc]) -> None:
    meta = q["metadata"]
    visited: list[str] = []
    results = []  # per leg: (start name, end name, last value)
    for leg in meta["legs"]:
        assert leg["start"] in q["question"]
        name = leg["start"]
        for j, fact in enumerate(leg["path"]):
            doc = by_title[name]  # titles are unique
            visited.append(doc.id)
            value = read_fact(doc, fact)
            if j < len(leg["path"]) - 1:
                name = value  # a relation: its value names the next document
        results.append((leg["start"], name, value))
    assert visited == meta["supporting_docs"]
    assert len(visited) == meta["hops"] == len(set(visited))
    gold = q["golden_answers"][0]
    if meta["answer_from"] == "value":  # a chain question
        assert len(results) == 1 and results[0][2] == gold
        assert f" {normalize_answer(gold)} " not in f" {normalize_answer(q['question'])} "
        # every document but the last is needed only to reach the next one
        for doc_id in visited[:-1]:
            assert not mentions(by_id[doc_id], gold), (q, doc_id)
        # in particular, never in the doc of the entity the question names
        assert not mentions(by_title[meta["legs"][0]["start"]], gold)
    else:
        years = [int(v) for _, _, v in results]
        assert len(set(years)) == len(years)  # unique answer
        pick = min if meta["op"] == "min" else max
        win = years.index(pick(years))
        assert gold == results[win][0 if meta["answer_from"] == "start" else 1]


@pytest.mark.parametrize("seed", [0, 5])
def test_world_answers_reachable_in_stated_hops(tmp_path, seed):
    paths = write_world(tmp_path, seed=seed, n_entities=600,
                        sizes={"train": 150, "dev": 20, "test": 40}, hops=(2, 3, 4))
    corpus = load_corpus(paths["corpus"])
    by_title = {d.title: d for d in corpus}
    assert len(by_title) == len(corpus)
    by_id = {d.id: d for d in corpus}
    kinds_hops = set()
    for split in ("train", "dev", "test"):
        for line in paths[split].read_text().splitlines():
            q = json.loads(line)
            check_question(q, by_title, by_id)
            kinds_hops.add((q["metadata"]["kind"], q["metadata"]["hops"]))
    assert kinds_hops == {("compositional", 2), ("compositional", 3), ("compositional", 4),
                          ("inference", 2), ("inference", 3), ("comparison", 2),
                          ("comparison", 3), ("comparison", 4), ("bridge_comparison", 3),
                          ("bridge_comparison", 4)}


def test_world_default_hops_are_two_and_three():
    qs = make_splits(build_world(9, 300), {"train": 40}, seed=1)["train"]
    assert {q.hops for q in qs} == {2, 3}
    assert {q.kind for q in qs} == {"compositional", "inference", "comparison",
                                    "bridge_comparison"}
    assert [q.id for q in qs[:2]] == ["train-00000", "train-00001"]
