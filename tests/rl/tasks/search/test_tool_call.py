"""task.protocol=tool_call: the rollout's tokens and loss mask against the chat template's own
rendering of the same conversation (rendered and tokenized by transformers, not by us)."""

import json

import numpy as np
import pytest

from core.types import Prompt
from models.presets import cached_tokenizer, shipped_gguf_path
from models.sampler import Generation, SamplingParams
from models.tokenizer import load_hf_tokenizer
from rewards.qa import arbor_base_reward
from rl.tasks.search.corpus import Doc
from rl.tasks.search.tool_call import (
    SEARCH_TOOL,
    ToolCall,
    ToolError,
    ToolTemplateError,
    parse_tool_calls,
    tool_prompt,
    tool_template,
)
from rl.tasks.search.tool_env import ToolCallSearchEnv
from tests.paths import FIXTURES

# Qwen3's tool format (its tools header, <tool_call> rendering of tool_calls, consecutive tool
# messages in one user turn as <tool_response> blocks), written for these tests without Qwen3's
# reasoning-content handling.
QWEN3_STYLE = (FIXTURES / "tool_call" / "qwen3_style.jinja").read_text()
# the same, but an assistant message that is not the last loses its reasoning (as Qwen3 drops
# the <think> of turns before the last user query): not prefix-stable
REWRITES_HISTORY = QWEN3_STYLE.replace(
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}",
    "{{- '<|im_start|>assistant\\n' + (message.content if loop.last else "
    "message.content.split('</think>')[-1]) }}")
PLAIN_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
         "</think>"]
CORPUS = ["Answer the given question. I need information about alpha beta gamma.",
          '{"name": "search", "arguments": {"query": "alpha"}}', "Doc 1(Title: Title x) text",
          "The information above answers the question. <answer> Alpha </answer>",
          "# Tools You may call one or more functions system user assistant tool"]


def write_tokenizer_folder(folder, template):
    """A tiny byte-level BPE (trained here, ~300 pieces) with Qwen3's special and added tokens,
    and a tokenizer_config.json holding ``template`` (None: no chat template)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    if template is not None:
        cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tokenizer_folder(tmp_path_factory.mktemp("qwen3_style"), QWEN3_STYLE)


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                   chat_template=QWEN3_STYLE, eos_token="<|im_end|>")


class MessagePolicy:
    """Writes scripted assistant messages: each turn's text, canonically tokenized, then the
    EOS token (as the sampler returns it, finish "eos"). Rows are told apart by their prompt."""

    def __init__(self, tok, scripts, prompt_tokens):
        self.tok, self.scripts = tok, scripts
        self.rows = {tuple(p): i for i, p in enumerate(prompt_tokens)}
        self.n = len(prompt_tokens[0])
        self.turn: dict[int, int] = {}

    def generate(self, prompts, sampling, seed, max_new_per_row=None):
        outs = []
        for p in prompts:
            row = self.rows[tuple(p[:self.n])]
            turn = self.turn.get(row, 0)
            self.turn[row] = turn + 1
            outs.append(self.tok.encode(self.scripts[row][turn]) + [self.tok.eos_ids[0]])
        n = max(len(o) for o in outs)
        tokens = np.zeros((len(outs), n), np.int32)
        for i, o in enumerate(outs):
            tokens[i, :len(o)] = o
        return Generation(tokens=tokens, logprobs=np.full((len(outs), n), -0.5, np.float32),
                          lengths=np.asarray([len(o) for o in outs]),
                          finish=("eos",) * len(outs),
                          texts=tuple(self.tok.decode(o) for o in outs))


class FixedRetriever:
    def __init__(self):
        self.queries = []

    def retrieve(self, queries, topk=3):
        self.queries += list(queries)
        return [[Doc(id=f"d{i}", title=f"Title {q}", text=f"text about {q}", score=1.0)
                 for i in range(topk)] for q in queries]


def call(query, name="search"):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"query": query}}) + \
        "\n</tool_call>"


def docs_text(q):  # FixedRetriever's two documents as Search-R1 renders passages, by hand
    return f"Doc 1(Title: Title {q}) text about {q}\nDoc 2(Title: Title {q}) text about {q}"


SCRIPTS = [
    # row 0: one search, then the answer
    [f"I need information about alpha.\n{call('alpha')}", "So.\n<answer> Alpha </answer>"],
    # row 1: two calls in one message (two tool messages in one user turn), then the answer
    [f"{call('beta')}\n{call('gamma')}", "<answer> beta gamma </answer>"],
    # row 2: bad JSON, then an unknown tool, then (final turn) the answer
    ['<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>',
     call("x", name="browse"), "<answer> none </answer>"],
    # row 3: answers at once
    ["<answer> delta </answer>"],
]


def _rollout(tok, scripts, max_turns=2):
    prompts = [Prompt(id=f"p{i}", messages=({"role": "user", "content": tool_prompt(f"q{i}?")},))
               for i in range(len(scripts))]
    env = ToolCallSearchEnv(tok, SamplingParams(64), FixedRetriever(), topk=2,
                            max_turns=max_turns)
    policy = MessagePolicy(tok, scripts, [env.encode_prompt(p) for p in prompts])
    return env, env.rollout(policy, prompts, group_size=1, seed=0)


def expected_conversation(i, trajectory):
    """Row i's conversation, written from the scripts and the retriever's documents; error
    contents are the environment's own wording, read back from it (checked separately)."""
    conv = [{"role": "user", "content": tool_prompt(f"q{i}?")}]
    env_tools = [m for m in trajectory.info["messages"] if m["role"] == "tool"]
    for turn, text in enumerate(SCRIPTS[i]):
        conv.append({"role": "assistant", "content": text})
        queries = [c.query for c in parse_tool_calls(text)] if i != 2 else [None]
        if turn < len(SCRIPTS[i]) - 1:
            conv += [{"role": "tool", "content": docs_text(q) if q else env_tools[turn]["content"]}
                     for q in queries]
    return conv


def reference(hf, conv):
    """transformers' tokens of the conversation and the mask of each assistant message's
    content + its <|im_end|> (the tokens between its generation prompt and its end)."""
    ids = list(hf.apply_chat_template(conv, tools=[SEARCH_TOOL], tokenize=True,
                                      return_dict=False))
    mask = [0] * len(ids)
    for k, m in enumerate(conv):
        if m["role"] == "assistant":
            before = hf.apply_chat_template(conv[:k], tools=[SEARCH_TOOL], tokenize=False,
                                            add_generation_prompt=True)
            start = len(hf.encode(before, add_special_tokens=False))
            end = len(hf.encode(before + m["content"] + "<|im_end|>", add_special_tokens=False))
            mask[start:end] = [1] * (end - start)
    return ids, mask


def test_rollout_equals_the_templates_tokenization_token_for_token(folder, hf):
    tok = load_hf_tokenizer(folder)
    env, groups = _rollout(tok, SCRIPTS)
    trajs = [g.trajectories[0] for g in groups]
    assert env.retriever.queries == ["alpha", "beta", "gamma"]
    for i, t in enumerate(trajs):
        ids, mask = reference(hf, expected_conversation(i, t))
        full = list(t.prompt_tokens) + list(t.tokens)
        assert full == ids, f"row {i}: tokens differ from the template's"
        assert [0] * len(t.prompt_tokens) + list(t.loss_mask) == mask, f"row {i}: mask"
        assert t.info["template_mismatches"] == 0
        # logprobs are the policy's on its tokens, 0 on the environment's
        assert all((lp == -0.5) == bool(m) for lp, m in zip(t.logprobs, t.loss_mask))
    assert [t.finish for t in trajs] == ["answer", "answer", "answer", "answer"]
    assert [(t.info["searches"], t.info["invalid_actions"], t.info["turns"]) for t in trajs] == [
        (1, 0, 2), (2, 0, 2), (0, 2, 3), (0, 0, 1)]
    errors = [m["content"] for m in trajs[2].info["messages"] if m["role"] == "tool"]
    assert "not valid JSON" in errors[0] and "unknown tool 'browse'" in errors[1]
    # the answer is the final message's <answer>: the QA reward reads the text unchanged
    assert arbor_base_reward(trajs[0].text, ["Alpha"]) == 1.0
    assert arbor_base_reward(trajs[3].text, ["delta"]) == 1.0


def test_the_policys_tool_calls_are_the_templates_rendering_of_tool_calls(folder, hf):
    """Row 0's message as a structured tool call renders to the same tokens: what the policy
    wrote is the template's own serialisation of the call."""
    tok = load_hf_tokenizer(folder)
    _, groups = _rollout(tok, SCRIPTS[:1])
    t = groups[0].trajectories[0]
    conv = expected_conversation(0, t)
    conv[1] = {"role": "assistant", "content": "I need information about alpha.",
               "tool_calls": [{"type": "function", "function": {
                   "name": "search", "arguments": {"query": "alpha"}}}]}
    ids, _ = reference(hf, conv)
    assert list(t.prompt_tokens) + list(t.tokens) == ids


def test_a_template_that_rewrites_history_is_counted_and_masks_stay_exact(tmp_path):
    tok = load_hf_tokenizer(write_tokenizer_folder(tmp_path, REWRITES_HISTORY))
    scripts = [[f"<think>hmm</think>{call('alpha')}", "<answer> Alpha </answer>"]]
    _, groups = _rollout(tok, scripts)
    t = groups[0].trajectories[0]
    assert t.info["template_mismatches"] >= 1
    generated = [tok.encode(s) + [tok.eos_ids[0]] for s in scripts[0]]
    assert [x for x, m in zip(t.tokens, t.loss_mask) if m] == generated[0] + generated[1]
    text = tok.decode(list(t.tokens), skip_special_tokens=False)
    assert "<tool_response>\n" + docs_text("alpha")[:20] in text  # the result still came back


def test_a_budget_cut_message_ends_the_trajectory(folder):
    tok = load_hf_tokenizer(folder)

    class Cut(MessagePolicy):
        def generate(self, prompts, sampling, seed, max_new_per_row=None):
            g = super().generate(prompts, sampling, seed, max_new_per_row)
            return Generation(g.tokens[:, :3], g.logprobs[:, :3], np.minimum(g.lengths, 3),
                              ("length",) * len(prompts), g.texts)

    prompts = [Prompt(id="p", messages=({"role": "user", "content": tool_prompt("q?")},))]
    env = ToolCallSearchEnv(tok, SamplingParams(3), FixedRetriever(), topk=2)
    groups = env.rollout(Cut(tok, [SCRIPTS[0]], [env.encode_prompt(prompts[0])]), prompts, 1, 0)
    t = groups[0].trajectories[0]
    assert t.finish == "length" and list(t.loss_mask) == [1, 1, 1]


@pytest.mark.parametrize("body,expected", [
    ('{"name": "search", "arguments": {"query": " a b "}}', ToolCall("a b")),
    ('{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}', ToolCall("a")),
    ('{"name": "search", "arguments": {"query": ', "not valid JSON"),
    ('{"name": "lookup", "arguments": {"query": "a"}}', "unknown tool 'lookup'"),
    ('{"name": "search", "arguments": {"q": "a"}}', 'non-empty string "query"'),
    ('["search"]', 'JSON object with a "name"'),
])
def test_parse_tool_calls(body, expected):
    (parsed,) = parse_tool_calls(f"text <tool_call>\n{body}\n</tool_call> more")
    if isinstance(expected, ToolCall):
        assert parsed == expected
    else:
        assert isinstance(parsed, ToolError) and expected in parsed.message


def test_parse_tool_calls_unclosed_and_none():
    assert parse_tool_calls("<answer> x </answer>") == []
    (parsed,) = parse_tool_calls('<tool_call>\n{"name": "search"')
    assert isinstance(parsed, ToolError) and "not closed" in parsed.message


def test_bad_input_names_the_key_before_any_rollout(tmp_path):
    from rl.tasks.search.task import SearchQATask

    no_template = load_hf_tokenizer(write_tokenizer_folder(tmp_path / "none", None))
    with pytest.raises(ToolTemplateError, match=r"task\.protocol=tool_call: .* no chat template"):
        tool_template(no_template)
    plain = load_hf_tokenizer(write_tokenizer_folder(tmp_path / "plain", PLAIN_CHATML))
    with pytest.raises(ToolTemplateError, match=r"task\.protocol=tool_call: .*ignores the tools="):
        tool_template(plain)
    with pytest.raises(ToolTemplateError, match="ignores the tools="):  # the shipped SmolLM2
        tool_template(cached_tokenizer(str(shipped_gguf_path())))
    task = SearchQATask(protocol="tool_call", retriever={"name": "bm25", "corpus_path": "x"})
    with pytest.raises(ToolTemplateError, match=r"task\.protocol=tool_call"):
        task.make_env(plain, SamplingParams(8))
    with pytest.raises(ValueError, match=r"task\.protocol: must be one of search_r1, tool_call"):
        SearchQATask(protocol="tools")
    with pytest.raises(ValueError, match=r"task\.chat_template: .*nope.jinja: no such file"):
        SearchQATask(chat_template=str(tmp_path / "nope.jinja"))
    # a template file with tool support makes the plain tokenizer usable
    (tmp_path / "tools.jinja").write_text(QWEN3_STYLE)
    fixed = SearchQATask(protocol="tool_call", chat_template=str(tmp_path / "tools.jinja"))
    assert tool_template(fixed.tokenizer_for(plain)).eos_text == "<|im_end|>"


def test_shipped_smollm2_with_the_shipped_chatml_tools_template():
    """The shipped tokenizer ignores tools; with conf/chat_templates/chatml_tools.jinja its
    rollouts equal transformers' rendering of the conversation (a real 49k BPE vocabulary,
    where <tool_call> is several tokens)."""
    from transformers import PreTrainedTokenizerFast

    from tests.paths import CONF

    template = (CONF / "chat_templates" / "chatml_tools.jinja").read_text()
    tok = cached_tokenizer(str(shipped_gguf_path())).with_chat_template(template)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend, chat_template=template,
                                 eos_token=tok.eos_token)
    env, groups = _rollout(tok, SCRIPTS)
    for i, g in enumerate(groups):
        t = g.trajectories[0]
        ids, mask = reference(hf, expected_conversation(i, t))
        assert list(t.prompt_tokens) + list(t.tokens) == ids
        assert [0] * len(t.prompt_tokens) + list(t.loss_mask) == mask
        assert t.info["template_mismatches"] == 0


def test_oracle_demonstrations_in_the_tool_call_protocol(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from rl.run.wiring import make_task
    from tests.paths import CONF

    template_file = CONF / "chat_templates" / "chatml_tools.jinja"
    task = make_task({"name": "search_qa", "n_entities": 200, "n_train": 40, "n_dev": 4,
                      "n_test": 8, "max_obs_tokens": 48, "max_turns": 3, "topk": 2,
                      "max_response_tokens": 600, "cache_dir": str(tmp_path),
                      "protocol": "tool_call", "chat_template": str(template_file)})
    tok = cached_tokenizer(str(shipped_gguf_path()))
    groups = task.demonstrations("train", tok, n=6, max_new_tokens=96)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=tok.eos_token,
                                 chat_template=template_file.read_text())
    for g in groups:
        t = g.trajectories[0]
        assert task.outcome(g.prompt, t) == 1.0, t.text  # valid format, the gold answer
        searches = min(len(dict.fromkeys(g.prompt.meta["supporting_docs"])), task.max_turns)
        assert t.info["searches"] == searches and t.finish == "answer"
        observed = tok.decode([x for x, m in zip(t.tokens, t.loss_mask) if not m],
                              skip_special_tokens=False)
        assert observed.count("<tool_response>") == searches
        ids = hf.apply_chat_template(list(t.info["messages"]), tools=[SEARCH_TOOL],
                                     tokenize=True, return_dict=False)
        assert list(t.prompt_tokens) + list(t.tokens) == list(ids)


def test_our_renderer_writes_tool_schemas_as_transformers_does(folder, hf):
    """tojson keeps non-ASCII as transformers' renderer does (json.dumps would escape it)."""
    tool = {"type": "function", "function": {"name": "suche", "description": "Recherche – café",
                                             "parameters": {"type": "object", "properties": {}}}}
    conv = [{"role": "user", "content": "Où?"}]
    ours = load_hf_tokenizer(folder).apply_chat_template(conv, True, tools=[tool])
    assert ours == hf.apply_chat_template(conv, tools=[tool], tokenize=False,
                                          add_generation_prompt=True)
    assert "Recherche – café" in ours
