"""The search environment in the model's own tool-call format (``task.protocol=tool_call``).

The rollout machinery (chunked decoding, continuation from the KV cache, budgets) is
:class:`~rl.tasks.search.env.SearchEnv`'s; what differs is the protocol
(``rl.tasks.search.tool_call``):

* the prompt is the chat template's rendering with the search tool declared (``tools=``);
* a turn is one assistant message: generation stops at the EOS token that ends a message in the
  template (no stop strings); a turn cut by its token budget ends the trajectory ("length");
* a message with ``<tool_call>`` blocks: each well-formed call of ``search`` is retrieved, each
  bad one (not JSON, unknown tool, no query, unclosed) gets an error message instead (counted in
  ``invalid_actions``); all go back as ``tool`` messages in the calls' order;
* a message without a tool call is the final one (``finish="answer"`` when it has an
  ``<answer>`` block, else "eos"); after ``max_turns`` messages with tool calls, the next
  message is final whatever it holds;
* the environment's tokens after each message are the template's rendering of what follows it
  (``ToolTemplate.delta``), loss mask 0: the end of the message, the tool messages, the next
  generation prompt; after the final message, its end. The policy's tokens (mask 1) include the
  EOS token it ended the message with.

``info`` holds the conversation (``messages``, the assistant contents as generated) and
``template_mismatches``, the turns whose continuation was not the template's own rendering of
this conversation (0 for a prefix-stable template).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from core.search_r1 import extract_answer
from core.types import Prompt
from rl.tasks.search.corpus import Doc, render_docs
from rl.tasks.search.env import SearchEnv, _Decoding, _Row
from rl.tasks.search.faults import SEARCH_FAILED
from rl.tasks.search.tool_call import (
    ToolCall,
    ToolError,
    ToolTemplate,
    parse_tool_calls,
    tool_template,
)

Message = dict[str, str]


@dataclasses.dataclass
class _ToolRow(_Row):
    messages: list[Message] = dataclasses.field(default_factory=list)
    held: str = ""  # the text the row's tokens stand for (prompt + response so far)
    generated: str = ""  # the latest assistant turn's text, EOS included
    pending: list[ToolCall | ToolError] = dataclasses.field(default_factory=list)
    mismatches: int = 0


@dataclasses.dataclass(frozen=True)
class ToolCallSearchEnv(SearchEnv):
    """SearchEnv speaking the tool-call protocol; ``template`` defaults to the tokenizer's
    (checked by ``rl.tasks.search.tool_call.tool_template``, which names ``task.protocol``)."""

    template: ToolTemplate | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.template is None:
            object.__setattr__(self, "template", tool_template(self.tokenizer))

    @property
    def _template(self) -> ToolTemplate:
        assert self.template is not None  # set in __post_init__
        return self.template

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.tokenizer.encode(self._template.render(list(prompt.messages), True))

    def _new_row(self, prompt: Prompt, prompt_tokens: list[int]) -> _Row:
        messages = [dict(m) for m in prompt.messages]
        return _ToolRow(prompt_tokens, messages=messages,
                        held=self._template.render(messages, True))

    def _stop_strings(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (), ()  # a message ends with its EOS token

    def _observation_bound(self) -> int:
        """One tool message's documents and the template around it (a turn with several
        calls appends more; its chunk reads through a wider program)."""
        return self.max_obs_tokens + 64

    def _act(self, r: _Row, turn: list[int], text: str, finish: str, final: bool,
             decoding: _Decoding) -> list[str] | None:
        assert isinstance(r, _ToolRow)
        if finish != "eos":  # the message was cut by a budget: it has no end to render
            r.done, r.finish = True, "length"
            return None
        generated = self.tokenizer.decode(turn, skip_special_tokens=False)
        eos = self._template.eos_text
        content = generated[:-len(eos)] if generated.endswith(eos) else generated
        r.messages.append({"role": "assistant", "content": content})
        calls = parse_tool_calls(content)
        if not calls or final:
            r.done, r.finish = True, "answer" if extract_answer(content) is not None else "eos"
            self._extend(r, generated, [], generation_prompt=False)
            return None
        r.generated, r.pending = generated, calls
        r.invalid += sum(isinstance(c, ToolError) for c in calls)
        queries = [c.query for c in calls if isinstance(c, ToolCall)]
        r.searches += len(queries)
        return queries

    def _append_observation(self, row: _Row, results: Sequence[list[Doc] | None]) -> None:
        assert isinstance(row, _ToolRow)
        found = iter(results)
        tool_messages = [
            {"role": "tool", "content": self._result_text(next(found))
             if isinstance(c, ToolCall) else c.message} for c in row.pending]
        self._extend(row, row.generated, tool_messages, generation_prompt=True)
        row.pending = []

    def _result_text(self, docs: list[Doc] | None) -> str:
        """A tool message's content: the documents (``max_obs_tokens`` of them at most)."""
        text = SEARCH_FAILED if docs is None else render_docs(docs, self.quote_titles).strip()
        ids = self.tokenizer.encode(text)
        if len(ids) > self.max_obs_tokens:
            text = self.tokenizer.decode(ids[:self.max_obs_tokens]) + " ..."
        return text

    def _extend(self, r: _ToolRow, generated: str, new: list[Message],
                generation_prompt: bool) -> None:
        """Append what the template renders after the latest assistant message (mask 0)."""
        delta, exact = self._template.delta(r.held, generated, r.messages, new,
                                            generation_prompt)
        r.messages += new
        r.held += generated + delta
        r.mismatches += int(not exact)
        r.add(self.tokenizer.encode(delta), action=False)

    def _texts(self, rows: list[_Row]) -> list[str]:
        """The response as the model saw it: special tokens kept (``<|im_end|>`` etc.)."""
        return self.tokenizer.decode_batch([r.tokens for r in rows], skip_special_tokens=False)

    def _info(self, r: _Row) -> dict[str, Any]:
        assert isinstance(r, _ToolRow)
        return super()._info(r) | {"template_mismatches": r.mismatches,
                                   "messages": tuple(dict(m) for m in r.messages)}
