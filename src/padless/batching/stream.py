"""Streaming packing: an iterable of tokenized examples -> packed rows, with a bounded buffer and exact resume.

The offline planner (:func:`padless.plan_packs`) needs every length up front. Here examples arrive one
by one (a streaming ``datasets`` dataset, a generator, a file too large for memory) and rows leave as
they are decided by the buffered planner (:mod:`padless.planning.buffered`: best fit within a buffer of
``buffer_size`` sequences; full rows leave, under-full ones wait for partners, everything is flushed at
the end; overlong sequences follow ``overlong`` and are counted). Only the buffered examples' tokens
are held: at most ``buffer_size`` sequences (plus the pieces of one split sequence).

Rows are features that :class:`padless.PackingCollator` places without re-planning: ``input_ids`` and
``labels`` (the row's documents concatenated; labels unshifted, the collator masks each document's
first one) and ``seq_lengths`` (the documents' lengths), int64 arrays (or the stream's ``dtype``).

Examples may carry a vision-language processor's outputs (``pixel_values``, ``image_grid_thw``,
``mm_token_type_ids``...): a row carries its documents' images concatenated in document order
(:mod:`padless.batching.image_rows`); a document with images is placed whole and an overlong one is
refused unless ``overlong="drop"`` (counted in :attr:`PackedStream.dropped_images`).

Exact resume: :meth:`PackedStream.state_dict` holds *positions*, never tokens: the number of examples
read, ``(position, start, length)`` of every piece still buffered or decided but not yet yielded (at
most ``buffer_size`` plus one round of rows), the counters, and where to re-open the source (a
position, or the source's own ``state_dict`` for a ``datasets.IterableDataset``). That is some tens of
KB at ``buffer_size=4096`` where the buffered tokens would be megabytes, and it is JSON-serialisable.
:meth:`~PackedStream.load_state_dict` makes the next iteration re-read the examples from the oldest
buffered one (at most ``max_delay + buffer_size`` examples back) to the saved position, keep the
buffered ones, and continue with exactly the rows an uninterrupted run would have produced. How the
source is re-opened depends on its kind:

* a sequence (``len`` + integer indexing: a list, a ``datasets.Dataset``): by index, cheap;
* an object with ``state_dict``/``load_state_dict`` (a streaming ``datasets.IterableDataset``): its
  state at the oldest buffered position (one snapshot per planning round is kept);
* any other re-iterable: iterated again from the start, skipping what came before (cost ~ its length);
* a one-shot iterator (a generator object) cannot be re-opened: resuming it raises ``ValueError``.

The protocol is torchdata's ``StatefulDataLoader`` one (the dataset implements ``state_dict`` and
``load_state_dict``; torchdata itself is not needed). In a multi-worker ``DataLoader`` each worker packs
a disjoint shard of the source: a sequence is split by index (worker ``w`` of ``W`` takes items
``w, w + W, ...``); a ``datasets.IterableDataset`` splits itself by its file shards (it needs at least
as many shards as workers, else the extra workers get nothing); any other iterable is read in full by
every worker, each keeping every ``W``-th item. Rows never mix workers; each worker's state covers its
own shard only (worker id and count are checked on resume: resume with the same ``num_workers``).
Positions in messages and states count the examples of the worker's shard.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, fields
from itertools import islice
from typing import Any

import numpy as np

from padless.batching.image_rows import IMAGE_COLUMNS, PER_TOKEN_COLUMNS, concat_images, holds_images
from padless.layout import Piece, build_row, check_tokens
from padless.planning.buffered import StreamCounts, StreamOptions, StreamPlanner

STATE_VERSION = 1
"""Bumped whenever the layout of :meth:`PackedStream.state_dict` changes."""


def _as_tokens(example: Any, pos: int, vocab_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """An example's ``input_ids`` and ``labels`` as int32 ``[n]`` arrays (labels default to the ids),
    validated by :func:`padless.layout.check_tokens` against ``vocab_size`` (int32's range without one)."""
    if not isinstance(example, Mapping) or "input_ids" not in example:
        what = f"keys {sorted(example)}" if isinstance(example, Mapping) else f"a {type(example).__name__}"
        raise ValueError(f"example {pos} has no 'input_ids' ({what}); stream tokenized examples")
    # Buffered tokens are kept as int32 (half the memory), so ids must fit in it.
    vocab = 2**31 if vocab_size is None else min(vocab_size, 2**31)
    ids, labels = check_tokens(example["input_ids"], example.get("labels"), vocab_size=vocab, where=f"example {pos}")
    return ids.astype(np.int32), labels.astype(np.int32)


def _images_of(example: Mapping[str, Any], pos: int, n: int) -> dict[str, Any] | None:
    """An example's image inputs (image columns and per-token columns, :mod:`padless.batching.image_rows`),
    ``None`` without images; per-token columns checked to hold one value per token."""
    columns = {k: v for k, v in example.items() if k in IMAGE_COLUMNS and holds_images(v)}
    if not columns:
        return None
    for k in PER_TOKEN_COLUMNS:
        if example.get(k) is not None:
            values = np.asarray(example[k]).reshape(-1)
            if values.size != n:
                raise ValueError(
                    f"example {pos}'s {k!r} has {values.size} values for {n} tokens; it needs one per token"
                )
            columns[k] = values.astype(np.int64)
    return columns


def _row_images(row: tuple[Piece, ...], store: dict[int, list[Any]], dtype: Any) -> dict[str, Any]:
    """A row's image inputs by the rule of :mod:`padless.batching.image_rows` (``{}`` without images):
    per-token columns along the row (0 for documents without images), image columns concatenated in
    document order. A document with images is placed whole, so its pieces are never cut (checked)."""
    held = [(p, s, n) for p, s, n in row if store[p][3] is not None]
    if not held:
        return {}
    out: dict[str, Any] = {}
    for p, s, n in held:
        if s != 0 or n != store[p][0].size:
            raise AssertionError(f"example {p} holds images but a piece of it was cut; the stream places it whole")
    keys = list(dict.fromkeys(k for p, _, _ in held for k in store[p][3]))
    for key in keys:
        if key in PER_TOKEN_COLUMNS:
            images = [store[p][3] for p, _, _ in row]
            parts = [
                im[key] if im is not None and key in im else np.zeros(n, dtype=np.int64)
                for im, (_, _, n) in zip(images, row)
            ]
            out[key] = np.concatenate(parts).astype(dtype)
        else:
            out[key] = concat_images([store[p][3][key] for p, _, _ in held if key in store[p][3]], key, keys)
    return out


def _worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the current ``DataLoader`` worker, ``(0, 1)`` outside one."""
    if "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1


def _splits_itself(source: Any) -> bool:
    """A ``datasets.IterableDataset`` hands each DataLoader worker its own file shards."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(source, datasets.IterableDataset)


class _Reader:
    """One worker's shard of the source, re-openable at a snapshot (see the module docstring)."""

    def __init__(self, source: Any, worker: int, workers: int) -> None:
        self.source, self.worker, self.workers = source, worker, workers
        if isinstance(source, Iterator):
            self.kind = "iterator"
        elif isinstance(source, Sequence) or (
            hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, Mapping)
        ):
            self.kind = "sequence"
        elif (
            hasattr(source, "load_state_dict")
            and hasattr(source, "state_dict")
            and (workers == 1 or _splits_itself(source))
        ):
            self.kind = "stateful"
        elif isinstance(source, Iterable):
            self.kind = "iterable"
        else:
            raise ValueError(f"the source must be iterable, got a {type(source).__name__}")

    def snapshot(self, pos: int) -> Any:
        """Where to re-open so that the next example is the example at ``pos``; called between examples."""
        return self.source.state_dict() if self.kind == "stateful" else pos

    def open(self, pos: int, snapshot: Any) -> Iterator[Any]:
        """Examples from position ``pos`` on (``snapshot`` as made by :meth:`snapshot` at ``pos``)."""
        w, k = self.worker, self.workers
        if self.kind == "sequence":
            return (self.source[i] for i in range(w + pos * k, len(self.source), k))
        if self.kind == "stateful":
            if snapshot is not None:
                self.source.load_state_dict(snapshot)
            return iter(self.source)
        if self.kind == "iterator" and pos:
            raise ValueError(
                "cannot resume a one-shot iterator (a generator): give the stream a re-iterable source "
                "(a list, a datasets.Dataset or IterableDataset, an object with __iter__)"
            )
        return islice(iter(self.source), w + pos * k, None, k)


class PackedStream:
    """Packed rows from an iterable of tokenized examples, resumable (torch-free; see the module docstring).

    ``source`` yields dicts with ``input_ids`` and optional ``labels`` (1-D integer lists, arrays or
    tensors). Iterating yields ``{"input_ids", "labels", "seq_lengths"}`` (``dtype`` arrays) for
    :class:`padless.PackingCollator`. :attr:`counts` totals what was read, yielded, truncated and dropped.
    A torch ``IterableDataset`` of the same is :class:`PackedIterableDataset`.
    """

    def __init__(
        self,
        source: Iterable[Mapping[str, Any]],
        max_length: int,
        *,
        dtype: Any = np.int64,
        vocab_size: int | None = None,
        **options: Any,
    ) -> None:
        self.source = source
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1 (or None), got {vocab_size}")
        self.vocab_size = vocab_size
        """Token ids and labels must lie in ``[0, vocab_size)`` (labels may be -100); None: int32's range."""
        self.dtype = np.dtype(dtype)
        """Integer dtype of the yielded arrays (``padless pack`` uses int32, what it writes)."""
        self.options = StreamOptions(max_length=max_length, **options)
        self._planner = StreamPlanner(self.options)  # the live (or last) pass
        self._resume: dict[str, Any] | None = None
        self.dropped_images = 0
        """Examples with images the overlong policy dropped in the live (or last) pass; their images left with them."""
        self._live: tuple[_Reader, deque[tuple[int, Any]]] | None = None

    @property
    def counts(self) -> StreamCounts:
        return self._planner.counts

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the source if it has ``set_epoch`` (a shuffled ``datasets.IterableDataset``)."""
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        worker, workers = _worker()
        reader = _Reader(self.source, worker, workers)
        self.dropped_images = 0
        planner = StreamPlanner(self.options)
        store: dict[int, list[Any]] = {}  # position -> [input_ids, labels, pieces not yet yielded, images or None]
        state, self._resume = self._resume, None
        start, snap = 0, None
        if state is not None:
            if state["worker"] != [worker, workers]:
                raise ValueError(
                    f"the state was saved by worker {state['worker'][0]} of {state['worker'][1]}; "
                    f"this is worker {worker} of {workers}: resume with the same num_workers"
                )
            planner.load_state_dict(state["planner"])
            start, snap = state["source"]["position"], state["source"]["snapshot"]
        snapshots: deque[tuple[int, Any]] = deque([(start, snap)])  # (position, where to re-open for it)
        self._planner, self._live = planner, (reader, snapshots)
        examples = reader.open(start, snap)
        if state is not None:  # re-read the buffered examples, up to where the state was saved
            need: dict[int, list[int]] = {}  # position -> [pieces, tokens they reach]
            for p, s, n in [*planner.buffer, *(q for r in planner.pending for q in r)]:
                entry = need.setdefault(p, [0, 0])
                entry[0], entry[1] = entry[0] + 1, max(entry[1], s + n)
            for pos in range(start, planner.consumed):
                example = next(examples, None)
                if example is None:
                    raise ValueError(
                        f"the source ended at example {pos}, before the saved position "
                        f"{planner.consumed}: is it the source the state was saved from?"
                    )
                if pos in need:
                    ids, labels = _as_tokens(example, pos, self.vocab_size)
                    kept = min(ids.size, self.options.max_length) if self.options.overlong == "truncate" else ids.size
                    if kept < need[pos][1]:
                        raise ValueError(
                            f"example {pos} has {ids.size} tokens, fewer than the state buffered: "
                            "is it the source the state was saved from?"
                        )
                    store[pos] = [ids[:kept], labels[:kept], need[pos][0], _images_of(example, pos, ids.size)]
        while True:
            while planner.pending:
                yield self._row(planner.pop(), store)
            example = next(examples, None)
            if example is None:
                break
            pos = planner.consumed
            ids, labels = _as_tokens(example, pos, self.vocab_size)
            images = _images_of(example, pos, ids.size)
            if images is not None and ids.size > self.options.max_length:
                if self.options.overlong != "drop":
                    raise ValueError(
                        f"example {pos} holds images and {ids.size} tokens, more than max_length="
                        f"{self.options.max_length}: a document with images is placed whole (cutting it would cut "
                        "its images); raise max_length, drop it (overlong='drop') or shorten its text"
                    )
                self.dropped_images += 1
            rounds = planner.rounds
            kept, made = planner.add(ids.size)
            if made:
                store[pos] = [ids[:kept], labels[:kept], made, images]
            if planner.rounds != rounds and reader.kind == "stateful":
                self._snapshot(reader, snapshots, planner)
        planner.finish()
        while planner.pending:
            yield self._row(planner.pop(), store)

    @staticmethod
    def _snapshot(reader: _Reader, snapshots: deque[tuple[int, Any]], planner: StreamPlanner) -> None:
        """Keep the source's state at this round's end, and drop those no resume can need any more
        (other sources re-open at any position, so they need no snapshots)."""
        snapshots.append((planner.consumed, reader.snapshot(planner.consumed)))
        oldest = planner.oldest()
        while len(snapshots) > 1 and snapshots[1][0] <= oldest:
            snapshots.popleft()

    def _row(self, row: tuple[Piece, ...], store: dict[int, list[Any]]) -> dict[str, np.ndarray]:
        ids, labels, seq_lengths = build_row(row, lambda p: (store[p][0], store[p][1]), dtype=self.dtype)
        images = _row_images(row, store, self.dtype)
        for p, _, _ in row:  # forget an example once its last piece has left
            store[p][2] -= 1
            if not store[p][2]:
                del store[p]
        return {"input_ids": ids, "labels": labels, "seq_lengths": seq_lengths, **images}

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: positions, counters and a source snapshot; JSON-serialisable when the
        source's own state is. Taken between rows, it resumes after the last row yielded."""
        if self._resume is not None:
            return self._resume
        if self._live is None:  # nothing read yet
            return {
                "version": STATE_VERSION,
                "options": asdict(self.options),
                "worker": list(_worker()),
                "source": {"position": 0, "snapshot": None},
                "planner": StreamPlanner(self.options).state_dict(),
            }
        reader, snapshots = self._live
        oldest = self._planner.oldest()
        if reader.kind == "stateful":
            position, snapshot = max((s for s in snapshots if s[0] <= oldest), key=lambda s: s[0])
        else:
            position, snapshot = oldest, oldest
        return {
            "version": STATE_VERSION,
            "options": asdict(self.options),
            "worker": [reader.worker, reader.workers],
            "source": {"position": position, "snapshot": snapshot},
            "planner": self._planner.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the next iteration from ``state`` (from :meth:`state_dict` of a stream with equal options)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r} is not {STATE_VERSION}")
        saved = state["options"]
        for f in fields(StreamOptions):
            if saved.get(f.name) != getattr(self.options, f.name):
                raise ValueError(
                    f"the state was saved with {f.name}={saved.get(f.name)!r}; this stream has "
                    f"{f.name}={getattr(self.options, f.name)!r}"
                )
        self._resume = dict(state)
        self._planner = StreamPlanner(self.options)
        self._planner.load_state_dict(state["planner"])


def _torch_dataset_class() -> type:
    from torch.utils.data import IterableDataset

    class PackedIterableDataset(PackedStream, IterableDataset):  # type: ignore[misc]
        """:class:`PackedStream` as a ``torch.utils.data.IterableDataset`` (``DataLoader`` with
        ``batch_size=None`` or a collator such as :class:`padless.PackingCollator`; resumable through
        ``state_dict``/``load_state_dict``, the ``StatefulDataLoader`` protocol)."""

    PackedIterableDataset.__module__ = __name__
    PackedIterableDataset.__qualname__ = "PackedIterableDataset"
    return PackedIterableDataset


def __getattr__(name: str) -> Any:
    # The torch subclass is built on first use, so that `padless pack` and the planner never import torch.
    if name == "PackedIterableDataset":
        cls = _torch_dataset_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
