"""The shipped benchmark: a deterministic fictional world for multi-hop search QA.

``build_world(seed, n_entities)`` invents people, cities, countries, companies, bands and
films whose names are built from random syllables (so no pretrained model knows them), with
attributes (birth / founding / formation / release year, occupation, industry, genre) and
functional relations (born_in, father, mother, spouse, member_of, located_in, capital,
founded_by, headquartered_in, formed_in, directed_by). Each entity gets one wiki-style document
(title = name) stating its own attributes and outgoing relations in fixed sentence templates;
the documents form a corpus in wiki-18 jsonl form.

``make_questions`` asks 2WikiMultiHopQA-style questions over it:

* compositional - follow relations then read a fact: "Where was the founder of X born?"
* inference     - kinship chains named by one word: "Who is the maternal grandfather of X?"
* comparison    - compare a year across entities: "Who was born first, A or B?"
* bridge_comparison - compare across a bridge: "Who was born first, A or the director of F?"
  (3 docs) or "Which film has the director who was born first, F1 or F2?" (4 docs).

``hops`` is the number of supporting documents a question needs (each leg reads one fact per
document, following the relation it read to the next document). Every question has a unique
answer (functional relations, distinct compared years), records its supporting doc ids and its
legs (start entity + facts read), and for chain questions the answer never appears in a
supporting document other than the last one (so never in the doc of the entity the question
names) nor in the question.

CLI: ``python -m rl.tasks.search.world --out DIR --seed 0`` writes ``corpus.jsonl`` and FlashRAG
``train.jsonl`` / ``dev.jsonl`` / ``test.jsonl`` (readable by ``load_qa``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.files import write_atomic
from core.search_r1 import normalize_answer
from rl.tasks.search.corpus import Doc, write_corpus
from rl.tasks.search.datasets import QAExample, write_flashrag_jsonl

KINDS = ("person", "city", "country", "company", "band", "film")
YEAR_ATTR = {"person": "birth_year", "city": "founding_year", "country": "founding_year",
             "company": "founding_year", "band": "formation_year", "film": "release_year"}
# relation -> (source kind, target kind); every relation is functional (one target).
RELATIONS = {
    "born_in": ("person", "city"), "father": ("person", "person"),
    "mother": ("person", "person"), "spouse": ("person", "person"),
    "member_of": ("person", "band"), "located_in": ("city", "country"),
    "capital": ("country", "city"), "founded_by": ("company", "person"),
    "headquartered_in": ("company", "city"), "formed_in": ("band", "city"),
    "directed_by": ("film", "person"),
}
KINSHIP = ("father", "mother", "spouse")
QUESTION_KINDS = ("compositional", "inference", "comparison", "bridge_comparison")
SUPPORTED_HOPS = {"compositional": (2, 3, 4, 5), "inference": (2, 3),
                  "comparison": (2, 3, 4, 5), "bridge_comparison": (3, 4)}

_FINALS = {
    "person": ("birth_year", "born_in", "occupation", "father", "mother", "spouse", "member_of"),
    "city": ("located_in", "founding_year"),
    "country": ("capital", "founding_year"),
    "company": ("founding_year", "founded_by", "headquartered_in", "industry"),
    "band": ("formation_year", "formed_in", "genre"),
    "film": ("release_year", "directed_by", "genre"),
}
_NP = {  # noun phrase for "relation of x"
    "born_in": "the birthplace of {x}", "father": "the father of {x}",
    "mother": "the mother of {x}", "spouse": "the spouse of {x}",
    "member_of": "the band of {x}", "located_in": "the country of {x}",
    "capital": "the capital of {x}", "founded_by": "the founder of {x}",
    "headquartered_in": "the headquarters city of {x}",
    "formed_in": "the city where {x} was formed",
    "directed_by": "the director of {x}",
}
_FINAL_Q = {
    "birth_year": "In what year was {x} born?", "born_in": "Where was {x} born?",
    "occupation": "What is the occupation of {x}?", "father": "Who is the father of {x}?",
    "mother": "Who is the mother of {x}?", "spouse": "Who is the spouse of {x}?",
    "member_of": "Which band is {x} a member of?", "located_in": "In which country is {x}?",
    "founding_year": "In what year was {x} founded?", "capital": "What is the capital of {x}?",
    "founded_by": "Who founded {x}?", "headquartered_in": "Where is {x} headquartered?",
    "industry": "What industry is {x} in?", "formation_year": "In what year was {x} formed?",
    "formed_in": "Where was {x} formed?", "genre": "What genre is {x}?",
    "release_year": "In what year was {x} released?", "directed_by": "Who directed {x}?",
}
_KIN2 = {("father", "father"): "paternal grandfather", ("father", "mother"): "paternal grandmother",
         ("mother", "father"): "maternal grandfather", ("mother", "mother"): "maternal grandmother",
         ("spouse", "father"): "father-in-law", ("spouse", "mother"): "mother-in-law"}
_CMP_Q = {"person": "Who was born {w}, {opts}?", "city": "Which city was founded {w}, {opts}?",
          "country": "Which country was founded {w}, {opts}?",
          "company": "Which company was founded {w}, {opts}?",
          "band": "Which band was formed {w}, {opts}?",
          "film": "Which film was released {w}, {opts}?"}
_BRIDGE4_Q = {
    ("film", "directed_by"): "Which film has the director who was born {w}, {opts}?",
    ("company", "founded_by"): "Which company has the founder who was born {w}, {opts}?",
    ("person", "father"): "Whose father was born {w}, {opts}?",
    ("person", "mother"): "Whose mother was born {w}, {opts}?",
    ("person", "spouse"): "Whose spouse was born {w}, {opts}?",
    ("person", "member_of"): "Whose band was formed {w}, {opts}?",
    ("person", "born_in"): "Who was born in the city that was founded {w}, {opts}?",
    ("company", "headquartered_in"):
        "Which company is headquartered in the city that was founded {w}, {opts}?",
    ("band", "formed_in"): "Which band was formed in the city that was founded {w}, {opts}?",
    ("city", "located_in"): "Which city is in the country that was founded {w}, {opts}?",
}

_OCCUPATIONS = ("chemist", "architect", "painter", "poet", "historian", "physician", "engineer",
                "sculptor", "botanist", "lawyer", "astronomer", "novelist", "film director",
                "musician", "entrepreneur", "cartographer", "composer", "diplomat")
_INDUSTRIES = ("shipping", "mining", "textile", "railway", "publishing", "brewing", "insurance",
               "software", "aviation", "chemical", "banking", "glassmaking")
_BAND_GENRES = ("folk", "jazz", "rock", "punk", "blues", "metal", "soul", "ambient")
_FILM_GENRES = ("drama", "comedy", "western", "thriller", "musical", "documentary", "horror",
                "romance")
_COMPANY_SUFFIX = ("Industries", "Holdings", "Works", "Systems", "Trading", "Labs", "Group")
_BAND_NOUNS = ("Lanterns", "Owls", "Ravens", "Echoes", "Engines", "Foxes", "Comets", "Tides")
_FILM_PATTERNS = ("The {w} Affair", "{w} Rising", "Return to {w}", "The Last {w}",
                  "Nights in {w}", "The {w} Letters")
_COUNTRY_SUFFIX = ("ia", "land", "ora", "stan", "mark", "enia")
_CITY_SUFFIX = ("", "", "", "port", "holm", "mere", "ford", "wick")
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr", "r",
           "s", "st", "t", "tr", "v", "z", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou", "y")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "x", "nd", "rt")


@dataclass(frozen=True)
class Entity:
    idx: int
    kind: str
    name: str
    attrs: Mapping[str, Any]
    rels: Mapping[str, int]  # relation -> target entity idx


@dataclass(frozen=True)
class World:
    """Entities and their documents; ``docs[i]`` is entity ``i``'s document (id ``str(i)``)."""

    seed: int
    entities: tuple[Entity, ...]
    docs: tuple[Doc, ...]
    _by_kind: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        for e in self.entities:
            by_kind[e.kind].append(e.idx)
        object.__setattr__(self, "_by_kind", {k: tuple(v) for k, v in by_kind.items()})

    def of_kind(self, kind: str) -> tuple[int, ...]:
        return self._by_kind[kind]


@dataclass(frozen=True)
class WorldQuestion:
    """A generated question. ``legs``: (start entity name, facts read one per document);
    comparisons pick the leg whose final year is smallest (op "min") or largest ("max") and
    answer with its start or end entity (``answer_from``)."""

    id: str
    question: str
    answer: str
    kind: str
    hops: int
    supporting_docs: tuple[str, ...]
    legs: tuple[tuple[str, tuple[str, ...]], ...]
    op: str | None = None
    answer_from: str = "value"  # "value" (chain questions) | "start" | "end"

    def to_example(self, source: str = "world") -> QAExample:
        meta = {"kind": self.kind, "hops": self.hops,
                "supporting_docs": list(self.supporting_docs),
                "legs": [{"start": s, "path": list(p)} for s, p in self.legs],
                "op": self.op, "answer_from": self.answer_from}
        return QAExample(self.id, self.question, (self.answer,), source, meta)


# ---------------------------------------------------------------- names


class _Names:
    """Syllable words, each used at most once in the world (so names never collide)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set()

    def _pick(self, options: Sequence[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def word(self, min_syl: int = 2, max_syl: int = 3, suffix: str = "") -> str:
        while True:
            n = int(self.rng.integers(min_syl, max_syl + 1))
            w = "".join(self._pick(_ONSETS) + self._pick(_VOWELS) + self._pick(_CODAS)
                        for _ in range(n))
            w = (w + suffix).capitalize()
            if w not in self.used:
                self.used.add(w)
                return w


# ---------------------------------------------------------------- world building


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _document(e: dict[str, Any], ents: list[dict[str, Any]]) -> str:
    """The entity's paragraph: its own attributes and outgoing relations, fixed templates."""
    n, a, r = e["name"], e["attrs"], e["rels"]
    name = lambda rel: ents[r[rel]]["name"]
    s: list[str] = []
    if e["kind"] == "person":
        occ = a["occupation"]
        s.append(f"{n} (born {a['birth_year']}) is {_article(occ)} {occ}.")
        s.append(f"{n} was born in {name('born_in')}.")
        if "father" in r:
            s.append(f"{n}'s father is {name('father')}.")
        if "mother" in r:
            s.append(f"{n}'s mother is {name('mother')}.")
        if "spouse" in r:
            s.append(f"{n} is married to {name('spouse')}.")
        if "member_of" in r:
            s.append(f"{n} is a member of {name('member_of')}.")
    elif e["kind"] == "city":
        s.append(f"{n} is a city in {name('located_in')}.")
        s.append(f"{n} was founded in {a['founding_year']}.")
    elif e["kind"] == "country":
        s.append(f"{n} is a country.")
        s.append(f"{n} was founded in {a['founding_year']}.")
        s.append(f"The capital of {n} is {name('capital')}.")
    elif e["kind"] == "company":
        ind = a["industry"]
        s.append(f"{n} is {_article(ind)} {ind} company.")
        s.append(f"{n} was founded in {a['founding_year']} by {name('founded_by')}.")
        s.append(f"{n} is headquartered in {name('headquartered_in')}.")
    elif e["kind"] == "band":
        g = a["genre"]
        s.append(f"{n} is {_article(g)} {g} band.")
        s.append(f"{n} was formed in {a['formation_year']} in {name('formed_in')}.")
    elif e["kind"] == "film":
        g = a["genre"]
        s.append(f"{n} is {_article(g)} {g} film.")
        s.append(f"{n} was released in {a['release_year']}.")
        s.append(f"{n} was directed by {name('directed_by')}.")
    return " ".join(s)


def _counts(n: int) -> dict[str, int]:
    c = {"country": max(2, n // 60), "city": max(4, n // 8), "company": max(2, n // 10),
         "band": max(2, n // 14), "film": max(2, n // 10)}
    c["person"] = n - sum(c.values())
    if c["person"] < 20:
        raise ValueError(f"n_entities={n} is too small for a world (need >= 60)")
    return c


def build_world(seed: int, n_entities: int = 2000, generations: int = 4,
                marriage_rate: float = 0.8) -> World:
    """Generate a world of ``n_entities`` entities, deterministic for ``seed``."""
    counts = _counts(n_entities)
    builder = _WorldBuilder(np.random.default_rng(seed))
    cities = builder.places(counts["country"], counts["city"])
    people = builder.people(counts["person"], cities, generations, marriage_rate)
    builder.companies(counts["company"], people, cities)
    builder.bands(counts["band"], people, cities)
    builder.films(counts["film"], people)
    return builder.world(seed)


class _WorldBuilder:
    """The entities of a world being built, drawn from one random stream. The order of the
    draws defines the world, so each step keeps it: the same seed, the same world."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.names = _Names(rng)
        self.ents: list[dict[str, Any]] = []

    def add(self, kind: str, name: str, **attrs: Any) -> int:
        self.ents.append({"idx": len(self.ents), "kind": kind, "name": name, "attrs": attrs,
                          "rels": {}})
        return len(self.ents) - 1

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def years(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def places(self, n_countries: int, n_cities: int) -> list[int]:
        """Countries and their cities; returns the cities."""
        pick, years, ents = self.pick, self.years, self.ents
        countries = [self.add("country", self.names.word(2, 2, pick(_COUNTRY_SUFFIX)),
                              founding_year=years(1400, 1900)) for _ in range(n_countries)]
        cities = [self.add("city", self.names.word(2, 3, pick(_CITY_SUFFIX)),
                           founding_year=years(1000, 1750)) for _ in range(n_cities)]
        for i, c in enumerate(cities):  # every country gets a capital among its own cities
            country = countries[i] if i < len(countries) else pick(countries)
            ents[c]["rels"]["located_in"] = country
            if i < len(countries):
                ents[country]["rels"]["capital"] = c
        return cities

    def people(self, n_people: int, cities: Sequence[int], generations: int,
               marriage_rate: float) -> list[int]:
        """People in generations: children of the previous generation's couples take the
        father's surname and are born 20-40 years after their younger parent."""
        names = self.names
        given_pool = [names.word(2, 2) for _ in range(max(20, n_people // 6))]
        surname_pool = [names.word(2, 3) for _ in range(max(20, n_people // 8))]
        full_names: set[str] = set()
        people: list[int] = []
        couples: list[tuple[int, int]] = []
        per_gen = [n_people // generations + (g < n_people % generations)
                   for g in range(generations)]
        for g, size in enumerate(per_gen):
            members = [self._person(g, couples, cities, given_pool, surname_pool, full_names)
                       for _ in range(size)]
            people += members
            couples = self._marry(members, marriage_rate)
        return people

    def _person(self, generation: int, couples: Sequence[tuple[int, int]],
                cities: Sequence[int], given_pool: list[str], surname_pool: Sequence[str],
                full_names: set[str]) -> int:
        """One person of ``generation``: most are a child of one of ``couples`` (the previous
        generation's), the others found a new family; the full name is unique."""
        pick, years, ents = self.pick, self.years, self.ents
        father = mother = None
        if couples and self.rng.random() < 0.9:
            father, mother = pick(couples)
            surname = ents[father]["name"].split()[-1]
            born = max(ents[father]["attrs"]["birth_year"],
                       ents[mother]["attrs"]["birth_year"]) + years(20, 40)
        else:
            surname = pick(surname_pool)
            born = 1780 + 30 * generation + years(-10, 10)
        for _ in range(50):
            full = f"{pick(given_pool)} {surname}"
            if full not in full_names:
                break
        else:  # crowded surname: a fresh given name always makes it unique
            given_pool.append(self.names.word(2, 2))
            full = f"{given_pool[-1]} {surname}"
        full_names.add(full)
        p = self.add("person", full, birth_year=born, occupation=pick(_OCCUPATIONS),
                     gender=pick(("male", "female")))
        ents[p]["rels"]["born_in"] = pick(cities)
        if father is not None:
            ents[p]["rels"]["father"], ents[p]["rels"]["mother"] = father, mother
        return p

    def _marry(self, members: Sequence[int], marriage_rate: float) -> list[tuple[int, int]]:
        """Pair a generation's men and women in random order (never siblings); the couples."""
        ents, rng = self.ents, self.rng
        males = [members[i] for i in rng.permutation(len(members))
                 if ents[members[i]]["attrs"]["gender"] == "male"]
        females = [members[i] for i in rng.permutation(len(members))
                   if ents[members[i]]["attrs"]["gender"] == "female"]
        couples = []
        for m, f in zip(males, females):
            father_m = ents[m]["rels"].get("father")
            siblings = father_m is not None and father_m == ents[f]["rels"].get("father")
            if rng.random() < marriage_rate and not siblings:
                ents[m]["rels"]["spouse"], ents[f]["rels"]["spouse"] = f, m
                couples.append((m, f))
        return couples

    def companies(self, n: int, people: Sequence[int], cities: Sequence[int]) -> None:
        pick, years, ents = self.pick, self.years, self.ents
        for _ in range(n):
            founder = pick(people)
            c = self.add("company", f"{self.names.word()} {pick(_COMPANY_SUFFIX)}",
                         industry=pick(_INDUSTRIES),
                         founding_year=ents[founder]["attrs"]["birth_year"] + years(22, 50))
            ents[c]["rels"].update(founded_by=founder, headquartered_in=pick(cities))

    def bands(self, n: int, people: Sequence[int], cities: Sequence[int]) -> None:
        pick, years, ents = self.pick, self.years, self.ents
        free = [people[i] for i in self.rng.permutation(len(people))]  # one band each
        for _ in range(n):
            k = years(1, 4)
            members, free = free[:k], free[k:]
            first = min((ents[m]["attrs"]["birth_year"] for m in members), default=None)
            formed = first + years(16, 30) if first is not None else years(1850, 1990)
            b = self.add("band", f"The {self.names.word()} {pick(_BAND_NOUNS)}",
                         genre=pick(_BAND_GENRES), formation_year=formed)
            ents[b]["rels"]["formed_in"] = pick(cities)
            for m in members:
                ents[m]["rels"]["member_of"] = b

    def films(self, n: int, people: Sequence[int]) -> None:
        pick, years, ents = self.pick, self.years, self.ents
        for _ in range(n):
            director = pick(people)
            f = self.add("film", pick(_FILM_PATTERNS).format(w=self.names.word()),
                         genre=pick(_FILM_GENRES),
                         release_year=ents[director]["attrs"]["birth_year"] + years(25, 60))
            ents[f]["rels"]["directed_by"] = director

    def world(self, seed: int) -> World:
        ents = self.ents
        entities = tuple(Entity(e["idx"], e["kind"], e["name"], dict(e["attrs"]),
                                dict(e["rels"])) for e in ents)
        docs = tuple(Doc(id=str(e["idx"]), title=e["name"], text=_document(e, ents))
                     for e in ents)
        return World(seed, entities, docs)


# ---------------------------------------------------------------- questions


def _fact(w: World, e: Entity, fact: str) -> tuple[str, int | None] | None:
    """(value text, target idx for relations) of a fact of ``e``, or None if e lacks it."""
    if fact in e.rels:
        t = e.rels[fact]
        return w.entities[t].name, t
    if fact in e.attrs:
        return str(e.attrs[fact]), None
    return None


def _opts(names: Sequence[str]) -> str:
    if len(names) == 2:
        return f"{names[0]} or {names[1]}"
    return ", ".join(names[:-1]) + f", or {names[-1]}"


def _contains(text: str, answer: str) -> bool:
    return f" {normalize_answer(answer)} " in f" {normalize_answer(text)} "


class _Gen:
    def __init__(self, w: World, rng: np.random.Generator):
        self.w, self.rng = w, rng
        self.with_rel = {r: tuple(e.idx for e in w.entities if r in e.rels) for r in RELATIONS}

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[int(self.rng.integers(len(seq)))] if len(seq) else None

    def ent(self, i: int) -> Entity:
        return self.w.entities[i]

    def walk(self, start: int, rels: Sequence[str]) -> list[int] | None:
        """Entities visited following ``rels`` from start; None on a missing relation or a
        revisit (which would make a document repeat)."""
        path = [start]
        for r in rels:
            t = self.ent(path[-1]).rels.get(r)
            if t is None or t in path:
                return None
            path.append(t)
        return path

    def chain(self, kind: str, start: int, rels: list[str], final: str,
              question: str) -> WorldQuestion | None:
        path = self.walk(start, rels)
        if path is None:
            return None
        fv = _fact(self.w, self.ent(path[-1]), final)
        if fv is None or (fv[1] is not None and fv[1] in path):
            return None
        answer = fv[0]
        # the answer must need the last document: not in the question, not in any earlier doc
        if _contains(question, answer) or any(
                _contains(self.w.docs[i].contents, answer) for i in path[:-1]):
            return None
        return WorldQuestion("", question, answer, kind, len(path),
                             tuple(str(i) for i in path), ((self.ent(start).name,
                                                            (*rels, final)),))

    def compositional(self, hops: int) -> WorldQuestion | None:
        start = int(self.rng.integers(len(self.w.entities)))
        rels: list[str] = []
        cur = start
        for _ in range(hops - 1):
            e = self.ent(cur)
            options = [r for r in RELATIONS if RELATIONS[r][0] == e.kind and r in e.rels]
            r = self.pick(options)
            if r is None:
                return None
            rels.append(r)
            cur = e.rels[r]
        final = self.pick(_FINALS[self.ent(cur).kind])
        if all(r in KINSHIP for r in [*rels, final]):
            return None  # pure kinship chains are "inference" questions
        x = self.ent(start).name
        for r in rels:
            x = _NP[r].format(x=x)
        return self.chain("compositional", start, rels, final, _FINAL_Q[final].format(x=x))

    def inference(self, hops: int) -> WorldQuestion | None:
        (r1, r2), term = self.pick(list(_KIN2.items()))
        if hops == 2:
            start, prefix = self.pick(self.w.of_kind("person")), []
            x = self.ent(start).name
        else:
            p = self.pick(("founded_by", "directed_by", "father", "mother", "spouse"))
            start, prefix = self.pick(self.with_rel[p]), [p]
            x = _NP[p].format(x=self.ent(start).name)
        if start is None:
            return None
        return self.chain("inference", start, [*prefix, r1], r2, f"Who is the {term} of {x}?")

    def _compare(self, kind: str, legs: list[tuple[int, list[str]]], ends: list[int],
                 template: str, opt_names: list[str], answer_from: str) -> WorldQuestion | None:
        walked = [self.walk(s, rels) for s, rels in legs]
        ents = [e for w in walked for e in (w or [])]
        if any(not w for w in walked) or len(set(ents)) != len(ents):
            return None  # a missing relation, or a document needed twice
        attr = YEAR_ATTR[self.ent(ends[0]).kind]
        vals = [self.ent(e).attrs[attr] for e in ends]
        if len(set(vals)) != len(vals):
            return None  # a tie would not have a unique answer
        op = self.pick(("min", "max"))
        win = int(np.argmin(vals) if op == "min" else np.argmax(vals))
        answer = self.ent(legs[win][0] if answer_from == "start" else ends[win]).name
        question = template.format(w="first" if op == "min" else "last", opts=_opts(opt_names))
        return WorldQuestion("", question, answer, kind, len(ents), tuple(str(e) for e in ents),
                             tuple((self.ent(s).name, (*rels, attr)) for s, rels in legs),
                             op, answer_from)

    def comparison(self, hops: int) -> WorldQuestion | None:
        kind = self.pick(KINDS)
        pool = self.w.of_kind(kind)
        if len(pool) < hops:
            return None
        chosen = [pool[int(i)] for i in self.rng.choice(len(pool), size=hops, replace=False)]
        return self._compare("comparison", [(c, []) for c in chosen], chosen, _CMP_Q[kind],
                             [self.ent(c).name for c in chosen], "end")

    def bridge_comparison(self, hops: int) -> WorldQuestion | None:
        if hops == 3:  # "A or <relation> of B", answered by the entity the year belongs to
            r = self.pick(list(RELATIONS))
            b = self.pick(self.with_rel[r])
            a = self.pick(self.w.of_kind(RELATIONS[r][1]))
            if b is None or a is None:
                return None
            e = self.ent(b).rels[r]
            legs: list[tuple[int, list[str]]] = [(a, []), (b, [r])]
            opts = [self.ent(a).name, _NP[r].format(x=self.ent(b).name)]
            ends = [a, e]
            if self.rng.random() < 0.5:  # the named entity is not always the first option
                legs, opts, ends = legs[::-1], opts[::-1], ends[::-1]
            return self._compare("bridge_comparison", legs, ends, _CMP_Q[RELATIONS[r][1]], opts,
                                 "end")
        (kind, r), template = self.pick(list(_BRIDGE4_Q.items()))
        pool = self.with_rel[r]
        if len(pool) < 2:
            return None
        b1, b2 = (pool[int(i)] for i in self.rng.choice(len(pool), size=2, replace=False))
        ends = [self.ent(b1).rels[r], self.ent(b2).rels[r]]
        return self._compare("bridge_comparison", [(b1, [r]), (b2, [r])], ends, template,
                             [self.ent(b1).name, self.ent(b2).name], "start")


def make_questions(world: World, n: int, seed: int, hops: Sequence[int] = (2, 3),
                   kinds: Sequence[str] = QUESTION_KINDS,
                   max_attempts: int = 500) -> tuple[WorldQuestion, ...]:
    """``n`` distinct questions, cycling over every supported (kind, hops) pair so the mix is
    balanced, in a seeded random order; ids are ``q00000``... ."""
    unknown = [k for k in kinds if k not in QUESTION_KINDS]
    if unknown:
        raise ValueError(f"unknown question kinds {unknown}; known: {QUESTION_KINDS}")
    combos = [(k, h) for k in kinds for h in hops if h in SUPPORTED_HOPS[k]]
    if not combos:
        raise ValueError(f"no question kind in {list(kinds)} supports hops {list(hops)}: "
                         f"{SUPPORTED_HOPS}")
    gen = _Gen(world, np.random.default_rng(seed))
    out: list[WorldQuestion] = []
    seen: set[str] = set()
    for i in range(n):
        kind, h = combos[i % len(combos)]
        for _ in range(max_attempts):
            q = getattr(gen, kind)(h)
            if q is not None and q.question not in seen:
                break
        else:
            raise ValueError(f"could not make a new {h}-hop {kind} question after "
                             f"{max_attempts} attempts; use a larger world")
        seen.add(q.question)
        out.append(q)
    order = gen.rng.permutation(len(out))
    return tuple(replace(out[int(j)], id=f"q{i:05d}") for i, j in enumerate(order))


def make_splits(world: World, sizes: Mapping[str, int], seed: int,
                hops: Sequence[int] = (2, 3),
                kinds: Sequence[str] = QUESTION_KINDS) -> dict[str, tuple[WorldQuestion, ...]]:
    """Disjoint splits (no question text in two splits): one seeded pool cut in the order of
    ``sizes``; ids are ``{split}-{i}``. Entities may appear in several splits."""
    pool = make_questions(world, sum(sizes.values()), seed, hops, kinds)
    out, at = {}, 0
    for name, size in sizes.items():
        out[name] = tuple(replace(q, id=f"{name}-{i:05d}")
                          for i, q in enumerate(pool[at:at + size]))
        at += size
    return out


WORLD_FORMAT = 2  # manifest layout; 2: per-file sha256 and row counts (1 had none)
WORLD_FILES = ("corpus", "train", "dev", "test")


def write_world(out_dir: str | Path, seed: int = 0, n_entities: int = 2000,
                sizes: Mapping[str, int] | None = None, hops: Sequence[int] = (2, 3),
                kinds: Sequence[str] = QUESTION_KINDS) -> dict[str, Path]:
    """Build a world and write ``corpus.jsonl`` plus one FlashRAG jsonl per split.

    Every file is written atomically, and ``manifest.json`` last: it records the settings and
    each file's row count and SHA-256, so a reader (:func:`world_problem`) can tell a complete
    world from one a kill interrupted (or an older cache without checksums)."""
    sizes = dict(sizes or {"train": 1000, "dev": 100, "test": 200})
    world = build_world(seed, n_entities)
    # the question seed is derived from, but distinct from, the world seed
    qseed = int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])
    splits = make_splits(world, sizes, qseed, hops, kinds)
    out_dir = Path(out_dir)
    paths = {"corpus": write_corpus(world.docs, out_dir / "corpus.jsonl")}
    for name, qs in splits.items():
        paths[name] = write_flashrag_jsonl([q.to_example(f"world{seed}") for q in qs],
                                           out_dir / f"{name}.jsonl")
    manifest = {"format": WORLD_FORMAT, **world_settings(seed, n_entities, sizes),
                "hops": list(hops), "kinds": list(kinds), "question_seed": qseed,
                "files": {name: _file_record(path) for name, path in paths.items()}}
    write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1))
    return paths


def world_settings(seed: int, n_entities: int, sizes: Mapping[str, int]) -> dict[str, Any]:
    """The settings a cached world must have been written with."""
    return {"seed": seed, "n_entities": n_entities, "sizes": dict(sizes)}


def _file_record(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"rows": data.count(b"\n"), "sha256": hashlib.sha256(data).hexdigest()}


def world_problem(out_dir: str | Path, settings: Mapping[str, Any]) -> str | None:
    """Why the world cached in ``out_dir`` cannot be used (None: it is complete and was
    written with ``settings``): no manifest (never finished, or killed before its last
    write), an older format, other settings, or a file whose row count or SHA-256 differs
    from the manifest's (truncated or changed)."""
    out_dir = Path(out_dir)
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"no readable manifest.json ({type(e).__name__})"
    if not isinstance(manifest, dict) or manifest.get("format") != WORLD_FORMAT:
        return f"manifest format is not {WORLD_FORMAT} (written by an older version)"
    for key, value in settings.items():
        if manifest.get(key) != value:
            return f"manifest {key} is {manifest.get(key)!r}, expected {value!r}"
    for name, want in dict(manifest.get("files") or {}).items():
        path = out_dir / f"{name}.jsonl"
        have = _file_record(path) if path.is_file() else None
        if have != want:
            return (f"{path.name} does not match the manifest (rows "
                    f"{None if have is None else have['rows']}, expected {want.get('rows')})")
    missing = [n for n in WORLD_FILES if n not in dict(manifest.get("files") or {})]
    return f"manifest lists no {missing[0]}.jsonl" if missing else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the fictional multi-hop QA world.")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-entities", type=int, default=2000)
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--n-dev", type=int, default=100)
    p.add_argument("--n-test", type=int, default=200)
    p.add_argument("--hops", type=int, nargs="+", default=[2, 3])
    p.add_argument("--kinds", nargs="+", default=list(QUESTION_KINDS), choices=QUESTION_KINDS)
    a = p.parse_args(argv)
    paths = write_world(a.out, a.seed, a.n_entities,
                        {"train": a.n_train, "dev": a.n_dev, "test": a.n_test}, a.hops, a.kinds)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
