"""`task=search_qa`: multi-hop QA with a search tool, in Search-R1's tags
(``protocol=search_r1``) or the model's native tool calls (``protocol=tool_call``,
rl/tasks/search/tool_call.py).

By default it trains on the shipped benchmark: a fictional multi-hop world generated from a
seed (rl/tasks/search/world.py), written once to a cache folder, with a local BM25 retriever over
its corpus. Real data: point `train_path`/`eval_paths` at Search-R1 parquet, FlashRAG jsonl,
HotpotQA, 2WikiMultiHopQA, MuSiQue or Bamboogle files and `retriever` at a corpus or an HTTP
retrieval server.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.search_r1 import agent_metrics, extract_answer, normalize_answer, search_prompt
from core.types import Group, Prompt, Trajectory
from models.sampler import SamplingParams
from models.tokenizer import Tokenizer
from rewards.qa import QA_REWARDS, REWARD_METRIC, AnswerScore, answer_f1, reward_score
from rewards.qa_metrics import METRIC_SETS
from rl.tasks.search.client import make_retriever
from rl.tasks.search.datasets import QAExample, load_qa
from rl.tasks.search.demos import corpus_titles, oracle_demonstrations
from rl.tasks.search.env import SearchEnv
from rl.tasks.search.faults import RetrievalGuard, RetrievalSettings
from rl.tasks.search.tool_call import PROTOCOLS, tool_prompt, tool_template
from rl.tasks.search.tool_env import ToolCallSearchEnv
from rl.tasks.search.world import WORLD_FILES, world_problem, world_settings, write_world

log = logging.getLogger(__name__)


def example_to_prompt(ex: QAExample, protocol: str = "search_r1") -> Prompt:
    instruction = tool_prompt if protocol == "tool_call" else search_prompt
    return Prompt(id=ex.id, messages=({"role": "user", "content": instruction(ex.question)},),
                  answer=tuple(ex.golds),
                  meta={"question": ex.question, "source": ex.source, **dict(ex.meta or {})})


@functools.lru_cache(maxsize=4)
def shipped_world(cache_dir: str, seed: int, n_entities: int, n_train: int, n_dev: int,
                  n_test: int) -> dict[str, Path]:
    """Write (once) and return the paths of the generated world for these settings. A cached
    world is used only when its manifest's checksums match its files (``world_problem``);
    one a kill interrupted, or an older cache, is named in a warning and written again."""
    key = hashlib.sha1(json.dumps([seed, n_entities, n_train, n_dev, n_test]).encode())
    out = Path(cache_dir) / f"world-{key.hexdigest()[:12]}"
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    problem = world_problem(out, world_settings(seed, n_entities, sizes))
    if problem is not None:
        if out.exists():
            log.warning("task.search_qa: world cache %s unusable (%s); writing it again",
                        out, problem)
        write_world(out, seed=seed, n_entities=n_entities, sizes=sizes)
    return {n: out / f"{n}.jsonl" for n in WORLD_FILES}


@functools.lru_cache(maxsize=4)
def _cached_retriever(cfg_json: str) -> Any:
    """One retriever per configuration per process (training and evaluation share it)."""
    return make_retriever(json.loads(cfg_json))


@functools.lru_cache(maxsize=4)
def _cached_guard(cfg_json: str, settings: RetrievalSettings) -> RetrievalGuard:
    """One fault guard (counters, budget) per retriever per process, as the retriever."""
    return RetrievalGuard(settings)


@dataclasses.dataclass(frozen=True)
class SearchQATask:
    """Multi-hop QA with retrieval. `reward`: a name in rewards.qa.QA_REWARDS
    (arbor_base = F1 if the format is valid else -1; searchr1_em; ...). `reward_metrics`: how
    the reward (and ARBOR's gate F1) matches an answer: ``reward`` (this library's Unicode-aware
    matching) or an official script's conventions (a ``rewards.qa_metrics.METRIC_SETS`` name:
    ``search_r1`` is Search-R1's own training reward, ``squad`` / ``hotpotqa`` their F1)."""

    name: str = "search_qa"
    reward: str = "arbor_base"
    reward_metrics: str = "reward"
    world_seed: int = 0
    n_entities: int = 2000
    n_train: int = 1000
    n_dev: int = 100
    n_test: int = 200
    cache_dir: str = ".cache/search_qa"
    train_path: str | None = None
    eval_paths: Mapping[str, str] | None = None  # split/dataset name -> file
    data_format: str | None = None
    retriever: Mapping[str, Any] | None = None  # default: BM25 over the world's corpus
    topk: int = 3
    max_turns: int = 4
    max_response_tokens: int = 512
    max_obs_tokens: int = 256
    chunk_tokens: int = 16  # decode granularity: rows start their next turn between chunks
    quote_titles: bool = False  # Search-R1's rendering of wiki-18 titles (with quotes)
    # fault handling of retrieval (rl.tasks.search.faults); None: a failed retrieval ends the run
    retrieval: Mapping[str, Any] | None = None
    # how the policy calls the search tool: Search-R1's tags, or the chat template's tool calls
    protocol: str = "search_r1"
    chat_template: str | None = None  # a jinja file replacing the tokenizer's chat template

    def __post_init__(self) -> None:
        needs = REWARD_METRIC[QA_REWARDS.get(self.reward)]  # fails early on an unknown name
        if self.reward_metrics != "reward":
            if self.reward_metrics not in METRIC_SETS:
                raise ValueError(f"task.reward_metrics: unknown {self.reward_metrics!r}; have "
                                 f"{sorted(METRIC_SETS.names())}")
            if needs not in METRIC_SETS.get(self.reward_metrics).metrics:
                raise ValueError(f"task.reward_metrics={self.reward_metrics} has no {needs!r}, "
                                 f"which task.reward={self.reward} needs")
        self.retrieval_settings()  # and on bad fault-handling settings
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"task.protocol: must be one of {', '.join(PROTOCOLS)}, got "
                             f"{self.protocol!r}")
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise ValueError(f"task.chat_template: {self.chat_template}: no such file")

    def retrieval_settings(self) -> RetrievalSettings | None:
        return None if self.retrieval is None else RetrievalSettings.parse(self.retrieval)

    def _world(self) -> dict[str, Path]:
        return shipped_world(self.cache_dir, self.world_seed, self.n_entities, self.n_train,
                             self.n_dev, self.n_test)

    def split_paths(self) -> dict[str, Path]:
        """Split name -> file: `train_path` as "train" (else the shipped world's train / dev /
        test), plus every `eval_paths` dataset (a model trained on the shipped world can be
        evaluated on real benchmarks)."""
        if self.train_path is not None:
            paths = {"train": Path(self.train_path)}
        else:
            paths = {k: v for k, v in self._world().items() if k != "corpus"}
        return paths | {k: Path(v) for k, v in dict(self.eval_paths or {}).items()}

    def prompts(self, split: str) -> list[Prompt]:
        """The split's questions, without those a dataset marks unanswerable (MuSiQue's
        full version): they have no gold answer to score against."""
        paths = self.split_paths()
        if split not in paths:
            raise ValueError(f"task.search_qa has no split {split!r}; have {sorted(paths)}")
        examples = load_qa(paths[split], fmt=self.data_format)
        kept = [ex for ex in examples if ex.meta.get("answerable", True)]
        if len(kept) < len(examples):
            log.info("task.search_qa: %s: left out %d unanswerable question(s)", paths[split],
                     len(examples) - len(kept))
        return [example_to_prompt(ex, self.protocol) for ex in kept]

    def _retriever_json(self) -> str:
        """The retriever's config: ``task.retriever`` (default: BM25 over the shipped world's
        corpus); an HTTP retriever takes its fault handling from ``task.retrieval``, unless
        ``task.retriever`` sets a key itself."""
        cfg = dict(self.retriever or {})
        if not cfg:
            cfg = {"name": "bm25", "corpus_path": str(self._world()["corpus"]),
                   "cache_dir": str(Path(self.cache_dir) / "bm25")}
        settings = self.retrieval_settings()
        if cfg.get("name") == "http" and settings is not None:
            cfg = settings.client_options() | cfg
        return json.dumps(cfg, sort_keys=True)

    def make_retriever(self) -> Any:
        return _cached_retriever(self._retriever_json())

    def tokenizer_for(self, tokenizer: Tokenizer) -> Tokenizer:
        """The model's tokenizer, rendering chats with ``chat_template`` when it is set."""
        if self.chat_template is None:
            return tokenizer
        return tokenizer.with_chat_template(Path(self.chat_template).read_text(encoding="utf-8"))

    def make_env(self, tokenizer: Tokenizer, sampling: SamplingParams) -> SearchEnv:
        """The environment of ``protocol``; with ``tool_call`` the chat template is checked
        first (``rl.tasks.search.tool_call.tool_template``: an error naming the key)."""
        tokenizer = self.tokenizer_for(tokenizer)
        # the template is checked before the retriever is built (a BM25 index takes a while)
        template = (tool_template(tokenizer, self.chat_template)
                    if self.protocol == "tool_call" else None)
        settings = self.retrieval_settings()
        guard = None if settings is None else _cached_guard(self._retriever_json(), settings)
        kw: dict[str, Any] = dict(
            topk=self.topk, max_turns=self.max_turns, max_response_tokens=self.max_response_tokens,
            max_obs_tokens=self.max_obs_tokens, chunk_tokens=self.chunk_tokens,
            quote_titles=self.quote_titles, guard=guard)
        if template is not None:
            return ToolCallSearchEnv(tokenizer, sampling, self.make_retriever(),
                                     template=template, **kw)
        return SearchEnv(tokenizer, sampling, self.make_retriever(), **kw)

    def answer_score(self) -> AnswerScore:
        """The answer matching of `reward_metrics` (``rewards.qa.AnswerScore``)."""
        if self.reward_metrics == "reward":
            return reward_score
        return METRIC_SETS.get(self.reward_metrics).score

    def step_metrics(self, groups: Sequence[Group]) -> dict[str, float]:
        """The rollout's ``agent/*`` behaviour in the step record, as Search-R1 logs it
        (``core.search_r1.agent_metrics``)."""
        return agent_metrics([t for g in groups for t in g.trajectories])

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        return float(QA_REWARDS.get(self.reward)(traj.text, list(prompt.answer),
                                                 score=self.answer_score()))

    def answer(self, prompt: Prompt, traj: Trajectory) -> str | None:
        """The trajectory's final answer, normalised (SQuAD's rules, ``core.search_r1``), as
        majority voting compares answers (None: no ``<answer>``)."""
        found = extract_answer(traj.text)
        return None if found is None else normalize_answer(found)

    def answer_f1(self, prompt: Prompt, traj: Trajectory) -> float:
        """F1 of the trajectory's answer under `reward_metrics`, whatever its format (what
        ARBOR's gates read)."""
        return float(answer_f1(traj.text, list(prompt.answer), score=self.answer_score()))

    def demonstrations(self, split: str, tokenizer: Tokenizer, n: int | None = None,
                       max_new_tokens: int = 128) -> list[Group]:
        """Oracle trajectories for a format warm-up (rl/tasks/search/demos.py): search each
        supporting document's title, then answer. Needs supporting docs in the data and the
        corpus they refer to (the shipped world has both)."""
        corpus = (dict(self.retriever or {}).get("corpus_path") if self.train_path is not None
                  else self._world()["corpus"])
        if corpus is None:
            raise ValueError("task.search_qa: demonstrations need the corpus file "
                             "(task.retriever.corpus_path) to map supporting docs to titles")
        prompts = self.prompts(split)[:n]
        env = self.make_env(tokenizer, SamplingParams(max_new_tokens=max_new_tokens,
                                                      temperature=0.0))
        return oracle_demonstrations(env, prompts, corpus_titles(corpus), self.protocol)
