"""``pack_dataset`` of a streaming dataset: an ``IterableDataset`` (or ``IterableDatasetDict``) packed
as it streams, into an ``IterableDataset`` with the same columns plus ``seq_lengths``.

How (:mod:`padless.integrations.datasets`' docstring says what is promised): by default padless'
streaming planner (:class:`padless.planning.buffered.StreamPlanner`, a bounded buffer); ``wrapped``
cut as it streams (the offline rows exactly); with ``map_kwargs={"batch_size": N}`` each run of ``N``
sequences planned on its own (:func:`padless.integrations.dataset_plans.plan_lengths`). An example's
columns are held only until its last piece has left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from padless.integrations.dataset_plans import (
    datasets_module,
    log_dropped_images,
    log_stats,
    plan_lengths,
    resolve_strategy,
)

STREAM_PLANNERS: dict[str, str] = {
    "best_fit_decreasing": "buffered",
    "histogram_best_fit": "buffered",
    "wrapped": "wrapped",
}
"""padless planner -> how an ``IterableDataset`` is packed without ``map_kwargs["batch_size"]``:
``buffered`` (:class:`padless.planning.buffered.StreamPlanner`) or ``wrapped`` (cut as it streams,
the offline rows exactly). Other planners need a ``batch_size``."""


def pack_stream(
    dataset: Any, seq_length: int, strategy: str, overlong: str | None, batch_size: int | None, buffer_size: int
) -> Any:
    """An ``IterableDataset`` of the packed rows of a streaming one (see the module docstring)."""
    from datasets.iterable_dataset import ExamplesIterable

    from padless.planning.buffered import StreamOptions

    datasets = datasets_module()
    planner, policy = resolve_strategy(strategy, overlong)
    if batch_size is None:
        if planner not in STREAM_PLANNERS:
            raise ValueError(
                f"strategy={strategy!r} plans a whole dataset; on an IterableDataset pass "
                "map_kwargs={'batch_size': N} (each N sequences planned on their own), or choose "
                f"one of {', '.join(['bfd', 'bfd_split', *STREAM_PLANNERS])}"
            )
        if STREAM_PLANNERS[planner] == "buffered":
            StreamOptions(max_length=seq_length, buffer_size=buffer_size, overlong=policy)  # type: ignore[arg-type]
    features = dataset.features
    out_features = None
    if features is not None:
        if "seq_lengths" in features:
            raise ValueError("the dataset already has a 'seq_lengths' column: it is packed already")
        out_features = datasets.Features({**features, "seq_lengths": datasets.List(datasets.Value("int32"))})
    job = _StreamJob(
        dataset.with_format(None),
        seq_length,
        strategy,
        planner,
        overlong,
        policy,
        batch_size,
        buffer_size,
        None if features is None else list(features),
    )
    packed = datasets.IterableDataset(
        ExamplesIterable(_stream_examples, {"job": job}),
        info=datasets.DatasetInfo(features=out_features),
        split=dataset.split,
    )
    fmt = dataset._formatting.format_type if dataset._formatting is not None else None
    return packed.with_format(fmt) if fmt else packed


def _stream_examples(job: _StreamJob) -> Any:
    yield from enumerate(job.rows())


class _StreamJob:
    """One streaming pack: reads the source once per pass, holds only the buffered examples' columns."""

    def __init__(
        self,
        source: Any,
        seq_length: int,
        strategy: str,
        planner: str,
        overlong: str | None,
        policy: str,
        batch_size: int | None,
        buffer_size: int,
        names: list[str] | None,
    ) -> None:
        self.source, self.seq_length, self.strategy, self.planner = source, seq_length, strategy, planner
        self.overlong, self.policy, self.batch_size, self.buffer_size = overlong, policy, batch_size, buffer_size
        self.names = names
        self.dropped_images = 0
        """Documents with images the overlong policy dropped in the last pass."""

    def rows(self) -> Any:
        from padless.planning.buffered import StreamCounts

        counts = StreamCounts()
        self.dropped_images = 0
        names = self.names
        store: dict[int, list[Any]] = {}  # position -> [columns, pieces not yet yielded]

        def examples() -> Any:
            nonlocal names
            for pos, example in enumerate(self.source):
                if names is None:
                    names = list(example)
                    if "seq_lengths" in names:
                        raise ValueError("the dataset already has a 'seq_lengths' column: it is packed already")
                columns, n = _stream_columns(pos, example, names)
                counts.sequences += 1
                counts.tokens_in += n
                if n > self.seq_length and self.policy == "error":
                    raise ValueError(
                        f"example {pos} has {n} tokens, longer than seq_length={self.seq_length}; "
                        f"trl.pack_dataset's 'bfd' would silently cut {n - self.seq_length} of them. "
                        "Choose overlong='truncate' (the same cut, counted), 'split' (keep every "
                        "token, as separate documents) or 'drop'"
                    )
                if n > self.seq_length and _holds_images(columns):
                    if self.policy != "drop":
                        raise ValueError(
                            f"example {pos} holds images and {n} tokens, longer than seq_length="
                            f"{self.seq_length}: a document with images is placed whole (cutting it would cut "
                            "its images); raise seq_length, drop it (overlong='drop') or shorten its text"
                        )
                    self.dropped_images += 1
                yield pos, columns, n

        if self.batch_size is not None:
            pieces = self._batched(examples(), store, counts)
        elif STREAM_PLANNERS[self.planner] == "wrapped":
            pieces = self._wrapped(examples(), store)
        else:
            pieces = self._buffered(examples(), store, counts)
        for row in pieces:
            counts.rows += 1
            counts.pieces += len(row)
            counts.tokens_out += sum(n for _, _, n in row)
            counts.max_per_row = max(counts.max_per_row, len(row))
            yield _stream_row(row, store, names or [])
        log_stats(counts.plan_stats(self.seq_length), self.seq_length, "pack_dataset (streaming)")
        log_dropped_images(self.dropped_images, "pack_dataset (streaming)")

    def _buffered(self, examples: Any, store: dict[int, list[Any]], counts: Any) -> Any:
        from padless.planning.buffered import StreamOptions, StreamPlanner

        planner = StreamPlanner(
            StreamOptions(max_length=self.seq_length, buffer_size=self.buffer_size, overlong=self.policy)
        )  # type: ignore[arg-type]  #
        for pos, columns, n in examples:
            _, made = planner.add(n)
            if made:
                store[pos] = [columns, made]
            while planner.pending:
                yield planner.pop()
        planner.finish()
        while planner.pending:
            yield planner.pop()
        c = planner.counts
        counts.truncated_sequences, counts.truncated_tokens = c.truncated_sequences, c.truncated_tokens
        counts.dropped_sequences, counts.dropped_tokens = c.dropped_sequences, c.dropped_tokens
        counts.split_sequences = c.split_sequences

    def _wrapped(self, examples: Any, store: dict[int, list[Any]]) -> Any:
        """The offline ``wrapped`` rows, as the stream arrives: a sequence cut at a row's end continues
        at the start of the next row as its own document."""
        cap, row, fill = self.seq_length, [], 0
        for pos, columns, n in examples:
            cuts, s, room = [], 0, cap - fill
            while s < n:
                take = min(n - s, room)
                cuts.append((pos, s, take))
                s, room = s + take, cap
            store[pos] = [columns, len(cuts)]
            for piece in cuts:
                row.append(piece)
                fill += piece[2]
                if fill == cap:
                    yield tuple(row)
                    row, fill = [], 0
        if row:
            yield tuple(row)

    def _batched(self, examples: Any, store: dict[int, list[Any]], counts: Any) -> Any:
        """Each run of ``batch_size`` sequences planned on its own, as :func:`plan_lengths` plans a
        ``Dataset`` with the same ``batch_size``."""
        chunk: list[tuple[int, Any, int]] = []

        def plan() -> Any:
            lengths = np.array([n for _, _, n in chunk], dtype=np.int64)
            p = plan_lengths(lengths, self.seq_length, self.strategy, overlong=self.overlong)
            st = p.stats
            counts.truncated_sequences += st.truncated_sequences
            counts.truncated_tokens += st.truncated_tokens
            counts.dropped_sequences += st.dropped_sequences
            counts.dropped_tokens += st.dropped_tokens
            counts.split_sequences += st.split_sequences
            made = np.bincount(p.index, minlength=len(chunk))
            for i, (pos, columns, _) in enumerate(chunk):
                if made[i]:
                    store[pos] = [columns, int(made[i])]
            for r in range(p.num_rows):
                lo, hi = int(p.row_offsets[r]), int(p.row_offsets[r + 1])
                yield tuple((chunk[int(p.index[j])][0], int(p.start[j]), int(p.length[j])) for j in range(lo, hi))
            chunk.clear()

        for item in examples:
            chunk.append(item)
            if len(chunk) == self.batch_size:
                yield from plan()
        if chunk:
            yield from plan()


def _stream_columns(pos: int, example: Any, names: list[str]) -> tuple[dict[str, list[Any]], int]:
    """An example's columns as lists, checked as :func:`padless.integrations.datasets._list_columns`
    checks a table's."""
    if not isinstance(example, Mapping) or list(example) != names:
        got = list(example) if isinstance(example, Mapping) else type(example).__name__
        raise ValueError(f"example {pos} has columns {got}, the stream {names}")
    from padless.batching.image_rows import IMAGE_COLUMNS, PER_TOKEN_COLUMNS

    columns, n, unmarked = {}, None, []
    for name in names:
        value = example[name]
        if name in IMAGE_COLUMNS:  # one value per document (None: no images), packed by _stream_row
            columns[name] = value
            continue
        if value is None and name in PER_TOKEN_COLUMNS:  # a document without images marks no image token
            unmarked.append(name)
            continue
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or getattr(value, "ndim", 1) != 1:
            raise ValueError(
                f"column {name!r} of example {pos} is a {type(value).__name__}, not a list per row; "
                "pack_dataset packs token columns only (select them first: "
                "dataset.select_columns([...]))"
            )
        values = value.tolist() if hasattr(value, "tolist") else list(value)
        if n is None:
            n = len(values)
        elif len(values) != n:
            raise ValueError(
                f"column {name!r} has {len(values)} values in example {pos} but {names[0]!r} has {n}; "
                "every column must match the first, row by row"
            )
        columns[name] = values
    for name in unmarked:
        columns[name] = [0] * (n or 0)
    if not n:
        raise ValueError(
            f"example {pos} of the stream is an empty sequence ({names[0]!r} has no tokens); every "
            "sequence needs at least one token: filter them out first, e.g. "
            f"dataset.filter(lambda r: len(r[{names[0]!r}]) > 0)"
        )
    return columns, n


def _holds_images(columns: Mapping[str, Any]) -> bool:
    from padless.batching.image_rows import IMAGE_COLUMNS, holds_images

    return any(holds_images(v) for k, v in columns.items() if k in IMAGE_COLUMNS)


def _stream_row(row: tuple[tuple[int, int, int], ...], store: dict[int, list[Any]], names: list[str]) -> dict[str, Any]:
    """The row's pieces, every token column concatenated alike, image columns by the rule of
    :mod:`padless.batching.image_rows`, plus ``seq_lengths``; an example is forgotten once its last
    piece has left."""
    from padless.batching.image_rows import IMAGE_COLUMNS, concat_images, holds_images

    tokens = [name for name in names if name not in IMAGE_COLUMNS]
    out: dict[str, Any] = {name: [] for name in names}
    for pos, start, n in row:
        columns = store[pos][0]
        for name in tokens:
            out[name].extend(columns[name][start : start + n])
        if _holds_images(columns):
            full = len(columns[tokens[0]])
            if start != 0 or n != full:
                raise ValueError(
                    f"example {pos} holds images and the stream's plan cuts it to tokens [{start}, {start + n}) of "
                    f"{full}: a document with images is placed whole; raise seq_length, or choose a strategy "
                    "that keeps documents whole (not 'wrapped')"
                )
            for name in names:
                if name in IMAGE_COLUMNS and holds_images(columns[name]):
                    out[name].append(columns[name])
        store[pos][1] -= 1
        if not store[pos][1]:
            del store[pos]
    for name in names:
        if name in IMAGE_COLUMNS:
            out[name] = concat_images(out[name], name, names) if out[name] else None
    out["seq_lengths"] = [n for _, _, n in row]
    return out
