"""The forms a training record comes in, detected and named, each reduced to one :class:`Document`.

Every reader of records (``load_corpus``, ``padless stats``, ``padless pack``, padless' ``SFTTrainer``)
reads a record through :func:`read_document`: the first form whose fields it has, in this order
(:data:`FORMATS`, whose values are the names printed):

- ``input_ids``: pre-tokenized ids, optional ``labels``;
- ``messages``: a chat, ``[{"role", "content", "tool_calls"?}]`` (:mod:`padless.data.chat`);
- ``sharegpt``: ``conversations``, ``[{"from", "value"}]``, ``from`` one of :data:`SHAREGPT_ROLES`
  (``human`` -> user, ``gpt`` -> assistant, ``system``, ``function_call`` -> an assistant tool call whose
  ``value`` is the JSON call, ``observation`` -> a tool result), with optional ``system`` and ``tools``
  fields (LLaMA-Factory's);
- ``conversational_prompt_completion`` / ``prompt_completion``: TRL's ``prompt`` and ``completion``, both
  lists of messages or both strings;
- ``alpaca``: ``instruction``, optional ``input``, ``output`` (optional ``system`` and ``history``, a list
  of ``[question, answer]`` pairs): the user turn is the instruction, a blank line and the input;
- ``text``: plain text.

A record's ``prompt`` part (the prompt of a prompt / completion record, all but Alpaca's ``output``) is
the context: ``train_on="auto"`` trains only the completion. ``columns`` (``{"instruction": "question"}``,
``--columns instruction=question``) renames the record's own fields to these before anything is read.
Errors are :class:`~padless.data.records.RecordError` naming the record, the field and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from padless.data.records import RecordError, fields_hint, record_field

FORMATS: dict[str, str] = {
    "input_ids": "pre-tokenized ('input_ids')",
    "messages": "chats ('messages')",
    "sharegpt": "ShareGPT chats ('conversations' of 'from' / 'value')",
    "conversational_prompt_completion": "TRL conversational prompt / completion (lists of messages)",
    "prompt_completion": "TRL prompt / completion (text)",
    "alpaca": "Alpaca ('instruction' / 'input' / 'output')",
    "text": "text ('text')",
}
"""Every form, in the order it is looked for -> the name printed for it."""
COLUMN_NAMES: tuple[str, ...] = (
    "input_ids", "labels", "messages", "conversations", "prompt", "completion", "instruction", "input", "output",
    "system", "history", "tools", "text",
)  # fmt: skip
"""The fields a ``columns`` mapping may map a record's own field to."""
SHAREGPT_ROLES: dict[str, str] = {
    "human": "user", "gpt": "assistant", "system": "system", "function_call": "assistant", "observation": "tool",
    "user": "user", "assistant": "assistant", "tool": "tool",
}  # fmt: skip
"""ShareGPT's ``from`` -> the role of the message (the OpenAI names are taken as they are)."""
_MAP_HINT = "a field of another name is mapped with --columns {ex} (padless stats, pack; load_corpus(columns={py}))"


class Document(NamedTuple):
    """One record, read: what it was and what it is to render."""

    format: str
    """Its form, a key of :data:`FORMATS`."""
    kind: str
    """``tokens`` (``value``: the record), ``text`` (a str), ``chat`` (a list of messages, not yet
    checked: :func:`padless.data.chat.check_messages`) or ``prompt_completion`` (``(prompt, completion)`` strs)."""
    value: Any
    prompt_messages: int = 0
    """A chat's messages before its completion (prompt / completion records, Alpaca): context that
    ``train_on="auto"`` leaves untrained; 0 for a plain chat."""


def parse_columns(spec: Mapping[str, str] | Iterable[str] | str | None) -> tuple[tuple[str, str], ...]:
    """``(padless name, record's field)`` pairs from ``{"instruction": "question"}``, ``"a=b,c=d"`` or
    ``["a=b", "c=d"]``; each padless name must be one of :data:`COLUMN_NAMES`, each at most once."""
    if spec is None:
        return ()
    if isinstance(spec, str):
        spec = [s for s in spec.split(",") if s.strip()]
    if isinstance(spec, Mapping):
        pairs = [(str(k), str(v)) for k, v in spec.items()]
    else:
        pairs = []
        for item in spec:
            if isinstance(item, (tuple, list)) and len(item) == 2:
                pairs.append((str(item[0]), str(item[1])))
                continue
            name, eq, field = str(item).partition("=")
            if not eq or not name.strip() or not field.strip():
                raise ValueError(f"columns: {item!r} is not NAME=FIELD (e.g. instruction=question)")
            pairs.append((name.strip(), field.strip()))
    seen: set[str] = set()
    for name, _ in pairs:
        if name not in COLUMN_NAMES:
            close = difflib.get_close_matches(name, COLUMN_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"columns: {name!r} is not a field padless reads ({', '.join(COLUMN_NAMES)}){hint}")
        if name in seen:
            raise ValueError(f"columns: {name!r} is mapped twice")
        seen.add(name)
    return tuple(pairs)


def map_columns(record: Any, columns: Sequence[tuple[str, str]], at: str) -> Any:
    """``record`` with each mapped field renamed to its padless name (a record without the field raises,
    naming it)."""
    if not columns or not isinstance(record, Mapping):
        return record
    out = dict(record)
    for name, field in columns:
        if field not in record:
            raise RecordError(
                "missing_field",
                f"{at}: no {field!r} field, which the columns mapping reads as {name!r} ({fields_hint(record, [field])})",
            )
        out[name] = out.pop(field)
    return out


def _has(record: Mapping[str, Any], name: str) -> bool:
    return record.get(name) is not None


def record_format(record: Any, at: str, field: str | None = None) -> str:
    """The form of ``record`` (named ``at``): a key of :data:`FORMATS`. ``field`` (``text`` | ``messages``
    | ``input_ids``) forces that one."""
    if field is not None or not isinstance(record, Mapping):
        return record_field(record, at, field)
    if _has(record, "input_ids"):
        return "input_ids"
    if _has(record, "messages"):
        return "messages"
    if _has(record, "conversations"):
        return "sharegpt"
    if _has(record, "prompt") or _has(record, "completion"):
        prompt, completion = record.get("prompt"), record.get("completion")
        return "conversational_prompt_completion" if isinstance(prompt or completion, list) else "prompt_completion"
    if _has(record, "instruction") or _has(record, "output"):
        return "alpaca"
    if _has(record, "text"):
        return "text"
    null = [n for n in ("input_ids", "messages", "text") if n in record]
    if null:
        return record_field(record, at)  # raises: a null field
    wanted = ("text", "messages", "input_ids", "conversations", "prompt", "completion", "instruction", "output")
    raise RecordError(
        "missing_field",
        f"{at}: no 'text', 'messages' or 'input_ids' field ({fields_hint(record, wanted)}), nor ShareGPT's "
        "'conversations', TRL's 'prompt' / 'completion' or Alpaca's 'instruction' / 'output'; "
        + _MAP_HINT.format(ex="text=NAME", py="{'text': 'NAME'}"),
    )


def read_document(
    record: Any, at: str, *, columns: Sequence[tuple[str, str]] = (), field: str | None = None
) -> Document:
    """``record`` (named ``at``, e.g. ``"d.jsonl, line 3"``) read as a :class:`Document`, its fields
    renamed by ``columns`` first. Raises :class:`RecordError` naming the field and the fix."""
    record = map_columns(record, columns, at)
    form = record_format(record, at, field)
    if form == "input_ids":
        return Document(form, "tokens", record)
    if form == "messages":
        return Document(form, "chat", record["messages"])
    if form == "text":
        return Document(form, "text", record["text"])
    if form == "sharegpt":
        return Document(form, "chat", sharegpt_messages(record, at))
    if form == "alpaca":
        messages = alpaca_messages(record, at)
        return Document(form, "chat", messages, len(messages) - 1)
    prompt, completion = record.get("prompt"), record.get("completion")
    for have, need in (("prompt", "completion"), ("completion", "prompt")):
        if record.get(need) is None:
            raise RecordError(
                "missing_field",
                f"{at}: {have!r} without {need!r} ({fields_hint(record, [need])}); a TRL prompt / completion record "
                f"needs both; " + _MAP_HINT.format(ex=f"{need}=NAME", py=f"{{{need!r}: 'NAME'}}"),
            )
    if form == "prompt_completion":
        for name, value in (("prompt", prompt), ("completion", completion)):
            if not isinstance(value, str):
                raise RecordError(
                    "bad_type",
                    f"{at}: 'prompt' is a {type(prompt).__name__} and 'completion' a {type(completion).__name__}: "
                    "both strings (prompt / completion) or both lists of messages (conversational)",
                )
        if not completion.strip():
            raise RecordError("empty", f"{at}: 'completion' is empty; it is what is trained")
        return Document(form, "prompt_completion", (prompt, completion))
    if not (isinstance(prompt, list) and isinstance(completion, list)):
        raise RecordError(
            "bad_type",
            f"{at}: 'prompt' is a {type(prompt).__name__} and 'completion' a {type(completion).__name__}: "
            "both lists of messages (conversational) or both strings",
        )
    if not completion:
        raise RecordError("empty", f"{at}: 'completion' is an empty list; it holds the messages trained")
    return Document(form, "chat", [*prompt, *completion], len(prompt))


def _string(record: Mapping[str, Any], name: str, at: str, *, required: bool, form: str) -> str:
    value = record.get(name)
    if value is None:
        if not required:
            return ""
        raise RecordError(
            "missing_field",
            f"{at}: an {form} record has no {name!r} ({fields_hint(record, [name])}); add it, or "
            + _MAP_HINT.format(ex=f"{name}=NAME", py=f"{{{name!r}: 'NAME'}}"),
        )
    if not isinstance(value, str):
        raise RecordError("bad_type", f"{at}: {name!r} is a {type(value).__name__}, not a string")
    if required and not value.strip():
        raise RecordError("empty", f"{at}: {name!r} is empty")
    return value


def alpaca_messages(record: Mapping[str, Any], at: str) -> list[dict[str, Any]]:
    """An Alpaca record as a chat: ``system``?, each ``history`` pair (user, assistant), the user turn
    (``instruction``, then a blank line and ``input`` if any) and the assistant's ``output`` (last)."""
    form = "Alpaca (instruction / input / output)"
    instruction = _string(record, "instruction", at, required=True, form=form)
    output = _string(record, "output", at, required=True, form=form)
    given = _string(record, "input", at, required=False, form=form)
    system = _string(record, "system", at, required=False, form=form)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system.strip() else []
    history = record.get("history") or []
    if not isinstance(history, list):
        raise RecordError(
            "bad_type", f"{at}: 'history' is a {type(history).__name__}, not a list of [question, answer]"
        )
    for k, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise RecordError("bad_type", f"{at}: history {k} is not a [question, answer] pair of strings")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    prompt = f"{instruction}\n\n{given}" if given.strip() else instruction
    return [*messages, {"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def _calls(value: Any, here: str) -> list[Any]:
    """A ``function_call`` turn's value (a JSON call or list of calls, or the object itself) as calls."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RecordError(
                "bad_tool_call",
                f'{here}: a function_call \'value\' is a JSON call {{"name": ..., "arguments": {{...}}}}; this one is '
                f"not JSON ({err.msg}): {value!r:.80}",
            ) from None
    return list(value) if isinstance(value, list) else [value]


def sharegpt_messages(record: Mapping[str, Any], at: str) -> list[dict[str, Any]]:
    """A ShareGPT record's ``conversations`` as messages (roles by :data:`SHAREGPT_ROLES`; a turn that
    already has ``role`` / ``content`` is taken as it is), after its ``system`` and ``tools`` fields."""
    from padless.data.raw import schema_system_turn

    turns = record["conversations"]
    if isinstance(turns, str) or not isinstance(turns, Sequence):
        raise RecordError("bad_messages", f"{at}: 'conversations' is a {type(turns).__name__}, not a list of turns")
    system = _string(record, "system", at, required=False, form="ShareGPT")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system.strip() else []
    for j, turn in enumerate(turns):
        here = f"{at}: conversations turn {j}"
        if not isinstance(turn, Mapping):
            raise RecordError(
                "bad_messages", f"{here} is a {type(turn).__name__}, not an object with 'from' and 'value'"
            )
        if "from" not in turn and "role" in turn:
            messages.append(dict(turn))
            continue
        if "from" not in turn or "value" not in turn:
            need = "from" if "from" not in turn else "value"
            raise RecordError("missing_field", f"{here} has no {need!r} ({fields_hint(turn, ('from', 'value'))})")
        who = turn["from"]
        if who not in SHAREGPT_ROLES:
            close = difflib.get_close_matches(str(who), SHAREGPT_ROLES, n=1, cutoff=0.6)
            raise RecordError(
                "unknown_role",
                f"{here}: unknown 'from' value {who!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + "; ShareGPT's are human, gpt, system, function_call and observation (or user, assistant, tool): "
                "write one of them",
            )
        if who == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": _calls(turn["value"], here)})
        else:
            messages.append({"role": SHAREGPT_ROLES[who], "content": turn["value"]})
    tools = record.get("tools")
    if tools:
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as err:
                raise RecordError("bad_type", f"{at}: 'tools' is a string that is not JSON ({err.msg})") from None
        messages = schema_system_turn(tools if isinstance(tools, list) else [tools], messages)
    return messages
