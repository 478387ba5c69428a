"""All judge prompts, in one place, each with the JSON shape it expects and a version string.

Bump a template's ``version`` whenever its wording or shape changes: the run folder records
``PROMPT_VERSIONS`` so judgments from different prompt versions are never silently mixed (and
the on-disk HTTP cache is keyed by the rendered messages, so a wording change is a cache miss).

Templates are rendered with ``str.format``; the expected shape is substituted as ``{shape}`` so
template texts need no brace escaping, and substituted values (trajectories full of braces) are
never re-parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

from judges.types import Draft, Messages


@dataclass(frozen=True)
class PromptTemplate:
    """A system + user chat prompt with the JSON ``shape`` its answer must have."""

    name: str
    version: str
    system: str
    user: str
    shape: str

    def render(self, **values: str) -> Messages:
        """Chat messages for this template; ``values`` fill the texts' fields."""
        return [
            {"role": "system", "content": self.system.format(shape=self.shape, **values)},
            {"role": "user", "content": self.user.format(shape=self.shape, **values)},
        ]


CHECK = PromptTemplate(
    name="check",
    version="check-v1",
    system=(
        "You are a strict grader. You decide whether a response meets one rubric criterion. "
        "Some criteria describe undesirable behaviour; for those, the criterion is met when the "
        "behaviour IS present in the response. Judge only the criterion given, nothing else. "
        "Reply with only a JSON object of this shape: {shape}"
    ),
    user=(
        "# Conversation\n{context}\n\n"
        "# Response to grade\n{response}\n\n"
        "# Criterion\n{criterion}\n\n"
        "Is the criterion met by the response? Reply with only the JSON object: {shape}"
    ),
    shape='{"explanation": "<one or two sentences>", "criteria_met": true or false}',
)

# RaR's implicit aggregation: the judge sees the whole checklist and the response and gives one
# 1-10 rating (our wording; the reward is (rating - 1) / 9).
RATE = PromptTemplate(
    name="rate",
    version="rate-v1",
    system=(
        "You are a strict grader. You rate a response as a whole against a checklist of "
        "criteria. Criteria with a positive weight describe what a good response does; a "
        "larger weight matters more. Criteria with a negative weight are pitfalls: behaviour a "
        "good response avoids. Weigh all criteria together and give one integer rating from 1 "
        "(meets none of what matters, or falls into the pitfalls) to 10 (meets every important "
        "criterion and avoids every pitfall). Reply with only a JSON object of this shape: "
        "{shape}"
    ),
    user=(
        "# Conversation\n{context}\n\n"
        "# Response to grade\n{response}\n\n"
        "# Checklist (weight; negative weight = pitfall to avoid)\n{checklist}\n\n"
        "Rate the response against the whole checklist. Reply with only the JSON object: "
        "{shape}"
    ),
    shape='{"explanation": "<one or two sentences>", "rating": <integer from 1 to 10>}',
)

# Used with backends that expose next-token probabilities: the answer is one word.
CHECK_YESNO = PromptTemplate(
    name="check_yesno",
    version="check_yesno-v1",
    system=(
        "You are a strict grader. You decide whether a response meets one rubric criterion. "
        "Some criteria describe undesirable behaviour; for those, the criterion is met when the "
        "behaviour IS present in the response. Answer with a single word: {shape}"
    ),
    user=(
        "# Conversation\n{context}\n\n"
        "# Response to grade\n{response}\n\n"
        "# Criterion\n{criterion}\n\n"
        "Is the criterion met by the response? Answer {shape}"
    ),
    shape="Yes or No",
)

COMPARE = PromptTemplate(
    name="compare",
    version="compare-v1",
    system=(
        "You compare two responses to the same task under one rubric. Judge only how well each "
        "response satisfies the rubric, not its length or its position. If neither is better "
        'under the rubric, answer "tie". Reply with only a JSON object of this shape: {shape}'
    ),
    user=(
        "# Task\n{context}\n\n"
        "# Rubric\n{rubric}\n\n"
        "# Response 1\n{first}\n\n"
        "# Response 2\n{second}\n\n"
        "Which response better satisfies the rubric? Reply with only the JSON object: {shape}"
    ),
    shape='{"explanation": "<one or two sentences>", "winner": "1" or "2" or "tie"}',
)

COMPARE_12 = PromptTemplate(
    name="compare_12",
    version="compare_12-v1",
    system=(
        "You compare two responses to the same task under one rubric. Judge only how well each "
        "response satisfies the rubric, not its length or its position. Answer with a single "
        "character: {shape}"
    ),
    user=(
        "# Task\n{context}\n\n"
        "# Rubric\n{rubric}\n\n"
        "# Response 1\n{first}\n\n"
        "# Response 2\n{second}\n\n"
        "Which response better satisfies the rubric? Answer {shape}"
    ),
    shape="1 or 2",
)

INDUCE = PromptTemplate(
    name="induce",
    version="induce-v1",
    system=(
        "You write evaluation rubrics for a search agent that reasons in <think>, searches with "
        "<search>, reads retrieved <information>, and answers in <answer>. You are shown three "
        "trajectories for one question, ranked by outcome. Write rubrics that capture what the "
        "BEST trajectory does well in its PROCESS and the others do not: how it plans, "
        "formulates queries, uses evidence and decides to stop. A rubric must be a reusable "
        "process criterion that applies to other questions; never state facts, entities or the "
        "answer of this question. Reply with only a JSON object of this shape: {shape}"
    ),
    user=(
        "# Question\n{question}\n\n"
        "# Gold answer(s)\n{golds}\n\n"
        "# Best trajectory (highest outcome score)\n{best}\n\n"
        "# Hard negative (next best outcome)\n{hard_negative}\n\n"
        "# Worst trajectory (lowest outcome score)\n{worst}\n\n"
        "Write at most {max_drafts} process rubrics. Reply with only the JSON object: {shape}"
    ),
    shape=(
        '{"rubrics": [{"title": "<short name>", '
        '"description": "<one sentence: the process behaviour to reward>"}]}'
    ),
)

# INDUCE with the rubrics the policy has recently mastered (algo.lineage_in_induction; our
# wording): the judge is asked to look past them, toward what the best trajectory still does
# better. The caveat (README): the judge now steers the curriculum, a target the policy can
# learn to please as well.
INDUCE_LINEAGE = PromptTemplate(
    name="induce_lineage",
    version="induce_lineage-v1",
    system=INDUCE.system,
    user=INDUCE.user.replace(
        "Write at most",
        "# Rubrics the agent has already mastered (it now meets them reliably)\n{mastered}\n\n"
        "Do not restate the mastered rubrics. Write rubrics for what the best trajectory still "
        "does better than the others beyond them. Write at most"),
    shape=INDUCE.shape,
)

CONSOLIDATE = PromptTemplate(
    name="consolidate",
    version="consolidate-v1",
    system=(
        "You maintain a library of evaluation rubrics for a search agent. You are given draft "
        "rubrics written for different questions. Abstract the patterns that recur across "
        "drafts into general, question-independent process rubrics; merge near-duplicates; drop "
        "drafts that are specific to one question. Reply with only a JSON object of this "
        "shape: {shape}"
    ),
    user=(
        "# Draft rubrics\n{drafts}\n\n"
        "Write at most {max_common} common rubrics. Reply with only the JSON object: {shape}"
    ),
    shape=(
        '{"rubrics": [{"title": "<short name>", '
        '"description": "<one sentence: the process behaviour to reward>"}]}'
    ),
)

# ProRubric bundling (our wording): the checklist becomes a few dimensions, each one criterion
# written as a paragraph, which is all the training judge will read.
BUNDLE = PromptTemplate(
    name="bundle",
    version="bundle-v2",
    system=(
        "You turn the grading checklist of one prompt into a few protocol dimensions. Each "
        "dimension is a single criterion written as a short paragraph: it says what a good "
        "response to this particular prompt achieves on that dimension and, in its last "
        "sentence, what makes a response fail it. A grader will later read only your "
        "paragraphs, never the checklist, and will count a dimension as satisfied only when a "
        "response meets every requirement in it; so a paragraph must carry the requirements of "
        "all the items assigned to it, in plain prose that is judged by reading the whole "
        "response, not as a list of phrases to look for. An item with a negative weight is a "
        "pitfall, something a good response avoids: write it into the failure part, never into "
        "what is rewarded. Assign every item, by its number, to exactly one dimension (the "
        "closest in topic). When a reference answer is given, use it to settle items that "
        "contradict each other or are wrong, and state the correct position. The weight of a "
        "dimension is the sum of the absolute weights of its items. Reply with only a JSON "
        "object of this shape: {shape}"
    ),
    user=(
        "# Prompt\n{prompt}\n\n"
        "# Reference answer (anchor)\n{reference}\n\n"
        "# Criteria (number, weight; negative weight = pitfall to avoid)\n{criteria}\n\n"
        "{count_rule} Each description is {sentences} sentences. Use the item numbers 1 to {n}; "
        "each appears in the atomic_indices of exactly one dimension.{previous}"
        " Reply with only the JSON object: {shape}"
    ),
    shape=(
        '{"criteria": [{"name": "<at most six words>", "description": "<the paragraph>", '
        '"weight": <number>, "atomic_indices": [<item numbers>], '
        '"failure_clause": "<what fails the dimension, in a few words>" or null}]}'
    ),
)

# The ProRubric authors' judging mechanism in our own words: every criterion of a response in one
# call, one verdict per criterion, the conjunction inside a criterion left to the judge.
DIMENSIONS = PromptTemplate(
    name="dimensions",
    version="dimensions-v1",
    system=(
        "You are a strict grader. You are given a response and a numbered list of criteria; "
        "judge each criterion on its own. A criterion may state several requirements: it is "
        "satisfied only if the response fulfils every one of them, and a single unmet "
        "requirement, or any behaviour the criterion says makes it fail, means it is not "
        "satisfied. A criterion marked PITFALL describes behaviour a good response avoids: "
        "answer true when that behaviour IS present. Give a verdict for every number, exactly "
        "once. Reply with only a JSON object of this shape: {shape}"
    ),
    user=(
        "# Conversation\n{context}\n\n"
        "# Response to grade\n{response}\n\n"
        "# Criteria\n{criteria}\n\n"
        "Judge every criterion. Reply with only the JSON object: {shape}"
    ),
    shape='{"satisfied": {"1": true or false, "2": true or false, ...}}',
)

DIMENSIONS_GRADED = PromptTemplate(
    name="dimensions_graded",
    version="dimensions_graded-v1",
    system=(
        "You are a strict grader. You are given a response and a numbered list of criteria; "
        "grade each criterion on its own from 0 to 3: 3 = every requirement of the criterion "
        "is fulfilled; 2 = most are, with one substantive gap; 1 = only a few are; 0 = none, "
        "or the response does the opposite. A criterion marked PITFALL describes behaviour a "
        "good response avoids: grade how fully that behaviour IS present (3 = fully present). "
        "Give a grade for every number, exactly once. Reply with only a JSON object of this "
        "shape: {shape}"
    ),
    user=(
        "# Conversation\n{context}\n\n"
        "# Response to grade\n{response}\n\n"
        "# Criteria\n{criteria}\n\n"
        "Grade every criterion. Reply with only the JSON object: {shape}"
    ),
    shape='{"grades": {"1": <0, 1, 2 or 3>, "2": <0, 1, 2 or 3>, ...}}',
)

EQUIV = PromptTemplate(
    name="equivalent",
    version="equivalent-v1",
    system=(
        "You decide whether a predicted answer to a question means the same as one of the gold "
        "answers. Ignore differences in wording, formatting, articles and abbreviations; the "
        "prediction must name the same entity, value or fact. A prediction that hedges between "
        "several answers is not equivalent. Reply with only a JSON object of this shape: {shape}"
    ),
    user=(
        "# Question\n{question}\n\n"
        "# Gold answer(s)\n{golds}\n\n"
        "# Predicted answer\n{prediction}\n\n"
        "Does the prediction mean one of the gold answers? Reply with only the JSON object: "
        "{shape}"
    ),
    shape='{"explanation": "<one sentence>", "equivalent": true or false}',
)

# Appended after an unparseable answer; it carries the parser's complaint so the model can fix
# exactly that (wrong key, missing index...) instead of guessing.
REASK = PromptTemplate(
    name="reask",
    version="reask-v1",
    system="",
    user=(
        "Your reply could not be used: {error}. Reply again with only a JSON object of this "
        "shape, with no other text: {shape}"
    ),
    shape="",
)

TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (CHECK, CHECK_YESNO, RATE, COMPARE, COMPARE_12, INDUCE, INDUCE_LINEAGE, CONSOLIDATE,
              BUNDLE, EQUIV,
              DIMENSIONS, DIMENSIONS_GRADED, REASK)
}

PROMPT_VERSIONS: dict[str, str] = {name: t.version for name, t in TEMPLATES.items()}


def reask_message(error: str, shape: str) -> dict[str, str]:
    """The user turn that asks again after an unparseable answer."""
    return {"role": "user", "content": REASK.user.format(error=error, shape=shape)}


def render_bundle(prompt: str, criteria: tuple[str, ...], weights: tuple[float, ...],
                  k_min: int, k_max: int, reference: str | None = None,
                  previous_error: str | None = None) -> Messages:
    """Bundle prompt with the items numbered from 1 (the judge's ``atomic_indices`` are these
    1-based numbers; the parser converts them to 0-based).  ``k_max`` should already be capped at
    the number of items.  ``reference`` (the anchor) is shown when given; ``previous_error``
    (a regeneration) tells the model why its earlier answer could not be used."""
    rows = enumerate(zip(criteria, weights))
    listing = "\n".join(f"{i + 1}. (weight {w:g}) {c}" for i, (c, w) in rows)
    if k_min == k_max:
        count = f"Write exactly {k_min} dimension{'s' * (k_min != 1)}."
    else:
        count = f"Write between {k_min} and {k_max} dimensions."
    ref = reference.strip() if reference and reference.strip() else "(none given)"
    previous = (f" An earlier answer for this checklist could not be used ({previous_error}); "
                "write a fresh one that fixes this." if previous_error else "")
    return BUNDLE.render(prompt=prompt, reference=ref, criteria=listing, count_rule=count,
                         sentences="3 to 8" if k_max == 1 else "2 to 5", n=str(len(criteria)),
                         previous=previous)


def render_drafts(drafts: tuple[Draft, ...]) -> str:
    """Numbered draft listing for the consolidation prompt."""
    return "\n".join(f"{i + 1}. {d.title}: {d.description}" for i, d in enumerate(drafts))


def render_rate(context: str, response: str, criteria: tuple[str, ...],
                weights: tuple[float, ...]) -> Messages:
    """The rating prompt with the checklist listed one criterion a line, with its weight."""
    listing = "\n".join(f"{i + 1}. (weight {w:g}) {c}"
                        for i, (c, w) in enumerate(zip(criteria, weights)))
    return RATE.render(context=context, response=response, checklist=listing)


def render_dimensions(context: str, response: str, criteria: tuple[tuple[str, float], ...],
                      graded: bool) -> Messages:
    """The dimension prompt: criteria numbered from 1, each with its weight; a negative weight is
    marked PITFALL (the verdict then says the behaviour is present)."""
    lines = []
    for i, (text, weight) in enumerate(criteria, start=1):
        mark = "PITFALL, " if weight < 0 else ""
        lines.append(f"{i}. ({mark}weight {weight:g}) {text}")
    template = DIMENSIONS_GRADED if graded else DIMENSIONS
    return template.render(context=context, response=response, criteria="\n".join(lines))
