"""Offline packing to disk (``padless pack``): an input -> Parquet shards of packed rows, one plan over
the whole input, the same rows on any engine and any number of workers, resumable.

::

    padless pack data.jsonl --out packed/ --max-length 2048
    padless pack data.jsonl --out packed/ --max-length 2048 --engine ray --num-workers 16
    padless pack --synthetic lognormal:5000000 --out packed/ --max-length 1024 --overlong split

map -> plan -> write (:mod:`padless.export.stages`, run by an engine of :mod:`padless.export.engine`):

1. **map**: the input is cut into logical shards of ``shard_rows`` records, by the data, never by the
   number of workers (:mod:`padless.data.inputs`); each is read, tokenized, put through the overlong
   policy and written as a token shard plus its length histogram.
2. **plan**: the driver adds the histograms and makes one best-fit-decreasing plan over the whole input
   from the sum (:func:`padless.planning.slots.plan_histogram`); the lengths are never gathered (a
   histogram is ``max_length + 1`` counts).
3. **place**: each token shard places its own sequences: the k-th sequence of length L in input order
   takes the k-th slot of length L, k counted from the prefix sums of the histograms of the shards
   before it. Rows therefore depend on the input alone: not on the shard size, the engine, the
   number of workers, or the order in which tasks finish.
4. **write**: output shard ``shard-0000o.parquet`` holds rows ``o * rows_per_shard ...`` with the
   columns ``input_ids``, ``labels`` and ``seq_lengths`` (each ``list<int32>``), and, for chats rendered
   through a vision-language processor (``--processor``), the row's images: ``pixel_values``,
   ``image_grid_thw``... of its documents concatenated in document order, per-token columns
   (``mm_token_type_ids``) placed like the ids (:mod:`padless.batching.image_rows`); a row read back (by
   pyarrow or ``datasets.load_dataset("parquet", ...)``) is a feature that
   :class:`padless.PackingCollator` places as it is. Labels are stored as the input gave them (the
   collator masks each document's first label).

Resume (:mod:`padless.export.state`): ``state.json`` records the input's content fingerprint, the flags
that change the rows, the plan's hash and a checksum per finished output shard; the token and
placement files carry markers with checksums. A rerun skips every stage whose markers hold, rewrites
any finished shard that is missing or whose checksum fails, and refuses another input or other flags
naming every change, and a non-empty folder it did not write (``overwrite=True`` starts over).
``.lock`` keeps a second run out. Once every shard is written, ``summary.json`` holds the plan
statistics and the counts (every input token is in a row, or counted as truncated or dropped) and the
work folder is removed.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from padless.data.inputs import RecordsInput
from padless.data.shards import PackInput
from padless.export.engine import make_engine
from padless.export.stages import (
    SHARD_PATTERN,
    checksum,
    histogram_of,
    map_shard,
    marker_ok,
    place_shard,
    prefix_histograms,
    write_json,
    write_shard,
)
from padless.export.state import STATE_FILE, SUMMARY_FILE, WORK, FolderLock, check_job, clear
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int
from padless.planning.plan import OVERLONG_POLICIES
from padless.planning.slots import plan_histogram

MAX_ROW_LENGTH = 1 << 24
"""Longest row ``pack_to_parquet`` plans (the histogram holds ``max_length + 1`` counts)."""
COUNTS = (
    "sequences",
    "tokens_in",
    "truncated_sequences",
    "truncated_tokens",
    "split_sequences",
    "dropped_sequences",
    "dropped_tokens",
    "system_prompt_added",
    "image_documents",
    "dropped_image_documents",
)


def records_input(records: Sequence[Any], vocab_size: int | None = None, key: Any = None) -> PackInput:
    """A list of tokenized examples (``{"input_ids", "labels"?}``) as an input of :func:`pack_to_parquet`."""
    records = list(records)
    return RecordsInput(
        name="records",
        key={"records": key if key is not None else len(records)},
        kind="input_ids",
        vocab_size=vocab_size,
        records=records,
    )


def pack_to_parquet(
    source: PackInput | Sequence[Any],
    out: str | Path,
    max_length: int,
    *,
    rows_per_shard: int = 8192,
    max_shards: int | None = None,
    overlong: str = OVERLONG_DEFAULT,
    shard_rows: int = 65536,
    engine: str = "local",
    num_workers: int | None = None,
    ray_address: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    vocab_size: int | None = None,
    input_key: Any = None,
) -> dict[str, Any]:
    """Pack ``source`` (an input of :func:`padless.data.inputs.open_input`, or a list of tokenized
    examples) into Parquet shards in ``out``; resume an earlier run there (see the module docstring).

    ``overlong``: ``error`` (:data:`~padless.planning.checks.OVERLONG_DEFAULT`) | ``truncate`` | ``split``
    | ``drop``. ``shard_rows``: records per input shard (a unit of work; the rows do not depend on it).
    ``engine``: ``local`` (this process) or ``ray`` (``num_workers`` tasks at once, on a local Ray of
    that many CPUs or the cluster at ``ray_address``). ``max_shards`` stops after that many new output
    shards (a rerun continues).
    Returns the summary (also written to ``summary.json`` once every shard is written), or the
    progress so far with ``"complete": False``. A run that fails on a bad input before finishing a
    shard leaves nothing behind.
    """
    if not str(out).strip():
        raise ValueError("out is empty: name the output folder")
    check_int(rows_per_shard, "rows_per_shard")
    check_int(shard_rows, "shard_rows")
    max_length = check_int(max_length, "max_length")
    if max_length > MAX_ROW_LENGTH:
        raise ValueError(
            f"max_length={max_length} is above {MAX_ROW_LENGTH} tokens per row (the plan holds a count "
            "for every length up to max_length)"
        )
    if max_shards is not None:
        check_int(max_shards, "max_shards")
    check_choice(overlong, OVERLONG_POLICIES, "overlong policy")
    if not isinstance(source, PackInput):
        source = records_input(source, vocab_size, input_key)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={out} is a file, not a folder")
    created = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    out.mkdir(parents=True, exist_ok=True)
    fresh = False  # True once this run owns the folder and nothing in it is finished
    try:
        with FolderLock(out):
            job = {
                "input": source.key,
                "max_length": max_length,
                "overlong": overlong,
                "rows_per_shard": rows_per_shard,
            }
            state = check_job(out, job, overwrite)
            fresh = state is None or not state.get("shards")
            return _run(source, out, job, state, max_shards, shard_rows, engine, num_workers, ray_address, progress)
    except ValueError:
        if fresh:  # nothing finished: leave the folder as it was
            clear(out)
            for folder in created:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        raise
    except BaseException:
        for folder in created:  # a run stopped before writing anything leaves no folders behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _verified(out: Path, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The finished shards of ``state`` whose file is there with its recorded checksum."""
    return {
        name: rec
        for name, rec in state["shards"].items()
        if (out / name).is_file() and checksum(out / name) == rec["blake2b"]
    }


def _run(
    source: PackInput,
    out: Path,
    job: dict[str, Any],
    state: dict[str, Any] | None,
    max_shards: int | None,
    shard_rows: int,
    engine: str,
    num_workers: int | None,
    ray_address: str | None,
    progress: bool,
) -> dict[str, Any]:
    from tqdm.auto import tqdm

    started = time.perf_counter()
    state = state or {"job": job, "plan": None, "shards": {}, "complete": False, "wall_s": 0.0}
    earlier = state["wall_s"]
    if state["complete"]:
        good = _verified(out, state)
        if len(good) == len(state["shards"]):
            return {**json.loads((out / SUMMARY_FILE).read_text()), "already_complete": True}
        state["complete"] = False  # a finished shard was damaged or removed: rebuild it
    state["shards"] = _verified(out, state)
    write_json(out / STATE_FILE, state)
    for tmp in out.glob(".shard-*.tmp"):  # a write that a crash cut short (padless.atomic)
        tmp.unlink()
    work = out / WORK
    meta = {"job": job, "shard_rows": shard_rows}
    if (work / "meta.json").is_file() and json.loads((work / "meta.json").read_text()) != meta:
        shutil.rmtree(work)
    work.mkdir(exist_ok=True)
    write_json(work / "meta.json", meta)
    M = job["max_length"]
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    eng = make_engine(engine, num_workers, ray_address)
    seconds["startup"] = time.perf_counter() - t
    try:
        # 1. map: tokenize every shard whose marker does not hold
        t = time.perf_counter()
        shards = source.shards(shard_rows)
        # the driver keeps each shard's counts, and its histogram in a memory-mapped [shards, M + 1] file
        hists = np.lib.format.open_memmap(work / "hist.npy", mode="w+", dtype=np.int64, shape=(len(shards), M + 1))
        counts = dict.fromkeys(COUNTS, 0)
        skips: dict[int, tuple[dict[str, int], list[str]]] = {}  # shard -> bad records skipped, the first named

        def keep(index: int, marker: dict[str, Any]) -> None:
            hists[index] = histogram_of(marker, M)  # noqa: F821  (the memmap above; deleted once every shard is kept)
            for k in COUNTS:
                counts[k] += int(marker.get(k, 0))  # a marker of an older padless may lack a count
            if marker.get("skipped"):
                skips[index] = (marker["skipped"], marker.get("first_skipped", []))

        todo = []
        for s in shards:
            if (m := marker_ok(work / "tokens" / f"{s.index:05d}.json")) is not None:
                keep(s.index, m)
            else:
                todo.append(s)
        with tqdm(total=len(todo), unit="shard", desc=f"reading {source.name}", disable=not progress) as bar:

            def mapped(shard: Any, marker: dict[str, Any]) -> None:
                keep(shard.index, marker)
                bar.update(1)

            eng.run(map_shard, todo, source, work, M, job["overlong"], done=mapped)
        seconds["map"] = time.perf_counter() - t
        # 2. plan on the driver, from the merged histograms
        t = time.perf_counter()
        total = prefix_histograms(work, hists)
        del hists
        plan = plan_histogram(total, M)
        digest = plan.digest()
        seconds["plan"] = time.perf_counter() - t
        if state["plan"] not in (None, digest):
            state["shards"] = {}  # made from another plan: none is trusted
        state["plan"] = digest
        # 3. place: every token shard places its own sequences
        t = time.perf_counter()
        todo_place = [
            s.index
            for s in shards
            if (m := marker_ok(work / "place" / f"{s.index:05d}.json")) is None or m["plan"] != digest
        ]
        eng.run(place_shard, todo_place, work, plan)
        seconds["place"] = time.perf_counter() - t
        # 4. write every output shard not finished yet
        t = time.perf_counter()
        R = job["rows_per_shard"]
        names = [SHARD_PATTERN.format(o) for o in range(-(-plan.num_rows // R))]
        for stale in out.glob("shard-*.parquet"):
            if stale.name not in names or stale.name not in state["shards"]:
                stale.unlink()
        todo_write = [o for o, name in enumerate(names) if name not in state["shards"]]
        if max_shards is not None:
            todo_write = todo_write[:max_shards]

        bar = tqdm(
            total=len(names),
            initial=len(names) - len(todo_write),
            unit="shard",
            desc=f"writing {out}",
            disable=not progress,
        )

        def done(o: int, rec: dict[str, Any]) -> None:
            state["shards"][rec["file"]] = rec
            state["wall_s"] = earlier + time.perf_counter() - started
            write_json(out / STATE_FILE, state)
            bar.update(1)

        with bar:
            eng.run(write_shard, todo_write, work, out, plan, R, len(shards), done=done)
        seconds["write"] = time.perf_counter() - t
        workers = eng.workers
    finally:
        eng.close()
    complete = len(state["shards"]) == len(names)
    state["wall_s"] = earlier + time.perf_counter() - started
    stats = plan.stats(
        num_sequences=counts["sequences"],
        truncated_sequences=counts["truncated_sequences"],
        truncated_tokens=counts["truncated_tokens"],
        split_sequences=counts["split_sequences"],
        dropped_sequences=counts["dropped_sequences"],
        dropped_tokens=counts["dropped_tokens"],
    )
    summary = {
        "complete": complete,
        "job": job,
        "plan": digest,
        "shards": [state["shards"][n] for n in names if n in state["shards"]],
        "stats": stats.as_dict(),
        "input_shards": len(shards),
        "tokens_in": counts["tokens_in"],
        "tokens_out": plan.tokens,
        "system_prompt_added": counts["system_prompt_added"],
        "image_documents": counts["image_documents"],
        "dropped_image_documents": counts["dropped_image_documents"],
        "skipped_records": _merged({k: v[0] for k, v in skips.items()}),
        "first_skipped": [m for k in sorted(skips) for m in skips[k][1]][:5],
        # every input token is in a row, or counted as truncated or dropped
        "tokens_accounted": counts["tokens_in"] == plan.tokens + counts["truncated_tokens"] + counts["dropped_tokens"],
        "wall_s": round(state["wall_s"], 3),
        "this_run": {
            "engine": engine,
            "workers": workers,
            "shards_written": len(todo_write),
            "stage_s": {k: round(v, 3) for k, v in seconds.items()},
            "wall_s": round(time.perf_counter() - started, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # Linux: KiB
        },
    }
    if complete:
        write_json(out / SUMMARY_FILE, summary)
        state["complete"] = True
        write_json(out / STATE_FILE, state)
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _merged(per_shard: dict[int, dict[str, int]]) -> dict[str, int]:
    """Skipped records by reason, summed over the shards."""
    out: dict[str, int] = {}
    for counts in per_shard.values():
        for reason, n in counts.items():
            out[reason] = out.get(reason, 0) + int(n)
    return out
