"""Shared fixtures of the rubric-memory tests: synthetic Search-R1 groups, a recording judge,
draft and common-rubric builders."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from judges import (
    Draft,
    RuleJudge,
)
from memory import (
    CommonRubric,
    CorrStats,
    DraftRubric,
    GroupInput,
    HashingEmbedder,
)

HASH = HashingEmbedder()
SLOW = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- synthetic Search-R1 trajectories ---------------------------------------------------------


def traj(searches: list[tuple[str, str, str]], answer: str | None) -> str:
    """``searches``: (query, doc title, doc text); ``answer`` None = unclosed (invalid)."""
    parts = []
    for q, title, text in searches:
        parts.append(f"<think>I should search for {q}.</think>")
        parts.append(f"<search>{q}</search>\n\n<information>Doc 1(Title: {title}) {text}"
                     "</information>\n\n")
    parts.append("<think>I can answer now.</think>")
    parts.append(f"<answer>{answer}</answer>" if answer is not None else "<answer>unsure")
    return "".join(parts)


Q1, GOLD1 = "Who directed the film Inception?", ("Christopher Nolan",)
T1 = (
    traj([("Inception director", "Inception",
           "Inception is a 2010 film directed by Christopher Nolan.")], "Christopher Nolan"),
    traj([], "Steven Spielberg"),
    traj([("who directed the film inception", "Titanic", "Titanic is a film by James Cameron.")],
         "James Cameron"),
    traj([], None),
)
Q2, GOLD2 = "Who wrote the novel Dracula?", ("Bram Stoker",)
T2 = (
    traj([("Dracula author", "Dracula", "Dracula is an 1897 novel by Bram Stoker.")],
         "Bram Stoker"),
    traj([], "Mary Shelley"),
    traj([("who wrote the novel dracula", "Frankenstein",
           "Frankenstein is a novel by Mary Shelley.")], "Mary Shelley"),
    traj([], None),
)
# Outcome-homogeneous: every answer wrong (F1 = 0), every format valid. Members 0 and 2 search
# for "Paris" (an entity named in the question), members 1 and 3 answer without searching.
Q3, GOLD3 = "Which river flows through Paris?", ("Seine",)
T3 = (
    traj([("Paris river", "Paris", "Paris is the capital of France.")], "Loire"),
    traj([], "Rhine"),
    traj([("Paris river", "Paris", "Paris is a city.")], "Danube"),
    traj([], "Thames"),
)
# R_base = F1 if valid else -1: member 0 right, 1 and 2 wrong, 3 unclosed answer (invalid).
R12 = (1.0, 0.0, 0.0, -1.0)
R3 = (0.0, 0.0, 0.0, 0.0)

ENTITY = Draft("Entity-targeted search", "Searches for an entity that is named in the question, "
               "so retrieval targets the question's key subject.", "entity_search")


def g1() -> GroupInput:
    return GroupInput("q1", Q1, GOLD1, T1, R12)


def g2() -> GroupInput:
    return GroupInput("q2", Q2, GOLD2, T2, R12)


def g3() -> GroupInput:
    return GroupInput("q3", Q3, GOLD3, T3, R3)


D = Draft("Some rubric", "a process criterion")


def _common(k: int, corr: CorrStats | None = None, **kw) -> CommonRubric:
    return CommonRubric(id=f"c{k}", draft=Draft(f"rubric {k}", ""), source_ids=(),
                        created_step=0, corr=corr or CorrStats(), **kw)


class Recorder:
    """Wraps a judge, records batched calls, and can override an operation's answer."""

    def __init__(self, inner=None, **overrides):
        self.inner = inner or RuleJudge(seed=0)
        self.calls: list[tuple[str, int]] = []
        self.overrides = overrides

    def __getattr__(self, op):
        fn = getattr(self.inner, op)
        if op not in ("check", "compare", "induce", "consolidate"):
            return fn

        def call(reqs):
            self.calls.append((op, len(reqs)))
            if op in self.overrides:
                return self.overrides[op](reqs)
            return fn(reqs)

        return call


def _drafts(feats: list[str], start: int = 0) -> tuple[DraftRubric, ...]:
    from judges.search_features import FEATURES, parse_feature_id

    out = []
    for k, fid in enumerate(feats):
        feat, p = parse_feature_id(fid)
        out.append(DraftRubric(f"d{start + k}", FEATURES[feat.name].draft(p), "q", 0, 0.2, 0.5))
    return tuple(out)
