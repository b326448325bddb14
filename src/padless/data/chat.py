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

A template may write text that comes from no message before the first one: SmolLM2's adds
"You are a helpful AI assistant named SmolLM, trained by Hugging Face" as a system turn to every
chat without a system message. It is found the same way for any template: the first message alone
renders as ``opening + added + own``, where ``own`` is how that message renders after a system
message and ``opening`` is what the template writes before a chat that opens with a system message
(a BOS, or nothing). ``system_prompt="template"`` keeps ``added`` (it is counted, as
``system_prompt_added``); ``"none"`` leaves it out of every rendering of the chat.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from padless.data.records import RecordError, fields_hint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TrainOn = Literal["all", "assistant", "completion"]
TRAIN_ON: tuple[str, ...] = ("all", "assistant", "completion")
TrainOnChoice = Literal["auto", "all", "assistant", "completion"]
TRAIN_ON_CHOICES: tuple[str, ...] = ("auto", *TRAIN_ON)
"""What the loaders take: ``auto`` trains the assistant turns of a chat and every token of a text."""
SystemPrompt = Literal["template", "none"]
SYSTEM_PROMPT: tuple[str, ...] = ("template", "none")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
MESSAGE_FIELDS: tuple[str, ...] = ("role", "content", "tool_calls")
CALL_FIELDS: tuple[str, ...] = ("name", "arguments")

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


def _content_text(content: Any, here: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # a list of parts, as in multimodal chat formats: only text parts can be rendered here
    if not isinstance(content, Sequence):
        raise RecordError("bad_content", f"{here}: content is a {type(content).__name__}, not a string")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise RecordError(
                "bad_content",
                f"{here}: content part {k} is a {type(part).__name__}, not an object with 'type' and 'text'",
            )
        if part.get("type", "text") != "text":
            kinds = sorted({str(p.get("type")) for p in content if isinstance(p, Mapping)})
            raise RecordError(
                "bad_content",
                f"{here}: content parts of type {kinds}; a tokenizer renders text parts only: "
                "render chats with images through the model's processor: processor=NAME (load_corpus, "
                "padless pack; 'offline' for the Qwen2-VL processor built offline), or padless' SFTTrainer "
                "with processing_class=processor",
            )
        if not isinstance(part.get("text"), str):
            raise RecordError(
                "bad_content", f"{here}: content part {k} has no 'text' string ({fields_hint(part, ('type', 'text'))})"
            )
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls: Any, role: Any, here: str) -> list[dict[str, Any]]:
    """A message's tool calls, normalised (``[]`` when it has none)."""
    if calls is None:
        return []
    if isinstance(calls, (str, Mapping)) or not isinstance(calls, Sequence):
        raise RecordError("bad_tool_call", f"{here}: 'tool_calls' is a {type(calls).__name__}, not a list of calls")
    if calls and role != "assistant":
        raise RecordError("bad_tool_call", f"{here}: only assistant messages carry tool_calls, not {role!r}")
    return [_tool_call(c, f"{here}, tool call {k}") for k, c in enumerate(calls)]


def _tool_call(call: Any, here: str) -> dict[str, Any]:
    """One call, OpenAI-style ``{"type": "function", "function": {"name", "arguments"}}`` or flat
    ``{"name", "arguments"}``, as ``{"type": "function", "function": {"name", "arguments": dict}}``."""
    if not isinstance(call, Mapping):
        raise RecordError("bad_tool_call", f"{here} is a {type(call).__name__}, not an object with a 'function'")
    fn = call.get("function", call)
    if not isinstance(fn, Mapping):
        raise RecordError(
            "bad_tool_call", f"{here}: 'function' is a {type(fn).__name__}, not an object with 'name' and 'arguments'"
        )
    name = fn.get("name")
    if name is None:
        raise RecordError("bad_tool_call", f"{here} has no function 'name' ({fields_hint(fn, CALL_FIELDS)})")
    if not isinstance(name, str) or not name.strip():
        raise RecordError("bad_tool_call", f"{here}: the function name is {name!r}, not a non-empty string")
    if "arguments" not in fn and set(fn) - {"name", "type"}:  # a misspelt or foreign key, not "no arguments"
        raise RecordError("bad_tool_call", f"{here} ({name!r}) has no 'arguments' ({fields_hint(fn, CALL_FIELDS)})")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # the OpenAI wire format carries arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            raise RecordError(
                "bad_tool_call", f"{here} ({name!r}): arguments are not valid JSON ({err.msg}): {args!r:.80}"
            ) from None
    if not isinstance(args, Mapping):
        raise RecordError("bad_tool_call", f"{here} ({name!r}): arguments are a {type(args).__name__}, not an object")
    return {"type": "function", "function": {"name": name, "arguments": dict(args)}}


def check_messages(messages: Any, at: str) -> list[dict[str, Any]]:
    """Validated, normalised copies of a chat's messages (the chat is named ``at``, e.g. ``"line 3"``):
    known roles, string content, well-formed tool calls (assistant only), no empty turn. Raises
    :class:`RecordError` naming the message and the field."""
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        raise RecordError("bad_messages", f"{at}: 'messages' is a {type(messages).__name__}, not a list of messages")
    if not messages:
        raise RecordError("bad_messages", f"{at}: 'messages' is an empty list")
    out = []
    for j, msg in enumerate(messages):
        here = f"{at}: message {j}"
        if not isinstance(msg, Mapping):
            raise RecordError(
                "bad_messages", f"{here} is a {type(msg).__name__}, not an object with 'role' and 'content'"
            )
        if "role" not in msg:
            raise RecordError("missing_field", f"{here} has no 'role' ({fields_hint(msg, MESSAGE_FIELDS)})")
        role = msg["role"]
        if role not in ROLES:
            raise RecordError("unknown_role", f"{here}: unknown role {role!r}; the roles are {', '.join(ROLES)}")
        calls = _tool_calls(msg.get("tool_calls"), role, here)
        if "content" not in msg and not calls:
            raise RecordError("missing_field", f"{here} has no 'content' ({fields_hint(msg, MESSAGE_FIELDS)})")
        content = _content_text(msg.get("content"), here)
        if not content.strip() and not calls:
            raise RecordError("empty", f"{here}: empty {role} message")
        norm: dict[str, Any] = {"role": role, "content": content}
        if calls:
            norm["tool_calls"] = calls
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


def _targets(messages: list[dict[str, Any]], train_on: str, at: str) -> list[bool]:
    """Which messages' bodies are targets."""
    is_assistant = [m["role"] == "assistant" for m in messages]
    if train_on == "all":
        return [True] * len(messages)
    if not any(is_assistant):
        raise RecordError(
            "no_assistant_turn", f"{at}: train_on={train_on!r} needs an assistant turn; the chat has none"
        )
    if train_on == "assistant":
        return is_assistant
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    targets = [a and i > last_user for i, a in enumerate(is_assistant)]
    if not any(targets):
        raise RecordError(
            "no_assistant_turn", f"{at}: train_on='completion' needs an assistant turn after the last user turn"
        )
    return targets


def _render(
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    conversations: list[list[dict[str, Any]]],
    generation: bool = False,
) -> list[str]:
    if not conversations:
        return []
    out = tokenizer.apply_chat_template(
        conversations, tokenize=False, add_generation_prompt=generation, chat_template=template
    )
    return list(out)


_PROBE = {"role": "system", "content": "padless probe"}


@functools.lru_cache(maxsize=16)
def _opening(tokenizer: PreTrainedTokenizerBase, template: str) -> tuple[str | None, str | None]:
    """``(opening, probe)``: what the template writes before a chat whose first message is a system
    message (a BOS, or nothing), None if that cannot be told (it renders a second system message
    unlike the first); and the rendering of a one-message probe chat (None if the template refuses it)."""
    from jinja2.exceptions import TemplateError

    try:
        one, two = _render(tokenizer, template, [[_PROBE], [_PROBE, _PROBE]])
    except TemplateError:
        return None, None
    own = two[len(one) :] if two.startswith(one) else ""
    return (one[: len(one) - len(own)] if own and one.endswith(own) else None), one


def _render_probed(
    tokenizer: PreTrainedTokenizerBase, template: str, conversations: list[list[dict[str, Any]]]
) -> tuple[list[str], str | None]:
    """The renderings of ``conversations`` and, in the same call, of the probe system message followed
    by the first conversation's first message (None if the template refuses that)."""
    from jinja2.exceptions import TemplateError

    try:
        *out, after = _render(tokenizer, template, [*conversations, [_PROBE, conversations[0][0]]])
    except TemplateError:
        return _render(tokenizer, template, conversations), None
    return out, after


def _before_first(alone: str, after: str | None, opening: str | None, probe: str | None) -> tuple[str | None, str]:
    """``(opening, added)``: the text the template writes before the first message (whose rendering
    alone is ``alone``) is its opening (:func:`_opening`) followed by ``added``, text that comes from
    no message: a default system prompt. ``opening`` is None where the two cannot be told apart.

    The message's own rendering is how it renders after the probe system message (``after``): for a
    template that adds a system prompt only to chats without one (SmolLM2's), that carries none."""
    own = after[len(probe) :] if after is not None and probe is not None and after.startswith(probe) else ""
    if not own or not alone.endswith(own):
        return None, ""
    before = alone[: len(alone) - len(own)]
    if opening is not None and before.startswith(opening):
        return opening, before[len(opening) :]
    return None, before


def render_chat(
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    train_on: str = "assistant",
    chat_template: str | None = None,
    at: str = "chat",
    system_prompt: str = "template",
    trained_from: int = 0,
) -> tuple[list[ChatSpan], bool]:
    """``(pieces, system prompt added)``: the rendering of a checked chat (see :func:`check_messages`)
    as consecutive pieces whose concatenation is the full rendering, ``(text, trained)`` each (empty
    pieces dropped), and whether it carries a system prompt the template added (kept only with
    ``system_prompt="template"``; ``"none"`` leaves it out). ``at`` names the chat in errors.
    ``trained_from``: messages before it are context, never trained (the prompt of a prompt / completion
    record, :class:`padless.data.formats.Document`)."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r} is not one of {', '.join(TRAIN_ON)}")
    if system_prompt not in SYSTEM_PROMPT:
        raise ValueError(f"system_prompt={system_prompt!r} is not one of {', '.join(SYSTEM_PROMPT)}")
    template = chat_template_for(tokenizer, chat_template)
    if "tool_calls" not in template:
        messages = _inline_tool_calls(messages)
    targets = _targets(messages, train_on, at)
    if trained_from:
        targets = [t and i >= trained_from for i, t in enumerate(targets)]
        if not any(targets):
            raise RecordError("no_assistant_turn", f"{at}: the completion holds no assistant turn to train")
    n = len(messages)
    # One batched render for every prefix (or, for "all", the chat and its first message alone).
    conversations = [messages[:1], messages] if train_on == "all" else [messages[: i + 1] for i in range(n)]
    rendered, probed = _render_probed(tokenizer, template, conversations)
    opening, added = _before_first(rendered[0], probed, *_opening(tokenizer, template))
    added = added if added.strip() else ""
    if added and system_prompt == "none" and opening is None:
        raise ValueError(
            f"{at}: the chat template writes {added[:60]!r} before the first message, and what of it "
            "is a system prompt cannot be told from what it writes before every chat; use "
            "system_prompt='template' or give the chat a system message"
        )
    cut = len(opening or "")

    def kept(text: str) -> str:
        """``text`` without the added system prompt where it is left out."""
        if not added or system_prompt == "template":
            return text
        if text[cut : cut + len(added)] != added:
            raise ValueError(
                f"{at}: the chat template is not prefix-stable: a rendering does not start with the "
                f"system prompt it adds, so system_prompt='none' cannot leave it out"
            )
        return text[:cut] + text[cut + len(added) :]

    carries = bool(added) and system_prompt == "template"
    if train_on == "all":
        return [(kept(rendered[1]), True)], carries
    prefixes = [""] + [kept(r) for r in rendered]
    asked = [i for i in range(n) if targets[i]]
    if asked and asked[0] == 0:  # no header can be found by prefix: render([]) is not allowed
        raise RecordError(
            "assistant_first",
            f"{at}: the chat opens with an assistant turn, whose header "
            "cannot be found by prefix; start with a system or user turn (or use train_on='all')",
        )
    headers = dict(zip(asked, map(kept, _render(tokenizer, template, [messages[:i] for i in asked], True))))
    pieces: list[ChatSpan] = []
    for i in range(n):
        before, after = prefixes[i], prefixes[i + 1]
        if not after.startswith(before):
            raise ValueError(
                f"{at}: the chat template is not prefix-stable at message {i}: rendering "
                f"messages[:{i + 1}] does not extend messages[:{i}], so labels cannot be assigned; "
                f"use train_on='all' or another chat_template"
            )
        if not targets[i]:
            pieces.append((after[len(before) :], False))
            continue
        head = headers[i]
        if not (head.startswith(before) and after.startswith(head)):
            raise ValueError(
                f"{at}: the chat template's generation prompt is not a prefix of assistant "
                f"message {i}, so its header cannot be masked; use train_on='all' or another "
                "chat_template"
            )
        pieces += [(head[len(before) :], False), (after[len(head) :], True)]
    return [p for p in pieces if p[0]], carries


def chat_pieces(
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    train_on: str = "assistant",
    chat_template: str | None = None,
    at: str = "chat",
    system_prompt: str = "template",
) -> list[ChatSpan]:
    """The pieces of :func:`render_chat`: ``(text, trained)`` whose concatenation is the rendering."""
    return render_chat(messages, tokenizer, train_on, chat_template, at, system_prompt)[0]
