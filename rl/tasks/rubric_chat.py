"""``task=rubric_chat``: everyday how-to prompts with rule-checkable rubrics (ProRubric demo).

Generated from a seed, no download, small enough for the embedded default (SmolLM2-135M on
CPU).  Each prompt ("Give me tips for sleeping better.", "How do I keep basil alive?", ...)
comes from a bank of ``TOPICS``; each topic has six expected items, each with a keyword regex and
a reference sentence that names the item and then explains it.  Per prompt (seeded): the
question phrasing, the item order, the weights and the number of dimensions ``K``.

Training rubric (rule-language criteria, ``judges.rule_language``; titles say what they mean):

* per item ``i``: *mentions* ``i`` (a keyword; weight 3..5) and *explains* ``i`` (a keyword and
  a reason connective such as "because", "so", "which" in the same sentence; weight 1..2);
* pitfall ``-2``: a bare keyword dump (a comma list of 5+ fragments without sentence
  punctuation, or 4+ one-to-three-word bullets); pitfall ``-3``: an unsupported high-risk
  recommendation (double dose, mixing bleach and ammonia, stopping medication, ...).

Dimensions (shipped with the prompt, so training needs no LLM bundler): the items are cut into
``K`` in {2, 3} contiguous groups (K=2: 3+3 items, K=3: 2+2+2), each dimension holding its items'
mention *and* explanation criteria; the keyword-dump pitfall joins the first dimension, the
high-risk pitfall the last.  Failure clauses: the first dimension fails on the topic's bad
advice (e.g. "sleep in on weekends"), the last on a refusal ("as an AI ..."), a middle one has
none.  So additive aggregation pays for naming keywords without substance (mentions carry most
of the weight), while the AND-product pays a dimension only when every item in it is named *and*
explained and no pitfall fires.

Held-out FITNESS criteria (``rubric.meta["fitness"]``), never in the training rubric: answers
first (no preamble, the first sentence names an item), concise (``<= max_words`` words), no
unrequested disclaimers / filler ("consult a professional", "I hope this helps"), no repeated
4-word phrase.  The reference answers pass all of them and score 1 under every aggregator
(but ``raw_and_verbatim``, whose text asks for the pitfalls as written, as the ProRubric
authors' raw-AND build does: the first and last dimensions, which hold the pitfalls, fail).

``outcome(prompt, traj)`` is the configured training aggregator's reward (``aggregator``; the
hydra config links it to ``algo.rewarder_options.aggregator``), checked with a private rule
judge.  ``evaluate(prompts, responses)`` returns coverage ``g`` (training rubric, additive
normalisation), fitness ``c`` (held-out pass rate), length (words) and the reward.

Export the rubrics (native format, with dimensions and reference answers; used by
``rewards.perturb``)::

    python -m rl.tasks.rubric_chat OUT.jsonl [split=test] [n=12] [seed=0] [max_words=100]
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from core.types import Group, Prompt, Trajectory
from models.sampler import SamplingParams
from rewards.perturb import REASON_PATTERN
from rewards.rubric import Criterion, Dimension, Rubric
from rewards.rubric_io import save_rubrics
from rl.tasks.envs import SingleTurnEnv

if TYPE_CHECKING:
    from rewards.rubric_scoring import RubricReport

SPLIT_SEEDS = {"train": 0, "dev": 1, "test": 2}


@dataclasses.dataclass(frozen=True)
class Item:
    """An expected item: a label, a keyword regex (alternation, matched from a word start,
    case-insensitive) and a reference sentence that names it before explaining it."""

    label: str
    keywords: str
    sentence: str


@dataclasses.dataclass(frozen=True)
class Topic:
    name: str
    questions: tuple[str, ...]
    items: tuple[Item, ...]
    bad_advice: str  # regex; the first dimension's failure clause


I = Item  # noqa: E741 - short alias for the bank below
TOPICS: tuple[Topic, ...] = (
    Topic("sleep", ("Give me tips for sleeping better.", "How can I sleep better at night?",
                    "What helps with getting better sleep?"), (
        I("consistent schedule", r"same time|schedule",
          "Go to bed and wake up at the same time every day, so your body clock stays steady."),
        I("dark bedroom", r"dark|blackout",
          "Keep the bedroom dark and cool, because light and heat tell your brain to stay up."),
        I("screens off", r"screens?|phones?",
          "Put screens away an hour before bed, since their glow delays the sleep hormone."),
        I("limit caffeine", r"caffeine|coffee",
          "Avoid caffeine after lunch, which can linger in your body for hours."),
        I("daytime exercise", r"exercis|workout",
          "Get some exercise during the day, which helps you feel tired at night."),
        I("wind-down routine", r"wind[- ]down|reading",
          "Build a calm wind-down habit like reading, to help your mind switch off."),
    ), r"\b(?:sleep in (?:late )?on weekends|nap for (?:hours|several hours)|nightcap)"),
    Topic("basil", ("How do I keep basil alive?", "Give me tips for keeping a basil plant alive.",
                    "My basil keeps dying. What should I do?"), (
        I("sunlight", r"sun",
          "Put the pot in a sunny window, because basil needs six hours of light a day."),
        I("careful watering", r"water",
          "Water when the top inch of soil feels dry, so the roots never sit soggy."),
        I("drainage", r"drain",
          "Use a pot with drainage holes, which stops excess moisture pooling at the roots."),
        I("pinching", r"pinch|prun",
          "Pinch off the top leaves often, since this makes the plant grow bushy."),
        I("remove flowers", r"flower|buds?\b",
          "Remove flower buds as soon as they appear, because blooming makes the leaves bitter."),
        I("warmth", r"cold|drafts?\b|frost",
          "Keep it away from cold drafts, which damage the leaves overnight."),
    ), r"\b(?:water (?:it )?(?:several times|three times|every hour)|full shade)"),
    Topic("groceries", ("How can I save money on groceries?",
                        "Give me tips for spending less on groceries."), (
        I("shopping list", r"shopping list|a list\b",
          "Write a shopping list before you go, so you skip impulse buys."),
        I("meal planning", r"meal plan|plan your meals",
          "Plan your meals for the week, which cuts waste from forgotten food."),
        I("store brands", r"store brands?|generic",
          "Choose store brands over name brands, since they often cost a third less."),
        I("buy in bulk", r"bulk",
          "Buy staples like rice and beans in bulk, because the unit price drops."),
        I("never shop hungry", r"hungry",
          "Never shop hungry, because hunger makes snacks look irresistible."),
        I("freeze leftovers", r"leftovers?|freez",
          "Freeze leftovers in portions, so nothing goes bad before you eat it."),
    ), r"\b(?:shop (?:while|when) (?:you are |you're )?hungry|buy whatever you feel like)"),
    Topic("exams", ("How should I study for an exam?", "Give me tips for studying for exams."), (
        I("spaced study", r"spread|spaced",
          "Spread your study over several days, since spaced practice beats cramming."),
        I("practice questions", r"practice (?:tests?|questions)|quiz yourself",
          "Quiz yourself with practice questions, which shows what you actually remember."),
        I("short breaks", r"breaks?\b",
          "Take short breaks every half hour, to keep your focus fresh."),
        I("sleep before the exam", r"sleep",
          "Get a full night of sleep before the exam, because memories settle while you rest."),
        I("teach someone", r"teach",
          "Teach the material to a friend, which exposes gaps in your understanding."),
        I("silence the phone", r"phones?|notifications?",
          "Silence your phone while studying, so notifications cannot pull you away."),
    ), r"\b(?:all[- ]nighter|cram (?:everything )?the night before|skip sleep)"),
    Topic("coffee", ("How do I make better coffee at home?",
                     "Give me tips for brewing good coffee at home."), (
        I("fresh beans", r"whole beans|fresh beans|roasted",
          "Buy whole beans roasted in the last month, because stale coffee tastes flat."),
        I("grind fresh", r"grind",
          "Grind right before brewing, since ground coffee loses aroma within minutes."),
        I("weigh it", r"scale|weigh|ratio",
          "Weigh the coffee with a kitchen scale, so every cup has the same strength."),
        I("water temperature", r"off the boil|temperature",
          "Use water just off the boil, which extracts flavour without scorching."),
        I("filtered water", r"filtered",
          "Brew with filtered water, because tap minerals can taste harsh."),
        I("clean the gear", r"clean|descal",
          "Clean the machine every week, to prevent old oils turning bitter."),
    ), r"\b(?:boiling water straight|reuse (?:the )?grounds|pre-ground coffee from last year)"),
    Topic("5k", ("How do I train for my first 5k?", "Give me tips for running my first 5k."), (
        I("build up gradually", r"gradual",
          "Increase your distance gradually, which lets your joints adapt."),
        I("run-walk intervals", r"run[- ]walk|intervals",
          "Start with run-walk intervals, so you can finish sessions without exhaustion."),
        I("proper shoes", r"shoes|trainers|sneakers",
          "Get proper running shoes, because worn soles raise injury risk."),
        I("rest days", r"rest days?|recovery",
          "Schedule rest days between runs, since muscles rebuild during recovery."),
        I("easy pace", r"conversational|easy pace",
          "Keep most runs at a conversational pace, to build endurance without burnout."),
        I("warm-up", r"warm[- ]?up|stretch",
          "Do a five-minute warm-up walk, which prepares your muscles for effort."),
    ), r"\b(?:run through (?:the )?pain|run every day from the start|sprint every run)"),
    Topic("work stress", ("Give me tips for handling stress at work.",
                          "How do I deal with stress at my job?"), (
        I("slow breathing", r"breath",
          "Try slow breathing for one minute, because it calms your heart rate."),
        I("prioritise", r"priorit",
          "Prioritise your three most important tasks, so smaller jobs stop feeling urgent."),
        I("step away", r"step away|breaks?\b",
          "Step away from your desk for short breaks, which resets your attention."),
        I("boundaries", r"boundar|after-hours|after hours",
          "Set boundaries on after-hours email, to protect your evenings."),
        I("move", r"walk|movement",
          "Go for a brisk walk at lunch, since movement burns off tension."),
        I("talk to your manager", r"manager|talk to",
          "Talk to your manager about workload, because they may not know you are stretched."),
    ), r"\b(?:work through (?:every|your) lunch|answer emails at midnight|ignore it and push on)"),
    Topic("cast iron", ("How do I clean a cast iron pan?",
                        "Give me tips for cleaning cast iron cookware."), (
        I("hot water rinse", r"hot water|rinse",
          "Rinse it with hot water while it is still warm, because food lifts off easily then."),
        I("scrub with salt", r"scrub|coarse salt",
          "Scrub stuck bits with coarse salt, which works as a gentle abrasive."),
        I("no soaking", r"soak",
          "Never leave it to soak, since standing water causes rust."),
        I("dry on the stove", r"dry|stove",
          "Dry it over low heat on the stove, so no moisture is left behind."),
        I("oil afterwards", r"oil",
          "Rub in a thin layer of oil afterwards, to protect the seasoning."),
        I("mild soap is fine", r"soap",
          "A drop of mild soap is fine, because modern soap will not strip baked-on seasoning."),
    ), r"\b(?:dishwasher|soak (?:it )?overnight|let it air[- ]dry)"),
    Topic("language", ("How can I learn a new language faster?",
                       "Give me tips for learning a language."), (
        I("daily practice", r"every day|daily",
          "Practise for ten minutes every day, since short daily sessions beat long ones."),
        I("speak early", r"speak|tutor",
          "Speak from the first week with a tutor, because talking forces you to recall words."),
        I("flashcards", r"flashcards?|spaced repetition",
          "Use flashcards with spaced repetition, which schedules reviews before you forget."),
        I("listen", r"listen|podcasts?",
          "Listen to podcasts in the language, to train your ear for natural speed."),
        I("accept mistakes", r"mistakes?",
          "Accept mistakes as part of learning, so fear never keeps you quiet."),
        I("watch shows", r"shows|subtitles|films",
          "Watch shows with subtitles in the language, which links sounds to spelling."),
    ), r"\b(?:memori[sz]e the (?:whole )?dictionary|only study grammar|wait until you are fluent)"),
    Topic("cover letter", ("How do I write a good cover letter?",
                           "Give me tips for writing a cover letter."), (
        I("tailor it", r"tailor|specific job",
          "Tailor each letter to the specific job, because generic letters get skipped."),
        I("strong opening", r"first line|opening|hook",
          "Open with a strong first line, so the reader wants to continue."),
        I("concrete achievements", r"achievements?|numbers",
          "Cite concrete achievements with numbers, which prove your impact."),
        I("one page", r"one page|short|brief",
          "Keep it to one page, since recruiters skim quickly."),
        I("proofread", r"proofread|typos?\b",
          "Proofread twice, because a single typo looks careless."),
        I("ask for an interview", r"interview",
          "End with a clear request for an interview, to show you are serious about the role."),
    ), r"\b(?:same letter for every|copy (?:a|the) template word for word|lie about)"),
    Topic("electricity", ("How can I lower my electricity bill?",
                          "Give me tips for using less electricity at home."), (
        I("thermostat", r"thermostat",
          "Turn the thermostat down by one degree, which trims heating costs by several percent."),
        I("LED bulbs", r"leds?\b|bulbs?",
          "Swap old bulbs for LEDs, because they use far less power."),
        I("standby devices", r"standby|unplug",
          "Unplug chargers and devices on standby, since they draw power all day."),
        I("seal draughts", r"draughts?|drafts?|insulat",
          "Seal draughts around windows, to keep warm air inside."),
        I("full loads", r"full loads?",
          "Run the dishwasher only with full loads, so each cycle does more work."),
        I("cold wash", r"cold water|cold wash",
          "Wash clothes in cold water, because warming the water is the costly part."),
    ), r"\b(?:leave (?:the )?heating on (?:all|full)|space heaters? in every room)"),
    Topic("friends", ("How do I make friends in a new city?",
                      "Give me tips for meeting people after moving to a new city."), (
        I("join a club", r"club|class",
          "Join a club or class around a hobby, because shared interests make talk easy."),
        I("be a regular", r"regular",
          "Become a regular at one cafe, since familiar faces turn into friends."),
        I("say yes", r"say yes|invitations?",
          "Say yes to invitations, which signals that you are open."),
        I("follow up", r"follow up|message",
          "Follow up with a message after meeting someone, so the connection does not fade."),
        I("volunteer", r"volunteer",
          "Volunteer locally, to meet kind people who share your values."),
        I("be patient", r"patien|months",
          "Be patient with the process, because close friendships take months to form."),
    ), r"\b(?:wait for (?:people|others) to (?:come to you|approach you)|stay home until)"),
    Topic("bike", ("How do I take care of my bike?", "Give me tips for maintaining a bicycle."), (
        I("lube the chain", r"chain|lube",
          "Lube the chain every few weeks, because a dry chain wears out fast."),
        I("tyre pressure", r"tyres?|tires?|pressure",
          "Check tyre pressure weekly, since soft tyres cause flats."),
        I("test the brakes", r"brakes?",
          "Test the brakes before every ride, so you can always stop in time."),
        I("wipe off mud", r"mud|wipe",
          "Wipe off mud after wet rides, which stops grit wearing the parts."),
        I("store indoors", r"indoors|store",
          "Store it indoors, to protect it from rust."),
        I("yearly tune-up", r"tune-up|mechanic|service",
          "Get a yearly tune-up at a shop, because a mechanic spots worn parts early."),
    ), r"\b(?:ignore (?:squeaky|soft|worn) brakes|use cooking oil on the chain)"),
    Topic("remote focus", ("How can I focus when working from home?",
                           "Give me tips for staying focused while working remotely."), (
        I("dedicated workspace", r"workspace|desk",
          "Set up a dedicated workspace, because your brain links that spot with focus."),
        I("fixed start time", r"start time|fixed hours",
          "Keep a fixed start time, so the day has a clear shape."),
        I("timed breaks", r"breaks?\b|pomodoro",
          "Use timed breaks like the pomodoro method, which keeps energy steady."),
        I("notifications off", r"notifications?",
          "Turn off notifications during focus blocks, since each ping costs minutes."),
        I("get dressed", r"dress",
          "Get dressed as if going out, to signal that the workday has begun."),
        I("log off", r"log off|end of (?:the )?day",
          "Log off at a set end of day, which prevents work bleeding into evenings."),
    ), r"\b(?:work from (?:your )?bed|keep (?:the )?tv on|check (?:email|messages) every minute)"),
    Topic("rice", ("How do I cook fluffy rice?", "Give me tips for cooking rice on the stove."), (
        I("rinse first", r"rinse",
          "Rinse the rice until the water runs clear, because loose starch makes it gummy."),
        I("water ratio", r"cups? of water|ratio",
          "Use about one and a half cups of water per cup of rice, so the grains cook evenly."),
        I("simmer covered", r"simmer|low heat",
          "Simmer on low heat with the lid on, which keeps the steam inside."),
        I("let it rest", r"rest\b|ten minutes",
          "Let it rest off the heat for ten minutes, since the steam finishes the cooking."),
        I("fluff with a fork", r"fluff|fork",
          "Fluff it with a fork before serving, to separate the grains."),
        I("do not stir", r"stir",
          "Do not stir while it cooks, because stirring releases starch."),
    ), r"\b(?:stir (?:it )?(?:constantly|often|every minute)|boil (?:it )?uncovered on high)"),
    Topic("packing", ("How do I pack light for a trip?", "Give me tips for packing light."), (
        I("packing list", r"packing list|a list\b",
          "Make a packing list first, so you only bring what you need."),
        I("neutral colours", r"neutral|mix and match",
          "Pick clothes in neutral colours, which all mix and match."),
        I("roll clothes", r"roll",
          "Roll your clothes instead of folding them, because rolled clothes take less space."),
        I("travel-size toiletries", r"travel[- ]size|toiletr",
          "Bring travel-size toiletries, since full bottles are heavy and bulky."),
        I("wear bulky items", r"bulkiest|on the plane",
          "Wear your bulkiest shoes on the plane, to save room in the bag."),
        I("do laundry", r"laundry",
          "Plan to do laundry once, which halves the clothes you need."),
    ), r"\b(?:pack (?:an outfit|something) for every (?:possible )?(?:occasion|scenario))"),
)
del I

# --- criteria shared by every prompt --------------------------------------------------------

KEYWORD_DUMP = (
    r"regex:(?m)^[^,.!?\n]+(?:,[^,.!?\n]+){4,}$"
    r"|(?:^[ \t]*(?:[-*]|\d+[.)])[ \t]*[^\s.!?]+(?:[ \t]+[^\s.!?]+){0,2}[ \t]*$\n?){4,}"
)
HIGH_RISK = (
    r"iregex:\b(?:double (?:the |a |your )?dose|high[- ]dose|without (?:asking )?(?:a |any |your )?"
    r"(?:doctor|prescription|supervision)|stop taking (?:your )?(?:regular )?medication|"
    r"bleach and ammonia|sedatives?)\b"
)
REFUSAL = r"iregex:\b(?:I can(?:not|'t) (?:help|answer|provide|give)|I am unable to|as an AI)\b"
PREAMBLE = (
    r"^\W*(?:great question|good question|sure|certainly|of course|absolutely|hello|hi|hey|"
    r"thanks|thank you|as an ai|i'?m (?:happy|glad))\b"
)
EXTRAS = (
    r"\b(?:consult (?:a|your) (?:doctor|physician|professional|expert)|(?:I am|I'm) not an? "
    r"(?:doctor|professional|expert)|disclaimer|please note|it is important to note|"
    r"it's important to note|seek professional|results may vary|hope this helps|"
    r"let me know if)\b"
)
REPEATED_PHRASE = r"\b(\w+\W+\w+\W+\w+\W+\w+)\b.*\b\1\b"
DUMP_WEIGHT, HIGH_RISK_WEIGHT = -2.0, -3.0


def mention_rule(item: Item) -> str:
    """``iregex``: a keyword of the item, from a word start."""
    return rf"iregex:\b(?:{item.keywords})"


def explain_rule(item: Item) -> str:
    """``iregex``: a keyword and a reason connective in the same sentence (either order)."""
    kw = rf"\b(?:{item.keywords})"
    return rf"iregex:{kw}[^.!?\n]*?{REASON_PATTERN}|{REASON_PATTERN}[^.!?\n]*?{kw}"


def fitness_for(topic: Topic, max_words: int) -> tuple[Criterion, ...]:
    """The held-out criteria (weight 1, "met" = good) of a topic's prompts."""
    kws = "|".join(it.keywords for it in topic.items)
    return (
        Criterion(f"not:iregex:{PREAMBLE} && iregex:^[^.!?\n]*?\\b(?:{kws})", 1.0, ("fitness",),
                  "Answers first: no preamble, the first sentence gives advice"),
        Criterion(f"max_words:{max_words}", 1.0, ("fitness",),
                  f"Concise: at most {max_words} words"),
        Criterion(f"not:iregex:{EXTRAS}", 1.0, ("fitness",),
                  "No unrequested disclaimers or sign-off filler"),
        Criterion(f"not:iregex:{REPEATED_PHRASE}", 1.0, ("fitness",), "No repeated 4-word phrase"),
    )


def build_rubric(pid: str, topic: Topic, question: str, order: Sequence[int], k: int,
                 mention_w: Sequence[float], explain_w: Sequence[float], max_words: int
                 ) -> Rubric:
    """A bundled rubric for ``topic`` with items in ``order`` cut into ``k`` dimensions."""
    items = [topic.items[i] for i in order]
    crits: list[Criterion] = []
    for it, wm, we in zip(items, mention_w, explain_w):
        crits.append(Criterion(mention_rule(it), float(wm), ("mention",), f"Mentions: {it.label}"))
        crits.append(Criterion(explain_rule(it), float(we), ("explain",),
                               f"Explains why: {it.label}"))
    dump, risk = len(crits), len(crits) + 1
    crits.append(Criterion(KEYWORD_DUMP, DUMP_WEIGHT, ("pitfall",),
                           "Pitfall: dumps bare keywords instead of advice"))
    crits.append(Criterion(HIGH_RISK, HIGH_RISK_WEIGHT, ("pitfall",),
                           "Pitfall: recommends an unsupported high-risk action"))
    bounds = np.linspace(0, len(items), k + 1).round().astype(int)
    dims = []
    for d in range(k):
        lo, hi = int(bounds[d]), int(bounds[d + 1])
        idx = [j for i in range(lo, hi) for j in (2 * i, 2 * i + 1)]
        failure = None
        if d == 0:
            idx.append(dump)
            failure = f"iregex:{topic.bad_advice}"
        if d == k - 1:
            idx.append(risk)
            failure = REFUSAL
        dims.append(Dimension(" & ".join(it.label for it in items[lo:hi]), tuple(idx), failure))
    reference = " ".join(it.sentence for it in items)
    fit = [{"text": c.text, "weight": c.weight, "title": c.title} for c in
           fitness_for(topic, max_words)]
    return Rubric(prompt_id=pid, prompt=question, criteria=tuple(crits), dimensions=tuple(dims),
                  reference_answer=reference,
                  meta={"topic": topic.name, "fitness": fit, "bundler": "rubric_chat"})


def make_prompts(n: int, seed: int, max_words: int = 100) -> list[Prompt]:
    """``n`` prompts, a pure function of (``n``, ``seed``, ``max_words``)."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        topic = TOPICS[int(rng.integers(len(TOPICS)))]
        question = topic.questions[int(rng.integers(len(topic.questions)))]
        order = [int(i) for i in rng.permutation(len(topic.items))]
        k = int(rng.choice([2, 3]))
        mention_w = rng.choice([3.0, 4.0, 5.0], size=len(order))
        explain_w = rng.choice([1.0, 2.0], size=len(order))
        pid = f"rubric_chat-{seed}-{j}"
        rubric = build_rubric(pid, topic, question, order, k, mention_w.tolist(),
                              explain_w.tolist(), max_words)
        out.append(Prompt(id=pid, messages=({"role": "user", "content": question},),
                          answer=rubric.reference_answer,
                          meta={"question": question, "rubric": rubric, "topic": topic.name}))
    return out


@functools.cache
def _rule_judge() -> Any:
    from judges.rule import RuleJudge

    return RuleJudge()


@dataclasses.dataclass(frozen=True)
class RubricChatTask:
    """``size`` train prompts; dev/test from other seeds (``1000 * seed + split``).

    ``aggregator``: the reward ``outcome()`` reports (any of
    ``rewards.rubric_scoring.reward_names()``) and ``clip`` (its per-example clip to [0, 1],
    linked to ``algo.rewarder_options.clip``); ``max_words``: the held-out concision limit.
    """

    size: int = 256
    eval_size: int = 16
    seed: int = 0
    aggregator: str = "prorubric"
    max_words: int = 100
    clip: bool = False
    name: str = "rubric_chat"

    #: the criteria are rule-language predicates: the rubric rewarder may default to RuleJudge
    rule_checkable: ClassVar[bool] = True
    #: every prompt carries its own rubric (``prompt.meta["rubric"]``)
    prompt_rubrics: ClassVar[bool] = True

    def __post_init__(self) -> None:
        from rewards.rubric_scoring import check_reward_name

        check_reward_name(self.aggregator, "task.aggregator")
        if int(self.max_words) < 1:
            raise ValueError(f"task.max_words must be >= 1, got {self.max_words}")

    def prompts(self, split: str) -> list[Prompt]:
        if split not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; splits: {sorted(SPLIT_SEEDS)}")
        n = self.size if split == "train" else self.eval_size
        return make_prompts(n, 1000 * self.seed + SPLIT_SEEDS[split], int(self.max_words))

    def make_env(self, tokenizer: Any, sampling: SamplingParams) -> SingleTurnEnv:
        return SingleTurnEnv(tokenizer, sampling)

    def evaluate(self, prompts: Sequence[Prompt], responses: Sequence[str],
                 judge: Any = None) -> RubricReport:
        """Coverage g, fitness c, length and the training reward of ``responses[b]`` to
        ``prompts[b]`` (one batched check with ``judge``, default: a rule judge), and in the
        summary HealthBench's clipped scores (``rewards.healthbench``): ``healthbench``,
        ``axis/mention``, ``axis/explain``, ``theme/<topic>``."""
        from rewards.rubric_scoring import (
            ScoreItem,
            fitness_criteria,
            prompt_rubric,
            rubric_report,
            score_items,
        )

        items = []
        for p, text in zip(prompts, responses, strict=True):
            r = prompt_rubric(p)
            items.append(ScoreItem(r.prompt_text(), text, r, fitness_criteria(r)))
        s = score_items(judge or _rule_judge(), items, self.aggregator, clip=bool(self.clip))
        # HealthBench's clipped scores: overall, by criterion kind (mention / explain; the
        # pitfalls alone have no positive points) and by topic
        return rubric_report(s, [it.rubric for it in items],
                             [(f"theme:{it.rubric.meta.get('topic', '')}",) for it in items])

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        """The configured aggregator's reward of one trajectory (private rule judge)."""
        return float(self.evaluate([prompt], [traj.text]).reward[0])

    def demonstrations(self, split: str, tokenizer: Any, n: int | None = None,
                       max_new_tokens: int = 128) -> list[Group]:
        """The first ``n`` prompts of ``split`` answered with their rubric's reference answer
        (every item named and explained, no pitfall, no failure clause, every fitness criterion
        met), for a coverage warm-up with ``rl.sft``: groups of size 1, as a policy would have
        sampled them (``reference_trajectory``)."""
        return [Group(p, (reference_trajectory(p, tokenizer, max_new_tokens),))
                for p in self.prompts(split)[:n]]


def reference_trajectory(prompt: Prompt, tokenizer: Any, max_new_tokens: int) -> Trajectory:
    """The reference answer as a single-turn trajectory: the chat-templated prompt, then the
    answer's tokens and the end-of-turn token (so the warm-up also teaches where to stop), cut
    at ``max_new_tokens`` (finish ``"length"``) as the sampler would cut it."""
    text = prompt.meta["rubric"].reference_answer
    ids = [*tokenizer.encode(text), *tokenizer.eos_ids[:1]]
    finish = "eos" if tokenizer.eos_ids else "length"
    if len(ids) > max_new_tokens:
        ids, finish = ids[:max_new_tokens], "length"
        text = tokenizer.decode(ids)
    return Trajectory(prompt_tokens=tuple(tokenizer.encode_chat(list(prompt.messages))),
                      tokens=tuple(ids), loss_mask=(1,) * len(ids), logprobs=(0.0,) * len(ids),
                      text=text, finish=finish)


def export_rubrics(path: str | Path, split: str = "test", n: int = 12, seed: int = 0,
                   max_words: int = 100) -> list[Rubric]:
    """Write ``n`` prompts' rubrics (with references, dimensions, fitness) in native format."""
    task = RubricChatTask(size=n, eval_size=n, seed=seed, max_words=max_words)
    rubrics = [p.meta["rubric"] for p in task.prompts(split)]
    save_rubrics(rubrics, path)
    return rubrics


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pos = [a for a in argv if "=" not in a]
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    if len(pos) != 1 or set(opts) - {"split", "n", "seed", "max_words"}:
        print("usage: python -m rl.tasks.rubric_chat OUT.jsonl [split=test] [n=12] [seed=0] "
              "[max_words=100]", file=sys.stderr)
        return 2
    rubrics = export_rubrics(pos[0], opts.get("split", "test"), int(opts.get("n", 12)),
                             int(opts.get("seed", 0)), int(opts.get("max_words", 100)))
    print(f"wrote {len(rubrics)} rubrics to {pos[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
