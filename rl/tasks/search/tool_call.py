"""The native tool-call protocol of ``task=search_qa`` (``task.protocol=tool_call``).

The model calls the search tool in its own chat format instead of Search-R1's tags. The tool is
declared to the chat template through its ``tools=`` argument (an OpenAI-style function
schema, ``SEARCH_TOOL``), the model writes Qwen3 / Hermes tool calls in an assistant message,

    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call>

and each call's result goes back as a message of role ``tool`` that the template renders (Qwen3:
``<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>``). An assistant message
without a tool call is the final one; its answer is the content of its ``<answer>`` block (kept
from Search-R1: EM/F1 need a short answer span, and the QA rewards, the rule judge and the
evaluation read it with ``core.search_r1`` unchanged).

Token sequence = the chat template's own rendering. The policy's tokens are kept as sampled; the
environment's tokens after each assistant message (the end of the message, the tool messages,
the next generation prompt) are the *text the template renders after what the sequence already
holds*, tokenized (:meth:`ToolTemplate.delta`). For a template that renders the conversation
prefix-stably (each message's rendering does not change when messages follow it; the Qwen /
ChatML tool templates) the sequence therefore equals the template's tokenization of the whole
conversation, token for token, whenever the policy's tokens are the canonical tokenization of
its text. When the template rewrites earlier turns (Qwen3 drops an empty ``<think>`` block from
an earlier assistant turn, for example), the delta is taken from the template applied to a fixed
base history instead (verl's ``BASE_CHAT_HISTORY`` trick), and the turn is counted in
``template_mismatches``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from models.tokenizer import Tokenizer

PROTOCOLS = ("search_r1", "tool_call")
TOOL_NAME = "search"

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Search the knowledge corpus and return the top matching passages.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query."}},
            "required": ["query"],
        },
    },
}

# The instruction, Search-R1's (core.search_r1.PROMPT_TEMPLATE) with the tool in place of the
# tags; it keeps the prompt's ending (the example answer, then the question line).
PROMPT_TEMPLATE = (
    "Answer the given question. Reason step by step first every time you get new information. "
    "If you find you lack some knowledge, call the search tool with a query; it returns the top "
    "searched results. You can search as many times as you want. If you find no further "
    "external knowledge needed, reply without a tool call and give the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n")

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def tool_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question.strip())


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A well-formed call of the search tool."""

    query: str


@dataclasses.dataclass(frozen=True)
class ToolError:
    """A call the environment cannot run; ``message`` is the tool message sent back."""

    message: str


def _error(reason: str) -> ToolError:
    return ToolError(f"Error: {reason}. Call the tool as <tool_call>\n"
                     f'{{"name": "{TOOL_NAME}", "arguments": {{"query": "..."}}}}\n</tool_call>')


def _parse_one(body: str, closed: bool) -> ToolCall | ToolError:
    if not closed:
        return _error("the tool call is not closed with </tool_call>")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return _error(f"the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return _error('the tool call must be a JSON object with a "name"')
    if call["name"] != TOOL_NAME:
        return _error(f"unknown tool {call['name']!r}; the only tool is {TOOL_NAME!r}")
    args = call.get("arguments")
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    query = args.get("query") if isinstance(args, dict) else None
    if not isinstance(query, str) or not query.strip():
        return _error('the arguments must be a JSON object with a non-empty string "query"')
    return ToolCall(query.strip())


def parse_tool_calls(content: str) -> list[ToolCall | ToolError]:
    """Every ``<tool_call>`` block of an assistant message, in order (Hermes/Qwen3 parsing, as
    vLLM's ``hermes`` parser reads them); an unclosed block at the end is an error."""
    return [_parse_one(m.group(1).strip(), bool(m.group(2)))
            for m in TOOL_CALL_RE.finditer(content)]


# --- the template ----------------------------------------------------------------------------

# the fixed history the fallback delta is rendered after (verl's BASE_CHAT_HISTORY)
BASE_HISTORY: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."})
_PROBE_RESULT = "PROBE-TOOL-RESULT-7f3a"
_PROBE_ANSWER = "PROBE-ANSWER-7f3a"


class ToolTemplateError(ValueError):
    """A tokenizer / chat template that cannot carry the tool-call protocol."""


@dataclasses.dataclass(frozen=True)
class ToolTemplate:
    """A tokenizer's chat template with the search tool declared; ``eos_text`` is the EOS
    token that ends an assistant message in it (the policy generates it)."""

    tokenizer: Tokenizer
    eos_text: str
    tools: tuple[dict[str, Any], ...] = (SEARCH_TOOL,)

    def render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(list(messages), generation_prompt,
                                                  tools=list(self.tools))

    def delta(self, held: str, generated: str, messages: Sequence[dict[str, str]],
              new: Sequence[dict[str, str]], generation_prompt: bool) -> tuple[str, bool]:
        """The text the environment appends after an assistant message: what the template
        renders for ``messages + new`` after ``held + generated`` (the text the sequence already
        stands for). ``messages`` ends with that assistant message. Returns (text, exact):
        exact is False when the template's rendering does not start with the held text (the
        template rewrote an earlier turn, or renders the message unlike the policy wrote it);
        the text then comes from the same messages rendered after ``BASE_HISTORY``."""
        have = held + generated
        full = self.render([*messages, *new], generation_prompt)
        if full.startswith(have):
            return full[len(have):], True
        return self._base_delta(generated, new, generation_prompt), False

    def _base_delta(self, generated: str, new: Sequence[dict[str, str]],
                    generation_prompt: bool) -> str:
        """The same continuation rendered after ``BASE_HISTORY`` and a plain assistant
        message (the template cannot rewrite one without tool calls or reasoning)."""
        history = [*BASE_HISTORY, {"role": "assistant", "content": _PROBE_ANSWER}]
        ended = self.render(history, False)
        full = self.render([*history, *new], generation_prompt)
        rendered = ended.rpartition(_PROBE_ANSWER)[2]
        tail = rendered[rendered.find(self.eos_text) + len(self.eos_text):]
        if generated.endswith(self.eos_text):
            return tail + full[len(ended):]
        return self.eos_text + tail + full[len(ended):]


def _render_problem(tokenizer: Tokenizer) -> str | None:
    """Why ``tokenizer``'s template cannot declare the tool or render tool messages, or None."""
    user = [{"role": "user", "content": "Who?"}]
    plain = tokenizer.apply_chat_template(user, True)
    declared = tokenizer.apply_chat_template(user, True, tools=[SEARCH_TOOL])
    description = SEARCH_TOOL["function"]["description"]
    if declared == plain or description not in declared:
        return "its chat template ignores the tools= argument (the search tool is not declared)"
    conv = [*BASE_HISTORY, {"role": "assistant", "content": "x"},
            {"role": "tool", "content": _PROBE_RESULT}]
    if _PROBE_RESULT not in tokenizer.apply_chat_template(conv, True, tools=[SEARCH_TOOL]):
        return "its chat template does not render messages of role tool"
    return None


def tool_template(tokenizer: Tokenizer, template_file: str | None = None) -> ToolTemplate:
    """The tokenizer's template checked for the protocol, before any rollout: it exists, it
    declares ``tools=``, renders role ``tool``, and ends an assistant message with one of the
    tokenizer's EOS tokens (where generation stops). Errors name ``task.protocol`` and the
    template: the tokenizer's, or ``task.chat_template`` (``template_file``)."""
    where = ("task.protocol=tool_call: tokenizer " + tokenizer.source
             if template_file is None else
             f"task.protocol=tool_call: task.chat_template={template_file}")
    if not tokenizer.chat_template:
        raise ToolTemplateError(f"task.protocol=tool_call: tokenizer {tokenizer.source} has no "
                                f"chat template; use a model whose template declares tools "
                                f"(Qwen3, Qwen2.5, Llama 3.1) or set task.chat_template to a "
                                f"jinja file that does")
    try:
        problem = _render_problem(tokenizer)
    except Exception as e:  # jinja raises many kinds (TemplateError, TypeError, ...)
        problem = f"its chat template fails on a tool conversation ({type(e).__name__}: {e})"
    if problem is not None:
        raise ToolTemplateError(f"{where}: {problem}; set task.chat_template to a jinja file "
                                f"with tool support (for a ChatML model such as the shipped "
                                f"SmolLM2: conf/chat_templates/chatml_tools.jinja), or use "
                                f"task.protocol=search_r1")
    tail = tokenizer.apply_chat_template(
        [*BASE_HISTORY, {"role": "assistant", "content": _PROBE_ANSWER}], False,
        tools=[SEARCH_TOOL]).rpartition(_PROBE_ANSWER)[2]
    eos = sorted((tail.find(t), t) for t in (tokenizer.decode([i], skip_special_tokens=False)
                                             for i in tokenizer.eos_ids) if t and t in tail)
    if not eos:
        raise ToolTemplateError(f"{where}: its chat template ends an assistant message with "
                                f"{tail!r}, which holds none of the EOS tokens, so generation "
                                f"would not stop where a message ends")
    return ToolTemplate(tokenizer, eos_text=eos[0][1])
