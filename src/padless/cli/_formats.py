"""What ``padless stats --data`` and ``padless pack`` say about the records they read: the form
(:data:`padless.data.formats.FORMATS`) found, what ``--train-on`` trains in it, and the bad records
``--on-error skip`` left out; and the flags ``--columns`` and ``--on-error`` that both take.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SHOWN = 3
"""Bad records named on the command line (the rest are counted)."""
CHATS = ("messages", "sharegpt", "alpaca", "conversational_prompt_completion")
"""Forms rendered as chats (a chat template, a system prompt it may add)."""
_TRAINED = {
    "all": "every token",
    "assistant": "the assistant turns",
    "completion": "the assistant turns after the last user turn",
}


def add_record_arguments(group: Any) -> None:
    """``--columns`` and ``--on-error``, in the tokenizing group of ``padless stats`` and ``padless pack``."""
    group.add_argument(
        "--columns",
        metavar="NAME=FIELD",
        action="append",
        default=None,
        help="read the records' FIELD as padless' NAME (instruction, input, output, prompt, completion, "
        "conversations, messages, text, ...), comma-separated or repeated, e.g. --columns instruction=question,"
        "output=answer (default: none, the fields as named)",
    )
    group.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="what a bad record of text or chats does: raise stops at it (naming its file, line and field); "
        "skip leaves it out, counted, the first few named",
    )


def columns_of(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The ``--columns`` pairs, checked (:func:`padless.data.formats.parse_columns`)."""
    from padless.data.formats import parse_columns

    given = getattr(args, "columns", None)
    if not given:
        return ()
    try:
        return parse_columns([part for spec in given for part in spec.split(",") if part.strip()])
    except ValueError as exc:
        raise ValueError(str(exc).replace("columns:", "--columns:", 1)) from None


def _first_record(path: Path) -> Any:
    """The first record of a data file, read cheaply (None where that would mean reading it all)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, "rb") as f:
            head = f.read(1 << 16).lstrip()
        if head.startswith(b"["):  # a JSON array: only the whole file tells its first element
            return None
        with open(path, "rb") as f:
            line = next((ln for ln in f if ln.strip()), b"")
        return json.loads(line) if line else None
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        if "input_ids" in names:
            return dict.fromkeys(names, True)
        rows = pq.ParquetFile(path).read_row_group(0).slice(0, 1).to_pylist()
        return rows[0] if rows else None
    return None


def data_kind(name: str, columns: tuple[tuple[str, str], ...] = ()) -> str | None:
    """The form of a data file's or a built-in corpus's records (:data:`padless.data.formats.FORMATS`:
    its first record's, after ``columns``, as the library decides), None where it cannot be told
    without reading the whole input or the first record is bad (the library then names the problem)."""
    from padless.data.corpora import split_corpus_name
    from padless.data.formats import map_columns, record_format
    from padless.data.records import RecordError

    path = Path(name).expanduser()
    if path.is_file():
        try:
            first = _first_record(path)
        except (ValueError, OSError):  # not JSON, not Parquet: reading it names the line or the file
            return None
    elif path.is_dir() or (builtin := split_corpus_name(name)) is None:
        first = None  # a datasets folder or name: read below
    else:
        return "messages" if builtin[0].kind == "chat" else "text"
    if first is None and (path.is_dir() or path.suffix.lower() in (".json", ".csv", ".tsv")):
        from padless.data.files import read_records

        try:  # these are read whole anyway; a bad one is reported by the library with its line
            rows = read_records(str(path), on_error="skip").rows
        except ValueError:
            return None
        first = rows[0][1] if rows else None
    try:
        return record_format(map_columns(first, columns, "the first record"), "the first record")
    except RecordError:
        return None


def train_on_choice(train_on: str, kind: str | None, name: str) -> tuple[str, str | None]:
    """``(train_on, the line that says it)``: ``--train-on auto`` resolved for the records of ``name``,
    of form ``kind`` (:func:`data_kind`): assistant for chats, the completion of prompt / completion and
    Alpaca records (their prompt is context), all for text. Pre-tokenized records keep their labels:
    another ``--train-on`` is refused, not ignored. No line for a file whose first record has no form
    (reading it names the problem)."""
    if kind == "input_ids":
        if train_on != "auto":
            raise ValueError(
                f"--train-on {train_on} applies to text and chats; pre-tokenized records "
                "('input_ids') are trained as their 'labels' say (every token without labels)"
            )
        return "all", "train on: the records' own labels (pre-tokenized 'input_ids')"
    if kind == "prompt_completion" and train_on != "all":
        return "auto", "train on: the completion (its prompt is context; --train-on all trains every token)"
    if train_on != "auto":
        return train_on, f"train on: {_TRAINED[train_on]} (--train-on {train_on})"
    if kind in ("alpaca", "conversational_prompt_completion"):
        return "auto", (
            "train on: the completion, the assistant's reply (--train-on auto; the prompt is context; "
            "--train-on all trains every token)"
        )
    if kind in ("messages", "sharegpt"):
        return "assistant", (
            f"train on: {_TRAINED['assistant']} (--train-on auto, for chats; --train-on all trains every token)"
        )
    if kind == "text":
        return "all", f"train on: {_TRAINED['all']} (--train-on auto, for text)"
    if Path(name).expanduser().is_file():
        return "all", None
    return "all", (
        f"train on: {_TRAINED['all']} (--train-on auto; the kind of the records is not known before "
        "reading them: pass --train-on assistant for chats)"
    )


def format_line(kind: str | None, columns: tuple[tuple[str, str], ...] = ()) -> str | None:
    """``format: Alpaca ('instruction' / 'input' / 'output') (detected; --columns output=answer)``."""
    from padless.data.formats import FORMATS

    if kind is None:
        return None
    mapped = f"; --columns {','.join(f'{a}={b}' for a, b in columns)}" if columns else ""
    return f"format: {FORMATS.get(kind, kind)} (detected from the first record{mapped})"


def skipped_lines(skipped: dict[str, int], first: list[str], read: int | None = None) -> list[str]:
    """``skipped 3 bad records of 40 (--on-error skip): unknown_role 2, missing_field 1`` and the first
    few, one line each (none when nothing was skipped)."""
    total = sum(v for k, v in skipped.items() if k != "overlong")
    if not total:
        return []
    of = f" of {read:,}" if read else ""
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items()) if k != "overlong")
    lines = [f"skipped {total:,} bad record{'s' if total != 1 else ''}{of} (--on-error skip): {reasons}"]
    lines += [f"  {message}" for message in first[:SHOWN]]
    if total > min(len(first), SHOWN):
        lines.append(f"  ... and {total - min(len(first), SHOWN):,} more")
    return lines
