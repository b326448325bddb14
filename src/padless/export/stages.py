"""The three stages of ``padless pack`` on one shard each: map (tokenize), place, write.

Each stage is a plain function of files and small arguments, so any engine runs it anywhere
(:mod:`padless.export.engine`: in-process or as Ray tasks) and its output does not depend on where it
ran. Files live in ``OUT/.work`` while a packing is unfinished::

    tokens/00003.ids.npy     int32 token ids of input shard 3's sequences (after the overlong policy)
    tokens/00003.labels.npy  int32 labels (absent when every label is its id)
    tokens/00003.offsets.npy int64 [n + 1] token offsets of its sequences
    tokens/00003.json        the marker: histogram, counts, checksums of the files above
    place/00003.*.npy        each sequence's row and offset, sorted by row (+ the order), and a marker

- :func:`map_shard`: read and tokenize an input shard (:meth:`padless.data.shards.PackInput.read`),
  apply the overlong policy (counted), write the token files and return the length histogram.
- :func:`place_shard`: the deterministic rule of :meth:`padless.planning.slots.SlotPlan.place`.
- :func:`write_shard`: output shard ``o`` holds rows ``o * rows_per_shard ...``; it takes from every
  token shard the sequences placed in its rows (a binary search in the sorted rows, a memory-mapped
  gather) and writes ``shard-0000o.parquet`` (``input_ids``, ``labels``, ``seq_lengths``, each
  ``list<int32>``), atomically. Every slot of its rows must be filled exactly once (checked).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
from padless.atomic import atomic_write
from padless.batching.image_rows import documents_with_images
from padless.data.shards import InputShard, PackInput
from padless.planning.checks import overlong_error
from padless.planning.slots import SlotPlan, by_row

SHARD_PATTERN = "shard-{:05d}.parquet"
ROW_GROUP = 1024
"""Rows per Parquet row group."""


def checksum(path: Path, chunk: int = 1 << 20) -> str:
    """BLAKE2b of a file's bytes (what a resume compares before it trusts a finished file)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(data, indent=1).encode()))


def _save(path: Path, array: np.ndarray) -> str:
    atomic_write(path, lambda f: np.save(f, array))
    return checksum(path)


def marker_ok(marker: Path) -> dict[str, Any] | None:
    """The marker's content if it and every file it lists are whole (checksums match), else None."""
    try:
        data = json.loads(marker.read_text())
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, digest in files.items():
        path = marker.parent / name
        if not path.is_file() or checksum(path) != digest:
            return None
    return data


def _save_table(path: Path, table: Any) -> str:
    import pyarrow.parquet as pq

    atomic_write(path, lambda f: pq.write_table(table, f))
    return checksum(path)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for every ``(s, n)`` (each ``n >= 1``), without a Python loop:
    one cumulative sum of steps that are 1 inside a range and jump at each range's first element."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    step = np.ones(total, dtype=np.int64)
    step[0] = starts[0]
    step[np.cumsum(lengths[:-1])] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
    return np.cumsum(step)


def map_shard(source: PackInput, work: Path, max_length: int, overlong: str, shard: InputShard) -> dict[str, Any]:
    """Tokenize input shard ``shard`` into ``work/tokens``; returns its marker (histogram and counts)."""
    toks = source.read(shard)
    lengths = toks.lengths
    starts = toks.offsets[:-1]
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(
            f"{source.where(int(toks.rows[empty[0]]))} is an empty sequence; every sequence needs at least one token"
        )
    long = lengths > max_length
    with_images = documents_with_images(toks.images.columns if toks.images is not None else (), lengths.size)
    counts = {
        "sequences": int(lengths.size),
        "tokens_in": int(lengths.sum()),
        "truncated_sequences": 0,
        "truncated_tokens": 0,
        "split_sequences": 0,
        "dropped_sequences": 0,
        "dropped_tokens": 0,
        "system_prompt_added": int(toks.system_prompt_added),
        "image_documents": int(with_images.sum()),
        "dropped_image_documents": 0,
    }
    source_seq = np.arange(lengths.size)  # the sequence each piece comes from
    if long.any():
        first = int(np.flatnonzero(long)[0])
        cut = np.flatnonzero(long & with_images)
        if cut.size and overlong in ("truncate", "split"):
            doc = int(cut[0])
            raise ValueError(
                f"{source.where(int(toks.rows[doc]))} holds images and {int(lengths[doc])} tokens, above "
                f"max_length={max_length}: a document with images is placed whole (overlong={overlong!r} would "
                f"cut its images); give max_length={int(lengths[doc])} or more, use overlong='drop' (counted), "
                "or shorten its text"
            )
        if overlong == "error":
            raise overlong_error(
                int(toks.rows[first]),
                int(lengths[first]),
                max_length,
                more=int(long.sum()) - 1,
                what=f"{source.name}, {source.unit}",
                numbered=True,
            )  # rows name records as where() does
        if overlong == "truncate":
            counts.update(truncated_sequences=int(long.sum()), truncated_tokens=int((lengths[long] - max_length).sum()))
            lengths = np.minimum(lengths, max_length)
        elif overlong == "drop":
            counts.update(
                dropped_sequences=int(long.sum()),
                dropped_tokens=int(lengths[long].sum()),
                dropped_image_documents=int((long & with_images).sum()),
            )
            starts, lengths, source_seq = starts[~long], lengths[~long], source_seq[~long]
        elif overlong == "split":  # consecutive pieces of max_length, the rest last
            counts["split_sequences"] = int(long.sum())
            pieces = -(-lengths // max_length)
            seq = np.repeat(np.arange(lengths.size), pieces)
            k = np.arange(seq.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
            starts = starts[seq] + k * max_length
            lengths = np.minimum(lengths[seq] - k * max_length, max_length)
            source_seq = seq
        else:
            raise ValueError(f"unknown overlong policy {overlong!r}")
    take = _ranges(starts, lengths)
    ids = toks.ids[take]
    folder = work / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{shard.index:05d}"
    files = {f"{stem}.ids.npy": _save(folder / f"{stem}.ids.npy", ids)}
    if toks.labels is not None:
        files[f"{stem}.labels.npy"] = _save(folder / f"{stem}.labels.npy", toks.labels[take])
    for key, column in toks.token_columns.items():  # per-token vision columns, placed like the ids
        files[f"{stem}.token.{key}.npy"] = _save(folder / f"{stem}.token.{key}.npy", column[take])
    if toks.images is not None:  # one row per piece: its document's images (a piece of a cut text: null)
        files[f"{stem}.images.parquet"] = _save_table(folder / f"{stem}.images.parquet", toks.images.take(source_seq))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    files[f"{stem}.offsets.npy"] = _save(folder / f"{stem}.offsets.npy", offsets)
    hist = np.bincount(lengths, minlength=max_length + 1)
    nz = np.flatnonzero(hist)
    marker = {
        "shard": shard.index,
        **counts,
        "pieces": int(lengths.size),
        "tokens": int(lengths.sum()),
        "histogram": [nz.tolist(), hist[nz].tolist()],
        "files": files,
    }
    if toks.skipped:  # bad records left out (on_error="skip"), by reason, the first few named
        marker.update(skipped=dict(toks.skipped), first_skipped=list(toks.first_skipped))
    write_json(folder / f"{stem}.json", marker)
    return marker


def histogram_of(marker: dict[str, Any], max_length: int) -> np.ndarray:
    """The ``[max_length + 1]`` counts a map marker holds (sparse on disk)."""
    hist = np.zeros(max_length + 1, dtype=np.int64)
    lengths, counts = marker["histogram"]
    hist[np.asarray(lengths, dtype=np.int64)] = counts
    return hist


def prefix_histograms(work: Path, hists: np.ndarray) -> np.ndarray:
    """The merged histogram of the shards' histograms ``hists`` (``[shards, max_length + 1]``, a
    memory map); each shard's prefix sum (the counts of the shards before it) goes to
    ``work/before.npy``, row by row, so the driver never holds them all (15,000 shards of rows of 8,192
    tokens would be 1 GB)."""
    rows = np.lib.format.open_memmap(work / "before.npy", mode="w+", dtype=np.int64, shape=hists.shape)
    total = np.zeros(hists.shape[1], dtype=np.int64)
    for i in range(hists.shape[0]):
        rows[i] = total
        total += hists[i]
    rows.flush()
    del rows
    return total


def place_shard(work: Path, plan: SlotPlan, index: int) -> dict[str, Any]:
    """Place token shard ``index``'s sequences (rule of :meth:`SlotPlan.place`, from its row of
    ``work/before.npy``); files sorted by row."""
    before = np.asarray(np.load(work / "before.npy", mmap_mode="r")[index])
    offsets = np.load(work / "tokens" / f"{index:05d}.offsets.npy")
    rows, offs = plan.place(np.diff(offsets), before)
    order = by_row(rows, plan.num_rows)
    folder = work / "place"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{index:05d}"
    files = {
        f"{stem}.order.npy": _save(folder / f"{stem}.order.npy", order),
        f"{stem}.row.npy": _save(folder / f"{stem}.row.npy", rows[order]),
        f"{stem}.off.npy": _save(folder / f"{stem}.off.npy", offs[order].astype(np.int32)),
    }
    marker = {"shard": index, "plan": plan.digest(), "files": files}
    write_json(folder / f"{stem}.json", marker)
    return marker


def _vision_columns(tokens: Path, num_inputs: int) -> tuple[list[str], Any]:
    """The per-token vision columns and the unified image schema of every token shard (None: no images)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    token_keys: dict[str, None] = {}
    schemas = []
    for s in range(num_inputs):
        for name in json.loads((tokens / f"{s:05d}.json").read_text())["files"]:
            if name.startswith(f"{s:05d}.token."):
                token_keys[name[len(f"{s:05d}.token.") : -len(".npy")]] = None
        if (tokens / f"{s:05d}.images.parquet").exists():
            schemas.append(pq.read_schema(tokens / f"{s:05d}.images.parquet"))
    schema = pa.unify_schemas(schemas, promote_options="default") if schemas else None
    return list(token_keys), schema


def _image_rows(path: Path, schema: Any, seq: np.ndarray) -> Any:
    """Rows ``seq`` of a token shard's image table, in the unified ``schema`` (columns it lacks: null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(seq)
    if not path.exists():
        return pa.table({f.name: pa.nulls(n, f.type) for f in schema}, schema=schema)
    table = pq.read_table(path).take(pa.array(seq))
    return pa.table(
        {
            f.name: table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in schema
        },
        schema=schema,
    )


def write_shard(work: Path, out: Path, plan: SlotPlan, rows_per_shard: int, num_inputs: int, o: int) -> dict[str, Any]:
    """Write output shard ``o`` (rows ``o * rows_per_shard`` on) from every token shard; returns its record."""
    pa = require("pyarrow", "writing Parquet shards")
    import pyarrow.parquet as pq

    a, b = o * rows_per_shard, min((o + 1) * rows_per_shard, plan.num_rows)
    fills = plan.row_fills(a, b)
    row_base = np.concatenate(([0], np.cumsum(fills)))
    ids_out = np.empty(int(row_base[-1]), dtype=np.int32)
    labels_out = np.empty_like(ids_out)
    doc_row, doc_off, doc_len = [], [], []
    tokens, place = work / "tokens", work / "place"
    token_keys, image_schema = _vision_columns(tokens, num_inputs)
    token_out = {k: np.zeros_like(ids_out) for k in token_keys}
    image_parts = []
    for s in range(num_inputs):
        rows = np.load(place / f"{s:05d}.row.npy", mmap_mode="r")
        lo, hi = np.searchsorted(rows, [a, b])
        if lo == hi:
            continue
        seq = np.load(place / f"{s:05d}.order.npy", mmap_mode="r")[lo:hi]
        r = np.asarray(rows[lo:hi]) - a
        off = np.load(place / f"{s:05d}.off.npy", mmap_mode="r")[lo:hi].astype(np.int64)
        offsets = np.load(tokens / f"{s:05d}.offsets.npy", mmap_mode="r")
        start = np.asarray(offsets[seq])
        n = np.asarray(offsets[seq + 1]) - start
        src, dst = _ranges(start, n), _ranges(row_base[r] + off, n)
        ids = np.load(tokens / f"{s:05d}.ids.npy", mmap_mode="r")
        ids_out[dst] = ids[src]
        label_file = tokens / f"{s:05d}.labels.npy"
        labels_out[dst] = np.load(label_file, mmap_mode="r")[src] if label_file.exists() else ids_out[dst]
        for key, column in token_out.items():
            if (tokens / f"{s:05d}.token.{key}.npy").exists():
                column[dst] = np.load(tokens / f"{s:05d}.token.{key}.npy", mmap_mode="r")[src]
        if image_schema is not None:
            image_parts.append(_image_rows(tokens / f"{s:05d}.images.parquet", image_schema, np.asarray(seq)))
        doc_row.append(r)
        doc_off.append(off)
        doc_len.append(n)
    r_all = np.concatenate(doc_row) if doc_row else np.zeros(0, dtype=np.int64)
    off_all = np.concatenate(doc_off) if doc_off else r_all
    by_place = np.lexsort((off_all, r_all))
    r_all, off_all = r_all[by_place], off_all[by_place]
    docs = (np.concatenate(doc_len) if doc_len else r_all)[by_place]
    doc_offsets = np.concatenate(([0], np.cumsum(np.bincount(r_all, minlength=b - a))))
    # The plan's promise, checked: the documents of each row tile it from 0 to its fill, without gap or
    # overlap, so every token place of the shard was written exactly once.
    ends = np.cumsum(docs)
    before_in_row = np.repeat(np.concatenate(([0], ends))[doc_offsets[:-1]], np.diff(doc_offsets))
    tiled = np.array_equal(off_all, ends - docs - before_in_row)
    filled = np.array_equal(np.bincount(r_all, weights=docs, minlength=b - a).astype(np.int64), fills)
    if not (tiled and filled):
        raise AssertionError(
            f"output shard {o}: the placed documents do not tile its rows; the placement files do not match the plan"
        )
    tok = pa.array(row_base.astype(np.int32))
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(tok, pa.array(ids_out)),
            "labels": pa.ListArray.from_arrays(tok, pa.array(labels_out)),
            "seq_lengths": pa.ListArray.from_arrays(
                pa.array(doc_offsets.astype(np.int32)), pa.array(docs.astype(np.int32))
            ),
        }
    )
    for key, column in token_out.items():
        table = table.append_column(key, pa.ListArray.from_arrays(tok, pa.array(column)))
    if image_schema is not None:  # each row: its documents' images, in document order
        from padless.batching.image_rows import pack_image_column

        placed = pa.concat_tables(image_parts).take(pa.array(by_place)) if image_parts else None
        for name in image_schema.names:
            if placed is None or pa.types.is_null(image_schema.field(name).type):
                table = table.append_column(name, pa.nulls(b - a, image_schema.field(name).type))
                continue
            column = placed.column(name).combine_chunks()
            table = table.append_column(
                name, pack_image_column(column, name, np.arange(len(column)), r_all, b - a, image_schema.names)
            )
    path = out / SHARD_PATTERN.format(o)
    # No dictionary encoding: token ids rarely fit a dictionary page, and trying costs memory.
    atomic_write(path, lambda f: pq.write_table(table, f, row_group_size=ROW_GROUP, use_dictionary=False))
    return {
        "file": path.name,
        "rows": b - a,
        "tokens": int(ids_out.size),
        "documents": int(docs.size),
        "blake2b": checksum(path),
    }
