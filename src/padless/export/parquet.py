"""Offline packing to disk: a dataset -> Parquet shards of packed rows (``padless pack``), resumable.

::

    padless pack data.jsonl --out packed/ --max-length 2048
    padless pack --synthetic lognormal:5000000 --out packed/ --max-length 1024 --overlong split

Each shard ``shard-00000.parquet``, ... holds ``rows_per_shard`` packed rows with the columns
``input_ids``, ``labels`` and ``seq_lengths`` (each ``list<int32>``): a row read back (by pyarrow, or
``datasets.load_dataset("parquet", data_files=...)``) is a feature that :class:`padless.PackingCollator`
places as it is, without re-planning. Labels are stored as the input gave them (the collator masks
each document's first label). Rows come from :class:`padless.batching.stream.PackedStream`, so memory stays
bounded whatever the input size:

* the stream's buffer: ``buffer_size`` sequences' tokens (ids and labels, int32) and their positions;
* one shard of rows, copied as they come into flat int32 buffers of ``rows_per_shard x max_length``
  tokens for ids and labels (reused by every shard), plus Parquet's encoding of one row group of 1024
  rows while the shard is written;
* the input's read-ahead: a batch of 1024 Parquet records, one JSON line, or one block of 4096
  synthetic sequences.

Measured here (``--synthetic lognormal:5000000 --max-length 1024 --overlong split``, defaults
otherwise; lengths from :func:`padless.planning.lengths.draw_lengths`, median 60): 254 MiB peak RSS, of
which ~68 MiB is the interpreter with numpy and pyarrow loaded, the same as for 500,000 sequences
(256 MiB); ``summary.json`` records each run's own figures. Text and
chat inputs are tokenized by :mod:`padless.data` first, in memory (the bound then holds for packing,
not for tokenizing); pre-tokenized JSON lines and Parquet files and the synthetic inputs are streamed.

Crash safety: a shard is written to a hidden temporary name in the same folder, fsynced and renamed
(:mod:`padless.atomic`), so
no half-written shard ever carries a shard name. After each shard ``state.json`` (written the same way)
records the shards done and the stream's state after their last row. A rerun with the same input and
flags skips those shards and continues from that state, so the output is the one an uninterrupted run
writes (a shard file past the recorded count, from a run killed between the two renames, is rewritten
identically). ``summary.json`` holds the plan statistics once the input is exhausted: rows, efficiency,
truncated/dropped counts and tokens in and out (every input token is placed or counted).
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
from padless.atomic import atomic_write
from padless.batching.stream import PackedStream

STATE_FILE, SUMMARY_FILE = "state.json", "summary.json"
SHARD_PATTERN = "shard-{:05d}.parquet"


class ShardRows:
    """One shard's rows, copied into flat int32 buffers as they come (no per-row objects are kept).

    The buffers are allocated once for ``rows`` full rows and reused by every shard; only the pages a
    shard fills become resident.
    """

    ROW_GROUP = 1024
    """Rows per Parquet row group: the writer encodes one group at a time, bounding its own buffers."""

    def __init__(self, rows: int, max_length: int) -> None:
        self.capacity = rows
        self.ids = np.empty(rows * max_length, dtype=np.int32)
        self.labels = np.empty(rows * max_length, dtype=np.int32)
        self.docs = np.empty(rows * max_length, dtype=np.int32)  # a row holds at most max_length documents
        self.token_offsets, self.doc_offsets = [0], [0]

    def __len__(self) -> int:
        return len(self.token_offsets) - 1

    @property
    def tokens(self) -> int:
        return self.token_offsets[-1]

    def add(self, row: dict[str, np.ndarray]) -> None:
        t, d = self.token_offsets[-1], self.doc_offsets[-1]
        n, k = row["input_ids"].size, row["seq_lengths"].size
        self.ids[t : t + n] = row["input_ids"]
        self.labels[t : t + n] = row["labels"]
        self.docs[d : d + k] = row["seq_lengths"]
        self.token_offsets.append(t + n)
        self.doc_offsets.append(d + k)

    def clear(self) -> None:
        self.token_offsets, self.doc_offsets = [0], [0]

    def write(self, path: Path) -> None:
        """Write the rows as one Parquet file (``list<int32>`` columns), atomically."""
        pa = require("pyarrow", "writing Parquet shards")
        import pyarrow.parquet as pq

        tok, doc = (pa.array(np.asarray(o, dtype=np.int32)) for o in (self.token_offsets, self.doc_offsets))
        table = pa.table({
            "input_ids": pa.ListArray.from_arrays(tok, pa.array(self.ids[: self.tokens])),
            "labels": pa.ListArray.from_arrays(tok, pa.array(self.labels[: self.tokens])),
            "seq_lengths": pa.ListArray.from_arrays(doc, pa.array(self.docs[: self.doc_offsets[-1]])),
        })  # fmt: skip
        # No dictionary encoding: token ids rarely fit a dictionary page, and trying costs memory.
        atomic_write(path, lambda f: pq.write_table(table, f, row_group_size=self.ROW_GROUP, use_dictionary=False))


def _json(path: Path, data: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(data, indent=2).encode()))


def _resume_point(out: Path, job: dict[str, Any]) -> dict[str, Any] | None:
    """The saved state of an earlier run into ``out`` with the same job, or None for a fresh folder."""
    state_path = out / STATE_FILE
    if not state_path.exists():
        if any(out.glob("shard-*.parquet")):
            raise ValueError(f"out={out} holds shards but no {STATE_FILE}: not a resumable packing; "
                             "use an empty folder")
        return None
    try:
        state = json.loads(state_path.read_text())
        saved = state["job"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"out={out}: {STATE_FILE} is not a padless packing state; use an empty folder") from None
    for key, value in job.items():
        if saved.get(key) != value:
            raise ValueError(f"out={out} holds a packing made with {key}={saved.get(key)!r}, not "
                             f"{value!r}; rerun with the same options or choose another out")  # fmt: skip
    return state


def pack_to_parquet(
    source: Any,
    out: str | Path,
    max_length: int,
    *,
    rows_per_shard: int = 8192,
    max_shards: int | None = None,
    progress: bool = True,
    input_key: Any = None,
    total: int | None = None,
    vocab_size: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Pack ``source`` (tokenized examples) into Parquet shards in ``out``; resume an earlier run there.

    ``options`` are :class:`padless.planning.buffered.StreamOptions` fields. ``max_shards`` stops after that many
    new shards (a rerun continues). Token ids and labels must lie in ``[0, vocab_size)`` (labels may be
    -100). A run that fails before writing anything removes the folders it created. Returns the summary
    (also written to ``summary.json`` once the source is exhausted), or the progress so far with
    ``"complete": False``.
    """
    if not str(out).strip():
        raise ValueError("out is empty: name the output folder")
    if rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
    if max_shards is not None and max_shards < 1:
        raise ValueError(f"max_shards must be >= 1, got {max_shards}")
    started = time.perf_counter()
    stream = PackedStream(source, max_length, dtype=np.int32, vocab_size=vocab_size, **options)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={out} is a file, not a folder")
    created = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _pack(stream, out, rows_per_shard, max_shards, progress, input_key, total, started)
    except BaseException:
        for folder in created:  # a run that failed before writing anything leaves no folders behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _pack(stream: PackedStream, out: Path, rows_per_shard: int, max_shards: int | None, progress: bool,
          input_key: Any, total: int | None, started: float) -> dict[str, Any]:  # fmt: skip
    from tqdm.auto import tqdm

    job = {"input": input_key, **asdict(stream.options), "rows_per_shard": rows_per_shard}
    state = _resume_point(out, job) or {"job": job, "shards": [], "complete": False, "wall_s": 0.0}
    earlier = state["wall_s"]  # wall time of the runs before this one
    if state["complete"]:  # nothing left to do
        return {**json.loads((out / SUMMARY_FILE).read_text()), "already_complete": True}
    if state["shards"]:
        stream.load_state_dict(state["stream"])
    for stale in out.glob("shard-*.parquet"):  # written after the last saved state: rewritten identically
        if stale.name not in {s["file"] for s in state["shards"]}:
            stale.unlink()
    for tmp in out.glob(".shard-*.parquet.*.tmp"):  # a write that a crash cut short (padless.atomic)
        tmp.unlink()
    bar = tqdm(total=total, initial=stream.counts.sequences, unit="seq", desc=f"packing into {out}",
               disable=not progress)  # fmt: skip
    rows = ShardRows(rows_per_shard, stream.options.max_length)
    new = 0

    def flush() -> None:
        name = SHARD_PATTERN.format(len(state["shards"]))
        rows.write(out / name)
        state["shards"].append({"file": name, "rows": len(rows), "tokens": rows.tokens})
        state["stream"] = stream.state_dict()  # taken after the shard's last row: resumes right after it
        state["wall_s"] = earlier + time.perf_counter() - started
        _json(out / STATE_FILE, state)
        rows.clear()
        bar.set_postfix(shards=len(state["shards"]))

    for row in stream:
        rows.add(row)
        bar.update(stream.counts.sequences - bar.n)
        if len(rows) == rows_per_shard:
            flush()
            new += 1
            if max_shards is not None and new >= max_shards:
                bar.close()
                return _summary(stream, state, started, new, complete=False)
    if rows:
        flush()
        new += 1
    bar.update(stream.counts.sequences - bar.n)
    bar.close()
    state["wall_s"] = earlier + time.perf_counter() - started
    summary = _summary(stream, state, started, new, complete=True)
    _json(out / SUMMARY_FILE, summary)
    state["complete"] = True
    _json(out / STATE_FILE, state)
    return summary


def _summary(stream: PackedStream, state: dict[str, Any], started: float, new: int, complete: bool) -> dict[str, Any]:
    """Plan statistics of everything written (all runs), and this run's wall time and peak memory."""
    c = stream.counts
    return {
        "complete": complete,
        "job": state["job"],
        "shards": state["shards"],
        "stats": c.plan_stats(stream.options.max_length).as_dict(),
        "tokens_in": c.tokens_in,
        "tokens_out": c.tokens_out,
        # every input token is in a row, or counted as truncated or dropped (once the input is exhausted)
        "tokens_accounted": c.tokens_in == c.tokens_out + c.truncated_tokens + c.dropped_tokens,
        "wall_s": round(state["wall_s"], 3),
        "this_run": {
            "shards_written": new,
            "wall_s": round(time.perf_counter() - started, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # Linux: KiB
        },
    }
