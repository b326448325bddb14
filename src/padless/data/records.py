"""The three kinds of training record every source is reduced to, and the error a bad record raises.

A record is a dict with one of these fields (checked in this order):

- ``input_ids``: pre-tokenized ids, optionally with ``labels`` of the same length;
- ``messages``: a chat, a list of ``{"role", "content", "tool_calls"?}`` (see :mod:`padless.data.chat`);
- ``text``: plain text, every token trained.

A record that cannot be used raises :class:`RecordError`, whose ``reason`` is the key under which a
skip is counted when the caller chose ``on_error="skip"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

RecordKind = Literal["tokens", "messages", "text"]
RECORD_FIELDS: tuple[str, ...] = ("input_ids", "messages", "text")
"""Fields that make a record, in the order they are looked for."""
_KIND_OF_FIELD: dict[str, RecordKind] = {"input_ids": "tokens", "messages": "messages", "text": "text"}


class RecordError(ValueError):
    """A record that cannot be used; ``reason`` names the kind of problem (the skip counter's key)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        """Short key such as ``"empty"``, ``"unknown_role"``, ``"missing_field"``."""


def record_kind(record: Any, index: int, field: str | None = None) -> RecordKind:
    """Which kind ``record`` is: the forced ``field`` if given, else the first of :data:`RECORD_FIELDS`."""
    if not isinstance(record, Mapping):
        raise RecordError("not_a_record", f"record {index} is a {type(record).__name__}, not an object with fields")
    if field is not None:
        if field not in _KIND_OF_FIELD:
            raise ValueError(f"field={field!r} is not one of {', '.join(RECORD_FIELDS)}")
        if record.get(field) is None:
            raise RecordError("missing_field", f"record {index} has no {field!r} field (field={field!r} was asked for)")
        return _KIND_OF_FIELD[field]
    for name in RECORD_FIELDS:
        if record.get(name) is not None:
            return _KIND_OF_FIELD[name]
    keys = ", ".join(map(repr, list(record)[:8])) or "none"
    raise RecordError("missing_field",
                      f"record {index} has none of the fields {', '.join(RECORD_FIELDS)} (its fields: {keys})")


def check_text(record: Mapping[str, Any], index: int) -> str:
    """The record's text; an empty or non-string text is an error."""
    text = record["text"]
    if not isinstance(text, str):
        raise RecordError("bad_type", f"record {index}: 'text' is a {type(text).__name__}, not a string")
    if not text.strip():
        raise RecordError("empty", f"record {index}: 'text' is empty")
    return text


def check_tokens(record: Mapping[str, Any], index: int, vocab_size: int) -> tuple[list[int], list[int] | None]:
    """Pre-tokenized ``(input_ids, labels or None)``, validated by :func:`padless.layout.check_tokens`
    (the one token validator): ids inside the vocabulary, labels of the same length, each -100 or an id."""
    from padless.layout import TokenError
    from padless.layout import check_tokens as validate

    labels = record.get("labels")
    try:
        ids, checked = validate(record["input_ids"], labels, vocab_size=vocab_size, where=f"record {index}")
    except TokenError as err:
        raise RecordError(err.reason, str(err)) from None
    return ids.tolist(), (None if labels is None else checked.tolist())
