"""The three kinds of training record every source is reduced to, how records are named in messages,
and the error a bad record raises.

A record is a dict with one of these fields, the first not None in this order (:func:`record_field`):

- ``input_ids``: pre-tokenized ids, optionally with ``labels`` of the same length;
- ``messages``: a chat, a list of ``{"role", "content", "tool_calls"?}`` (see :mod:`padless.data.chat`);
- ``text``: plain text, every token trained.

Every message about a record starts with where it is (:func:`where`), counted from 1: ``line N``
for a line of a JSON lines or CSV file (the line the record starts on), ``record N`` for the N-th
record of anything else (a JSON array, a Parquet file, a ``datasets`` dataset, a built-in corpus, a
list in memory). Messages inside a chat are counted from 0, as indices into ``messages``.

A record that cannot be used raises :class:`RecordError`, whose ``reason`` is the key under which a
skip is counted when the caller chose ``on_error="skip"``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

RecordKind = Literal["tokens", "messages", "text"]
RECORD_FIELDS: tuple[str, ...] = ("input_ids", "messages", "text")
"""Fields that make a record, in the order they are looked for."""
_KIND_OF_FIELD: dict[str, RecordKind] = {"input_ids": "tokens", "messages": "messages", "text": "text"}
_ACCEPTED = "'text', 'messages' or 'input_ids'"

Unit = Literal["line", "record"]
"""How a source's records are counted: by the file line they start on, or by position."""


class RecordError(ValueError):
    """A record that cannot be used; ``reason`` names the kind of problem (the skip counter's key)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        """Short key such as ``"empty"``, ``"unknown_role"``, ``"missing_field"``."""


def where(number: int, unit: Unit = "record") -> str:
    """``"line 3"`` or ``"record 3"``: how every message names a record (``number`` counts from 1)."""
    return f"{unit} {number}"


def numbered(rows: Iterable[Any]) -> list[tuple[int, Any]]:
    """``[(record number, row)]`` counted from 1, for sources counted by position."""
    return list(enumerate(rows, start=1))


def fields_hint(mapping: Mapping[str, Any], wanted: Iterable[str] = ()) -> str:
    """``"fields: 'role', 'contnt'; did you mean 'content'?"``: what an object has, and the nearest
    wanted name to one of its fields when one is close (a misspelling)."""
    keys = [str(k) for k in mapping]
    has = ", ".join(map(repr, keys[:8])) + (", ..." if len(keys) > 8 else "") if keys else "none"
    close = [w for w in wanted if w not in mapping and difflib.get_close_matches(w, keys, n=1, cutoff=0.75)]
    return f"fields: {has}" + (f"; did you mean {close[0]!r}?" if close else "")


def record_field(record: Any, at: str, field: str | None = None) -> str:
    """The field that makes ``record`` (named ``at``): the forced ``field`` if given, else the first of
    :data:`RECORD_FIELDS` whose value is not None. The one rule for what a record is; an input of
    ``padless pack`` names its kind by this field, the encoders by :func:`record_kind`."""
    if not isinstance(record, Mapping):
        raise RecordError("not_a_record", f"{at} is a {type(record).__name__}, not an object with fields")
    if field is not None:
        if field not in _KIND_OF_FIELD:
            raise ValueError(f"field={field!r} is not one of {', '.join(RECORD_FIELDS)}")
        if record.get(field) is None:
            raise RecordError(
                "missing_field",
                f"{at}: no {field!r} field, which field={field!r} asks for ({fields_hint(record, [field])})",
            )
        return field
    for name in RECORD_FIELDS:
        if record.get(name) is not None:
            return name
    null = [name for name in RECORD_FIELDS if name in record]
    if null:
        raise RecordError(
            "bad_type",
            f"{at}: {null[0]} is null; expected "
            + ("a list of integer token ids" if null[0] == "input_ids" else "a value"),
        )
    raise RecordError("missing_field", f"{at}: no {_ACCEPTED} field ({fields_hint(record, RECORD_FIELDS)})")


def record_kind(record: Any, at: str, field: str | None = None) -> RecordKind:
    """Which kind ``record`` (named ``at``) is: the kind of its :func:`record_field`."""
    return _KIND_OF_FIELD[record_field(record, at, field)]


def check_text(record: Mapping[str, Any], at: str) -> str:
    """The record's text; an empty or non-string text is an error."""
    text = record["text"]
    if not isinstance(text, str):
        raise RecordError("bad_type", f"{at}: 'text' is a {type(text).__name__}, not a string")
    if not text.strip():
        raise RecordError("empty", f"{at}: 'text' is empty")
    return text


def record_tokens(record: Mapping[str, Any], at: str, vocab_size: int) -> tuple[list[int], list[int] | None]:
    """The record's pre-tokenized ``(input_ids, labels or None)``, as :func:`check_text` gives its text:
    validated by :func:`padless.layout.check_tokens` (the token validator of every reader: ids inside the
    vocabulary, labels of the same length, each -100 or an id), whose refusal becomes a
    :class:`RecordError` of the same reason, so ``on_error="skip"`` counts it."""
    from padless.layout import TokenError
    from padless.layout import check_tokens as validate

    labels = record.get("labels")
    try:
        ids, checked = validate(record["input_ids"], labels, vocab_size=vocab_size, where=at)
    except TokenError as err:
        raise RecordError(err.reason, str(err)) from None
    return ids.tolist(), (None if labels is None else checked.tolist())
