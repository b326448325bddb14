"""What a padless trainer says and checks at its boundary with the user: the start line, the records
of the datasets it is given, and its errors in the words of the trainer's own arguments.

Shared by every padless trainer (:class:`padless.integrations.transformers.PackedTrainer`,
:mod:`padless.integrations.trl`'s ``SFTTrainer``, ``GRPOTrainer`` and ``DPOTrainer``): ``train`` first
logs one line saying what trains and whether it is exact (:func:`start_line`, :func:`shown`); the
records are checked before anything reads them (:func:`check_token_records`: a bad record is named
with its number from 1 and the fields it has); and padless' errors raised inside say their arguments
as the trainer takes them (:func:`trainer_words`: ``max_length 16`` -> ``PackedTrainer(max_length=16)``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

logger = logging.getLogger("padless.integrations.transformers")
"""The trainers' start line (:func:`announce`) goes here, at INFO (shown by default: :func:`shown`); named
for the module users import the trainers from, so a level set on it keeps working."""


LAYOUT_NAMES: dict[str, str] = {"mask4d": "4d-mask", "varlen": "varlen", "position_ids": "position-ids"}
"""How the start line names a collator's attention inputs (:data:`padless.attention.select.AttentionInputs`)."""


def start_line(model: Any, collator: Any, *, rows: str, documents: str) -> str:
    """The line a padless trainer logs when training starts: the model, its attention backend, the row
    layout the collator sends, the rule's verdict (the collator was fitted to this model by
    ``for_model`` or :func:`padless.check_collator`, which raise otherwise), the ``rows`` and the
    ``documents`` per row::

        padless: GPT2LMHeadModel, attention sdpa, layout 4d-mask, exact (padless rule), 160-token rows,
        2.7 documents per row (planned rows)

    ``collator=None``: padded batches (nothing packed, so nothing to isolate)."""
    from padless.attention.adapters import base_model_of
    from padless.attention.facts import model_facts

    inner = base_model_of(model)
    name = type(inner).__name__ if inner is model else f"{type(model).__name__}({type(inner).__name__})"
    parts = [f"padless: {name}", f"attention {inner.config._attn_implementation}"]
    if collator is None:
        parts += ["layout padded", "exact (padded: nothing packed)"]
    else:
        layout = LAYOUT_NAMES.get(collator.attention, collator.attention)
        windows = collator.windows
        if isinstance(windows, Mapping):  # one mask per layer type: name the windows it carries
            windows = ", ".join(map(str, sorted({w for w in windows.values() if w is not None}))) or None
        if windows is not None:
            layout += f" with sliding window {windows}"
        verdict = "exact (padless rule)" if collator.verdict is not None else "not checked by padless' rule"
        parts += [f"layout {layout}", verdict]
        v = collator.verdict
        if v is None and collator.attention != "varlen" and model_facts(inner).mixer_layers:
            parts.append("no document boundaries sent: the token mixers read restarted position_ids")
        if v is not None and v.mixers:
            parts.append(f"boundaries sent to the token mixers ({v.mixers})")
        if v is not None and v.vision is not None:
            parts.append(f"images packed with their documents ({v.vision.family})")
        elif v is not None and v.images_reason is not None and "no vision tower" not in v.images_reason:
            parts.append("images refused (text-only rows)")
    return ", ".join([*parts, rows, documents])


def shown(log: logging.Logger) -> logging.Logger:
    """``log``, visible by default. Trainer logs its own start-up lines at INFO, which transformers'
    default verbosity (WARNING) hides; the start line says whether the run is exact, so it must reach
    the user, yet it is no warning. So, as PyTorch Lightning and DeepSpeed do for their start-up lines
    (and as transformers gives its library logger a stderr handler): where the application has set up
    no logging (no handler up to the root, no level on ``padless``), ``log`` gets a stderr handler at
    INFO; a setup of its own (``logging.basicConfig``, a level on ``logging.getLogger("padless")``)
    is left alone. Silence it with ``logging.getLogger("padless").setLevel(logging.WARNING)`` first."""
    if not log.hasHandlers() and all(x.level == logging.NOTSET for x in (log, logging.getLogger("padless"))):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def announce(trainer: Any, line: str) -> None:
    """Log the start ``line`` at INFO through :data:`logger` (:func:`shown`), on the main process only."""
    if trainer.is_world_process_zero():
        shown(logger).info(line)


def present(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record``'s fields that hold a value: a ``datasets.Dataset`` gives every record every column,
    ``None`` where the record had no such field (inside messages too)."""
    return {k: v for k, v in record.items() if v is not None}


def records(dataset: Any, columns: list[str] | None = None) -> Iterator[tuple[int, Any]]:
    """``(record number from 1, record)`` of a ``datasets.Dataset`` (read in batches of 1,000, only
    ``columns`` if given; :func:`present` fields) or of any iterable of records."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "iter"):
        view = dataset
        if columns is not None:
            columns = [c for c in columns if c in view.column_names]
            if not columns:  # none of them: every record is empty of them
                yield from ((n, {}) for n in range(1, len(view) + 1))
                return
            view = view.select_columns(columns)
        number = 0
        for batch in view.with_format("arrow").iter(batch_size=1000):
            for record in batch.to_pylist():
                number += 1
                yield number, present(record)
        return
    for number, record in enumerate(dataset, 1):
        yield number, present(record) if isinstance(record, Mapping) else record


def record_fields(dataset: Any, number: int) -> Any:
    """Record ``number`` (from 1) of ``dataset`` with every field it has (:func:`present`)."""
    record = dataset.with_format(None)[number - 1] if hasattr(dataset, "with_format") else dataset[number - 1]
    return present(record) if isinstance(record, Mapping) else record


def first_without(dataset: Any, field: str) -> int | None:
    """The number (from 1) of the first record of ``dataset`` without ``field``, else None; a
    ``datasets.Dataset`` is answered from its columns and their missing values, without decoding rows."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "with_format"):
        if not len(dataset):
            return None
        if field not in dataset.column_names:
            return 1
        column = dataset.with_format("arrow", columns=[field])[:][field]
        if not column.null_count:
            return None
        return int(np.argmax(column.is_null().to_numpy(zero_copy_only=False))) + 1
    for number, record in records(dataset):
        if not isinstance(record, Mapping) or record.get(field) is None:
            return number
    return None


def check_token_records(dataset: Any, argument: str = "train_dataset", trainer: str = "PackedTrainer") -> None:
    """Raise ``ValueError`` naming the first record of ``dataset`` without ``input_ids``: its number
    (from 1) and its fields, by padless' record check (:func:`padless.data.records.record_kind`), before
    anything reads the dataset and fails on a raw ``KeyError``."""
    from padless.data.records import RecordError, record_kind, where

    number = first_without(dataset, "input_ids")
    if number is None:
        return
    at = where(number)
    with naming_argument(argument):
        kind = record_kind(record_fields(dataset, number), at)  # raises: none of the fields padless knows
        raise RecordError(
            "not_tokens",
            f"{at}: a {kind!r} record without 'input_ids': {trainer} trains token ids; "
            "tokenize it first (padless.load_corpus), or train text and chats with "
            "padless.integrations.trl.SFTTrainer",
        )


@contextmanager
def naming_argument(argument: str) -> Iterator[None]:
    """Record errors raised inside name the trainer argument that holds the records (``train_dataset:``)."""
    from padless.data.records import RecordError

    try:
        yield
    except RecordError as err:
        err.args = (f"{argument}: {err}", *err.args[1:])
        raise


def in_trainer_words(message: str, words: Mapping[str, str]) -> str:
    """A padless message in the words of a trainer, as the CLI puts messages in its flags
    (``padless.cli._shared.as_flags``). ``words``: library argument -> where the trainer takes it, as
    ``Owner.field``; ``{"overlong": "SFTTrainer.overlong", "seq_length": "SFTConfig.max_length"}`` turns

    * ``overlong='truncate'`` into ``SFTTrainer(overlong='truncate')``,
    * ``longer than max_length 16`` / ``seq_length=16`` into ``SFTConfig(max_length=16)``,
    * ``unknown overlong policy 'x'`` (key ``"overlong policy"``) into ``unknown SFTTrainer(overlong='x')``,
    * ``dropped by overlong`` / ``max_length must`` into ``dropped by SFTTrainer(overlong=...)`` /
      ``SFTConfig(max_length=...) must``;

    key ``"backend"``: a note after ``use backend 'x'`` (``{backend}`` is the backend's name)."""
    value = r"""(?P<v>'[^']*'|"[^"]*"|[^\s,;:)]+)"""
    for name in sorted((w for w in words if w != "backend"), key=len, reverse=True):
        owner, field = words[name].rsplit(".", 1)
        said = lambda m: f"{owner}({field}={m['v']})"  # noqa: B023,E731
        message = re.sub(rf"(?<=unknown ){re.escape(name)} {value}", said, message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)}={value}", said, message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)} (?P<v>\d+)\b", said, message)
        message = re.sub(rf"(?<=by ){re.escape(name)}\b(?![=(\w])", f"{owner}({field}=...)", message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)}(?= must\b)", f"{owner}({field}=...)", message)
    if "backend" in words:
        note = words["backend"]
        message = re.sub(r"use backend '(?P<b>[\w-]+)'", lambda m: f"{m[0]} ({note.format(backend=m['b'])})", message)
    return message


@contextmanager
def trainer_words(words: Mapping[str, str]) -> Iterator[None]:
    """A ``ValueError`` raised inside, by padless code, says its arguments as the trainer takes them
    (:func:`in_trainer_words`); other libraries' errors pass as they are."""
    try:
        yield
    except ValueError as err:
        if _raised_by_padless(err) and err.args and isinstance(err.args[0], str):
            err.args = (in_trainer_words(err.args[0], words), *err.args[1:])
        raise


def _raised_by_padless(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("padless.")
