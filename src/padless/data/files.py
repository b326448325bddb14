"""The user's own data: JSON lines, CSV, Parquet, or a ``datasets`` name / saved folder -> records.

Each row needs a ``text``, ``messages`` or ``input_ids`` field (see :mod:`padless.data.records`).

- ``.jsonl`` / ``.json``: read here, line by line (a ``.json`` file holding one JSON array works
  too), so a bad line is reported by its line number and chats keep their exact nested structure
  (Arrow would add missing keys as nulls to every message and tool-call argument object).
- ``.csv`` / ``.tsv``: ``pyarrow.csv``; a ``messages``, ``input_ids`` or ``labels`` cell holds JSON.
- ``.parquet``: ``pyarrow.parquet``. Tool-call arguments are best stored as JSON strings (the OpenAI
  wire format), since Parquet structs give every object the union of all keys.
- a folder written by ``Dataset.save_to_disk``: ``datasets.load_from_disk``; any other folder or name:
  ``datasets.load_dataset(name, split=split)`` (which may need the network for hub names).

A file whose content is not what its extension says raises ``ValueError`` naming the file; a bad row
raises :class:`~padless.data.records.RecordError` (or is counted, with ``on_error="skip"``). Rows of
JSON lines and CSV files are named by the line they start on, all others by their position
(:func:`padless.data.records.where`), counting from 1.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from padless._optional import require
from padless.data.records import RecordError, Unit, numbered, where

JSON_FIELDS = ("messages", "conversations", "input_ids", "labels")
"""Fields that a CSV cell (or any string value) may carry as JSON."""
SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")


class Records(NamedTuple):
    """What :func:`read_records` read."""

    rows: list[tuple[int, Any]]
    """``(number, row)``: the number names the row in messages, with :attr:`unit`."""
    unit: Unit
    """``line`` (JSON lines, CSV: the line a row starts on) or ``record`` (its position), from 1."""
    skipped: Counter[str]
    """Rows skipped while reading, by reason (a bad JSON line with ``on_error="skip"``)."""
    fingerprint: Any
    """What identifies the source's content (see :func:`file_fingerprint`)."""
    first_skipped: list[str] = []
    """The messages of the first few rows skipped while reading, naming each."""


def _decode_json_cells(row: dict[str, Any], at: str) -> dict[str, Any]:
    for name in JSON_FIELDS:
        value = row.get(name)
        if isinstance(value, str):
            try:
                row[name] = json.loads(value)
            except json.JSONDecodeError as err:
                raise RecordError(
                    "bad_json", f"{at}: field {name!r} is a string that is not JSON ({err.msg})"
                ) from None
    return row


def _csv_lines(path: Path, delimiter: str, count: int) -> list[int] | None:
    """The line each of the ``count`` data rows of a CSV file starts on (a quoted cell may span
    lines; empty lines are skipped, as pyarrow skips them), or None where Python's reader disagrees
    with pyarrow's or refuses a cell (over its field size limit): the rows are then counted as records."""
    import csv

    starts, end = [], 0
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter=delimiter)
            for row in reader:
                if row:
                    starts.append(end + 1)
                end = reader.line_num
    except (csv.Error, UnicodeDecodeError):
        return None
    return starts[1:] if len(starts) == count + 1 else None  # the first row is the header


def _read_json_lines(
    path: Path, on_error: str, skipped: Counter[str], notes: list[str]
) -> tuple[list[tuple[int, Any]], Unit]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not a UTF-8 text file, so not JSON lines ({err.reason} at byte {err.start})"
        ) from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        return numbered(rows), "record"
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as err:
            problem = RecordError("bad_json", f"{path}, {where(lineno, 'line')}: not valid JSON ({err.msg})")
            if on_error == "raise":
                raise problem from None
            skipped[problem.reason] += 1
            if len(notes) < 5:
                notes.append(str(problem))
    if not rows and not skipped:
        raise ValueError(f"{path} holds no records")
    return rows, "line"


def _read_arrow(path: Path) -> tuple[list[tuple[int, Any]], Unit]:
    pa = require("pyarrow", "reading Parquet and CSV files")

    delimiter = "\t" if path.suffix == ".tsv" else ","
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.csv as pcsv

            parse = pcsv.ParseOptions(delimiter=delimiter)
            convert = pcsv.ConvertOptions(strings_can_be_null=True)  # an empty cell is a missing field
            table = pcsv.read_csv(path, parse_options=parse, convert_options=convert)
        rows = table.to_pylist()
    except (pa.ArrowException, UnicodeDecodeError) as err:
        kind = "Parquet" if path.suffix == ".parquet" else "CSV"
        raise ValueError(f"{path} is not a readable {kind} file: {err}") from None
    lines = None if path.suffix == ".parquet" else _csv_lines(path, delimiter, len(rows))
    return (numbered(rows), "record") if lines is None else (list(zip(lines, rows)), "line")


def _read_datasets(name: str, split: str) -> tuple[list[dict[str, Any]], str]:
    datasets = require("datasets", "reading a datasets folder or hub name")

    folder = Path(name).expanduser()
    saved = folder.is_dir() and ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file())
    if folder.is_dir() and not saved:
        _check_data_folder(folder)
    if not folder.is_dir() and not _offline_mode():
        from padless.data.corpora import CORPORA
        from padless.hub import hub_reachable

        if not hub_reachable():  # datasets would retry the hub for half a minute
            raise ValueError(
                f"{name!r} is not a built-in corpus ({', '.join(CORPORA)}), a data file "
                f"({', '.join(SUFFIXES)}) or a folder, and the model hub cannot be reached to look for a "
                "dataset of that name (set HF_HUB_OFFLINE=1 to use the local Hugging Face cache)"
            )
    try:
        if saved:
            ds = datasets.load_from_disk(str(folder))
        else:
            ds = datasets.load_dataset(name, split=split)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{name} has no split {split!r} (it has {', '.join(ds)})")
            ds = ds[split]
    except ValueError:
        raise
    except Exception as err:  # datasets raises many kinds (FileNotFoundError, ConnectionError, DatasetNotFoundError)
        raise ValueError(f"{name!r} is not a built-in corpus, a data file, or a dataset that loads: {err}") from None
    return ds.to_list(), ds._fingerprint


def _offline_mode() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", os.environ.get("HF_DATASETS_OFFLINE", "")).lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


def _check_data_folder(folder: Path) -> None:
    """A plain folder is read by ``datasets`` only if every (non-hidden) file in it is a data file: a
    README.txt or a script beside the data would otherwise be trained on as text."""
    files = [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    data = {p.suffix.lower() for p in files if p.suffix.lower() in SUFFIXES}
    other = sorted(str(p.relative_to(folder)) for p in files if p.suffix.lower() not in SUFFIXES)
    if not data:
        raise ValueError(
            f"folder {folder} holds no data files ({', '.join(SUFFIXES)}) and is not a dataset saved with save_to_disk"
        )
    if other or len(data) > 1:
        what = (
            f"files that are not data ({', '.join(other[:5])}{', ...' if len(other) > 5 else ''})"
            if other
            else f"data files of several types ({', '.join(sorted(data))})"
        )
        raise ValueError(
            f"folder {folder} holds {what}; pass the data file itself, or a folder holding only data files of one type"
        )


def file_fingerprint(path: Path, chunk: int = 1 << 20) -> dict[str, Any]:
    """What identifies a file's content for the token cache and a resumed ``padless pack``: a BLAKE2b
    hash of its bytes (read in 1 MiB chunks) and its size. The path and modification time are left out:
    a file rewritten with the same size and time but other bytes is another file; the same bytes
    moved elsewhere are the same data."""
    h = hashlib.blake2b(digest_size=20)
    size = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            size += len(block)
    return {"blake2b": h.hexdigest(), "size": size, "suffix": path.suffix.lower()}


def read_records(name: str, *, split: str = "train", on_error: str = "raise") -> Records:
    """The rows of a file, folder or dataset, each with the number that names it (see :class:`Records`)."""
    path = Path(name).expanduser()
    skipped: Counter[str] = Counter()
    notes: list[str] = []
    unit: Unit = "record"
    named = f"{path}, " if path.is_file() else ""
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
        if path.suffix in (".jsonl", ".json"):
            rows, unit = _read_json_lines(path, on_error, skipped, notes)
        else:
            rows, unit = _read_arrow(path)
        fingerprint: Any = file_fingerprint(path)
    elif path.suffix in SUFFIXES:  # looks like a data file, so do not send it to the hub as a dataset name
        raise ValueError(f"{path}: no such file")
    else:
        records, fingerprint = _read_datasets(name, split)
        rows = numbered(records)
        fingerprint = {"dataset": name, "split": split, "fingerprint": fingerprint}
    out = []
    for number, row in rows:
        try:
            at = named + where(number, unit)
            out.append((number, _decode_json_cells(dict(row), at) if isinstance(row, dict) else row))
        except RecordError as err:
            if on_error == "raise":
                raise
            skipped[err.reason] += 1
            if len(notes) < 5:
                notes.append(str(err))
    return Records(out, unit, skipped, fingerprint, notes)
