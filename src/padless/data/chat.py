"""Chats and agent traces -> rendered text split into pieces, each marked trained or not.

Messages follow the OpenAI / Hugging Face format::

    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "tool_calls": [{"type": "function", "function": {"name": str, "arguments": dict | JSON str}}]}

Rendering uses the tokenizer's own chat template when it has one (SmolLM2's ChatML), else
:data:`DEFAULT_CHAT_TEMPLATE` (GPT-2 has none), a plain ChatML::

    <|im_start|>user
    What is AI?<|im_end|>
    <|im_start|>assistant
    The branch of engineering that builds machines that think.<|im_end|>

A template that does not mention ``tool_calls`` (both of the above) gets the calls written into the
assistant's content, one Hermes-style block per call::

    <tool_call>
    {"name": "search", "arguments": {"query": "vader"}}
    </tool_call>

and tool results are ``tool`` turns. The labels (``train_on``):

- ``all``: every token is a target;
- ``assistant``: the body of every assistant turn (its text, tool calls and end-of-turn marker) is a
  target; system, user and tool turns and each assistant header (``<|im_start|>assistant\\n``) are not;
- ``completion``: only the assistant turns after the last user turn (the reply to the final prompt,
  tool calls included; tool results inside it are still masked).

How the pieces are found, for any template: rendering ``messages[:i]`` must be a prefix of rendering
``messages[:i+1]`` (the difference is message ``i``), and for an assistant turn the rendering of
``messages[:i]`` with ``add_generation_prompt=True`` must be a prefix too (the difference is the
header). A template that breaks this raises ``ValueError`` rather than guessing a mask. Each piece is
then tokenized on its own, so a label never straddles a turn boundary (see :mod:`padless.data.encode`
for the check against tokenizing the whole text at once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from padless.data.records import RecordError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TrainOn = Literal["all", "assistant", "completion"]
TRAIN_ON: tuple[str, ...] = ("all", "assistant", "completion")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML without a default system prompt; used when the tokenizer has no chat template."""

ChatSpan = tuple[str, bool]
"""A stretch of rendered text and whether its tokens are targets (not a row piece: see
:data:`padless.layout.Piece`)."""


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # a list of parts, as in multimodal chat formats: only text parts can be rendered here
    if isinstance(content, Sequence) and all(isinstance(p, Mapping) for p in content):
        if any(p.get("type", "text") != "text" for p in content):
            kinds = sorted({str(p.get("type")) for p in content})
            raise RecordError("bad_content", f"{where}: content parts of type {kinds}; only text parts are supported")
        return "".join(str(p.get("text", "")) for p in content)
    raise RecordError("bad_content", f"{where}: content is a {type(content).__name__}, not a string")


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """One call as ``{"type": "function", "function": {"name", "arguments": dict}}``."""
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise RecordError("bad_tool_call", f"{where}: a tool call needs a function name, got {call!r:.80}")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # the OpenAI wire format carries arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise RecordError("bad_tool_call",
                              f"{where}: arguments of {name!r} are not valid JSON: {args!r:.80}") from None
    if not isinstance(args, Mapping):
        raise RecordError("bad_tool_call", f"{where}: arguments of {name!r} are a {type(args).__name__}, not an object")
    return {"type": "function", "function": {"name": name, "arguments": dict(args)}}


def check_messages(messages: Any, index: int) -> list[dict[str, Any]]:
    """Validated, normalised copies of a chat's messages: known roles, string content, well-formed tool
    calls (assistant only), no empty turn. Raises :class:`RecordError` naming record and message."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise RecordError("bad_messages", f"record {index}: 'messages' must be a non-empty list of messages")
    out = []
    for j, msg in enumerate(messages):
        where = f"record {index}, message {j}"
        if not isinstance(msg, Mapping):
            raise RecordError("bad_messages", f"{where}: a message must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if role not in ROLES:
            raise RecordError("unknown_role", f"{where}: unknown role {role!r}; expected one of {', '.join(ROLES)}")
        content = _content_text(msg.get("content"), where)
        calls = msg.get("tool_calls") or []
        if calls and role != "assistant":
            raise RecordError("bad_tool_call", f"{where}: only assistant messages carry tool_calls, not {role!r}")
        if not content.strip() and not calls:
            raise RecordError("empty", f"{where}: empty {role} message")
        norm: dict[str, Any] = {"role": role, "content": content}
        if calls:
            norm["tool_calls"] = [_tool_call(c, where) for c in calls]
        out.append(norm)
    return out


def tool_call_text(call: Mapping[str, Any]) -> str:
    """The Hermes-style block a tool call is written as when the template cannot render calls."""
    fn = call["function"]
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _inline_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for msg in messages:
        if "tool_calls" in msg:
            blocks = [tool_call_text(c) for c in msg["tool_calls"]]
            text = "\n".join(([msg["content"]] if msg["content"].strip() else []) + blocks)
            msg = {"role": msg["role"], "content": text}
        out.append(msg)
    return out


def chat_template_for(tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None) -> str:
    """The template used: the explicit one, else the tokenizer's, else :data:`DEFAULT_CHAT_TEMPLATE`."""
    if chat_template is not None:
        return chat_template
    own = getattr(tokenizer, "chat_template", None)
    return own if isinstance(own, str) and own else DEFAULT_CHAT_TEMPLATE


def _targets(messages: list[dict[str, Any]], train_on: str, index: int) -> list[bool]:
    """Which messages' bodies are targets."""
    is_assistant = [m["role"] == "assistant" for m in messages]
    if train_on == "all":
        return [True] * len(messages)
    if not any(is_assistant):
        raise RecordError("no_assistant_turn", f"record {index}: train_on={train_on!r} needs an assistant turn; "
                          "the chat has none")
    if train_on == "assistant":
        return is_assistant
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    targets = [a and i > last_user for i, a in enumerate(is_assistant)]
    if not any(targets):
        raise RecordError("no_assistant_turn", f"record {index}: train_on='completion' needs an assistant turn "
                          "after the last user turn")
    return targets


def chat_pieces(
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    train_on: str = "assistant",
    chat_template: str | None = None,
    index: int = 0,
) -> list[ChatSpan]:
    """The rendering of a checked chat (see :func:`check_messages`) as consecutive pieces whose
    concatenation is the full rendering; ``(text, trained)`` for each. Empty pieces are dropped."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r} is not one of {', '.join(TRAIN_ON)}")
    template = chat_template_for(tokenizer, chat_template)
    if "tool_calls" not in template:
        messages = _inline_tool_calls(messages)
    targets = _targets(messages, train_on, index)

    def render(conversations: list[list[dict[str, Any]]], generation: bool) -> list[str]:
        if not conversations:
            return []
        out = tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=generation, chat_template=template
        )
        return list(out)

    n = len(messages)
    if train_on == "all":
        return [(render([messages], False)[0], True)]
    # One batched render for every prefix, one for every assistant prefix with the generation header.
    prefixes = [""] + render([messages[: i + 1] for i in range(n)], False)
    asked = [i for i in range(n) if targets[i]]
    if asked and asked[0] == 0:  # no header can be found by prefix: render([]) is not allowed
        raise RecordError("assistant_first", f"record {index}: the chat opens with an assistant turn, whose header "
                          "cannot be found by prefix; start with a system or user turn (or use train_on='all')")
    headers = dict(zip(asked, render([messages[:i] for i in asked], True)))
    pieces: list[ChatSpan] = []
    for i in range(n):
        before, after = prefixes[i], prefixes[i + 1]
        if not after.startswith(before):
            raise ValueError(f"record {index}: the chat template is not prefix-stable at message {i}: rendering "
                             f"messages[:{i + 1}] does not extend messages[:{i}], so labels cannot be assigned; "
                             f"use train_on='all' or another chat_template")
        if not targets[i]:
            pieces.append((after[len(before):], False))
            continue
        head = headers[i]
        if not (head.startswith(before) and after.startswith(head)):
            raise ValueError(f"record {index}: the chat template's generation prompt is not a prefix of assistant "
                             f"message {i}, so its header cannot be masked; use train_on='all' or another "
                             "chat_template")
        pieces += [(head[len(before):], False), (after[len(head):], True)]
    return [p for p in pieces if p[0]]
