"""The records of padless' ``SFTTrainer``: checked, then rendered by padless, before TRL reads them.

Every form ``load_corpus`` reads (:mod:`padless.data.formats`: chats, ShareGPT, Alpaca, TRL's prompt /
completion, text, token ids) trains through ``SFTTrainer``:

- :func:`check_sft_records` checks every record when the trainer is made: one form throughout (TRL
  reads the kind off the first record), each well formed (ShareGPT and Alpaca records are then handed on
  as the chats they stand for, in TRL's forms); a bad one raises
  :class:`~padless.data.records.RecordError` naming the trainer argument, the record (from 1), the
  field and the fix, before TRL or ``datasets`` read it.
- :func:`render_sft_dataset` renders them with padless' renderer (:func:`padless.data.encode.encode_records`)
  into ``input_ids`` and ``labels``, which TRL takes as prepared: a chat whose assistant turn has
  ``tool_calls`` and no ``content`` (TRL's chat template fails on it) trains, ShareGPT's
  ``function_call`` turns become tool calls, and what trains is what ``padless stats`` previews.

What is trained follows ``SFTConfig``, as TRL would: chats every token, or the assistant turns with
``assistant_only_loss=True``; prompt / completion records and Alpaca their completion (the output),
or every token with ``completion_only_loss=False``; text every token.

A ``datasets`` column typed ``Json`` (``load_dataset("json")`` types a ``messages`` column
``List(Json)``) is read decoded, as Python objects, never as its Arrow strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from padless._optional import require
from padless.integrations.transformers import first_without, naming_argument, record_fields

CHAT_FIELDS = ("messages", "conversations", "prompt", "completion", "instruction", "input", "output", "system",
               "history", "tools")  # fmt: skip
"""Fields padless reads records from besides the text field (:data:`padless.data.formats.COLUMN_NAMES`)."""
_CHATS = ("messages", "sharegpt")


def _present_deep(value: Any) -> Any:
    """``value`` with every ``None`` field dropped, inside lists too (a ``datasets`` struct gives each
    message every field any message has)."""
    if isinstance(value, Mapping):
        return {k: _present_deep(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_present_deep(v) for v in value]
    return value


def _records(dataset: Any, fields: list[str] | None) -> Iterator[tuple[int, Any]]:
    """``(number from 1, record)``: a ``datasets.Dataset`` read in batches of 1,000 (only ``fields``
    if given) through its features, so a ``Json`` column comes decoded; any other iterable as it is."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "iter"):
        view = dataset.with_format(None)
        if fields is not None:
            view = view.select_columns([c for c in fields if c in view.column_names] or view.column_names[:1])
        number = 0
        for batch in view.iter(batch_size=1000):
            names = list(batch)
            for values in zip(*(batch[n] for n in names)):
                number += 1
                yield number, dict(zip(names, values))
        return
    yield from enumerate(dataset, 1)


def field_names(dataset: Any) -> set[str]:
    """The columns of a ``datasets`` dataset, else the fields of its first record."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return set(names)
    first = next(iter(dataset), None)
    return set(first) if isinstance(first, Mapping) else set()


def _text_columns(record: Mapping[str, Any], text_field: str) -> tuple[tuple[str, str], ...]:
    """``SFTConfig.dataset_text_field`` read as ``text`` where the record has it."""
    return (("text", text_field),) if text_field != "text" and text_field in record else ()


def sft_form(record: Any, at: str, text_field: str = "text") -> str:
    """The form of ``record`` (:data:`padless.data.formats.FORMATS`), after padless' checks of it (a chat's
    messages by :func:`padless.data.chat.check_messages`); else :class:`RecordError` naming the record,
    the field and the fix."""
    from padless.data.chat import check_messages
    from padless.data.formats import read_document
    from padless.data.records import RecordError, check_text, fields_hint

    if (
        isinstance(record, Mapping) and "input_ids" in record
    ):  # TRL takes the tokens as they are; the collator checks them
        return "input_ids"
    if isinstance(record, Mapping) and text_field != "text" and text_field not in record:
        known = {"messages", "conversations", "prompt", "completion", "instruction", "output"} & set(record)
        if not known:
            raise RecordError(
                "missing_field",
                f"{at}: no {text_field!r} field, which SFTConfig(dataset_text_field="
                f"{text_field!r}) reads ({fields_hint(record, [text_field])})",
            )
    try:
        doc = read_document(
            record, at, columns=_text_columns(record, text_field) if isinstance(record, Mapping) else ()
        )
    except RecordError as err:
        said, hint, _ = str(err).partition("a field of another name is mapped with --columns ")
        if hint:  # SFTTrainer takes no columns mapping: the dataset's own rename does it
            name = _.split("=", 1)[0]
            err.args = (
                f"{said}rename the dataset's column to {name!r} (Dataset.rename_column(FIELD, {name!r})) or give "
                "SFTTrainer a formatting_func",
            )
        raise
    if doc.kind == "chat":
        check_messages(doc.value, at)
    elif doc.kind == "text":
        try:
            check_text({"text": doc.value}, at)
        except RecordError as err:
            err.args = (str(err).replace("'text'", repr(text_field)),)
            raise
    return doc.format


def check_sft_records(dataset: Any, argument: str = "train_dataset", *, text_field: str = "text") -> Any:
    """``dataset`` as TRL's ``SFTTrainer`` takes it (a list of dicts becomes a ``datasets.Dataset``),
    after padless' record checks of every record (:func:`sft_form`): one form throughout, each well
    formed. A bad record raises :class:`padless.data.records.RecordError` naming ``argument``, the record
    (from 1), the field and the fix. An ``IterableDataset`` is checked by its first record."""
    from padless.data.formats import FORMATS
    from padless.data.records import RecordError, fields_hint, where

    datasets = require("datasets")
    if isinstance(dataset, datasets.IterableDataset):
        with naming_argument(argument):
            sft_form(_present_deep(next(iter(dataset), {})), where(1), text_field)
        return dataset
    with naming_argument(argument):
        columns = getattr(dataset, "column_names", None)
        if columns is not None and "input_ids" in columns:  # TRL trains the tokens and reads nothing else
            number = first_without(dataset, "input_ids")
            if number is not None:
                record = record_fields(dataset, number)
                raise RecordError(
                    "missing_field",
                    f"{where(number)}: no 'input_ids', which the other records have "
                    f"({fields_hint(record, ['input_ids'])})",
                )
            return dataset
        first = None
        fields = None if columns is None else [text_field, "text", *CHAT_FIELDS]
        for number, record in _records(dataset, fields):
            if isinstance(record, Mapping):
                record = _present_deep(record) if _present_deep(record) else record_fields(dataset, number)
            try:
                form = sft_form(record, where(number), text_field)
            except RecordError as err:
                if err.reason != "missing_field" or columns is None:
                    raise
                sft_form(_present_deep(record_fields(dataset, number)), where(number), text_field)  # every field it has
                raise
            if first is None:
                first = form
            elif form != first:
                raise RecordError(
                    "mixed_kinds",
                    f"{where(number)}: a {form!r} record, and record 1 is a {first!r} one; SFTTrainer trains one "
                    f"kind per dataset (record 1 is {FORMATS[first]})",
                )
    if first in ("sharegpt", "alpaca"):
        return _as_trl_chats(dataset, first, text_field)
    if columns is None:  # every field of every record (from_list would keep the first record's only)
        names = list(dict.fromkeys(k for r in dataset for k in r))
        dataset = datasets.Dataset.from_dict({k: [r.get(k) for r in dataset] for k in names})
    return dataset


def _as_trl_chats(dataset: Any, form: str, text_field: str) -> Any:
    """ShareGPT records as ``messages``, Alpaca records as conversational ``prompt`` / ``completion``:
    the chats they stand for (:mod:`padless.data.formats`), in forms TRL's own checks know (its
    ``assistant_only_loss`` asks for a conversational dataset), rendered alike."""
    from padless.data.formats import read_document

    datasets = require("datasets")
    chats = [read_document(_present_deep(r), "record", columns=()).value for _, r in _records(dataset, None)]
    if form == "sharegpt":
        return datasets.Dataset.from_dict({"messages": chats})
    return datasets.Dataset.from_dict({"prompt": [c[:-1] for c in chats], "completion": [c[-1:] for c in chats]})


def sft_train_on(form: str, args: Any) -> str:
    """What ``SFTConfig`` trains of records of ``form``, in padless' ``train_on`` words: chats ``all``
    (``assistant`` with ``assistant_only_loss``), prompt / completion and Alpaca ``auto`` (the
    completion; ``all`` with ``completion_only_loss=False``), text ``all``."""
    if form in _CHATS:
        return "assistant" if getattr(args, "assistant_only_loss", False) else "all"
    if form == "text":
        return "all"
    return "all" if getattr(args, "completion_only_loss", None) is False else "auto"


def render_sft_dataset(dataset: Any, tokenizer: Any, args: Any, argument: str, text_field: str = "text") -> Any:
    """A checked ``datasets.Dataset`` of records (any form but token ids) rendered by padless into a
    ``Dataset`` of ``input_ids`` and ``labels`` (:func:`padless.data.encode.encode_records`: each
    document ends with one end-of-document token; no length limit here, the trainer applies its own).
    Token ids, and anything but a ``Dataset``, come back as given."""
    from padless.data.encode import EncodeOptions, encode_records

    datasets = require("datasets")
    if not isinstance(dataset, datasets.Dataset) or "input_ids" in dataset.column_names or not len(dataset):
        return dataset
    fields = [text_field, "text", *CHAT_FIELDS]
    rows = [_present_deep(r) for _, r in _records(dataset, fields)]
    form = sft_form(rows[0], "record 1", text_field)
    tok = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    opts = EncodeOptions(train_on=sft_train_on(form, args), columns=_text_columns(rows[0], text_field))  # type: ignore[arg-type]
    with naming_argument(argument):
        ids, labels, _ = encode_records(rows, tok, opts, progress=False)
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})
