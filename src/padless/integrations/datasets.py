"""``pack_dataset``: a drop-in for ``trl.pack_dataset``, planned by padless over the whole dataset
(or, for a streaming dataset, through a bounded buffer).

Same arguments and the same output as TRL 1.16's ``pack_dataset(dataset, seq_length, strategy,
map_kwargs)``: a ``Dataset`` (or ``DatasetDict``) whose rows are packed rows of at most
``seq_length`` tokens, every column packed alike, plus ``seq_lengths`` (the documents of each row)::

    dataset   input_ids [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]     seq_length 4, overlong="truncate"
    packed    input_ids [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]]
              seq_lengths [[4], [3, 1], [2]]

What differs, on purpose:

* The plan covers the whole dataset (TRL plans inside ``datasets.map`` batches of 1,000 rows by
  default, so rows from different batches never share a row), with padless' best fit decreasing.
* Nothing is lost silently. TRL's ``"bfd"`` cuts every sequence longer than ``seq_length`` and drops
  the overflow; here an overlong sequence raises unless ``overlong`` says what to do (``"truncate"``,
  TRL's choice, ``"split"`` or ``"drop"``), and whatever is cut or dropped is counted in the plan
  (:func:`plan_dataset`) and logged as a warning. ``"bfd_split"`` means ``overlong="split"``.
* ``"wrapped"`` keeps document boundaries: a sequence cut at a row's end continues in the next row as
  its own document, and every row has ``seq_lengths``. (TRL's wrapped rows have none: the sequences of
  a row attend to each other.)

A ``datasets.IterableDataset`` (or ``IterableDatasetDict``) is packed as it streams, into an
``IterableDataset`` with the same columns (TRL packs one by ``datasets.map`` batches of 1,000 rows):

* by default with padless' streaming planner (:mod:`padless.planning.buffered`, best fit within a
  buffer of ``buffer_size`` sequences; full rows leave, the rest wait for partners, all is flushed at
  the end), so rows are not those of the offline plan: the same documents, grouped within the
  buffer's reach, in the order they leave it. ``"wrapped"`` streams exactly the offline rows;
* with ``map_kwargs={"batch_size": N}``, each run of ``N`` sequences is planned on its own, as for a
  ``Dataset`` with the same ``batch_size``: the very same rows, in the same order.

What was truncated or dropped is counted and logged at the end of each pass over the stream. The
stream is read lazily, so an overlong or empty sequence is refused when it is read, naming its
position; the packed stream is one shard (``datasets`` gives further ``DataLoader`` workers nothing).

Vision-language columns travel with their documents (:mod:`padless.batching.image_rows`): a row's
``pixel_values``, ``image_grid_thw`` and the like are its documents' images concatenated in document
order (null for a row without images), per-token columns (``mm_token_type_ids``) are packed like
``input_ids``; a document with images is placed whole (a plan that would cut it is refused naming it),
and one the overlong policy drops takes its images with it (counted in the warning).

Every token of every column lands in exactly one row, in order within its sequence. An empty sequence
is refused naming its row, as the collators refuse it. The rows train exactly with :class:`padless.PackingCollator`
on any backend padless accepts, and with TRL's own ``SFTTrainer(padding_free=True)`` where that path
is isolated (docs/integrations/exactness.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from padless.planning.checks import OVERLONG_DEFAULT
from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs

logger = logging.getLogger(__name__)

TRL_STRATEGIES: dict[str, tuple[str, str | None]] = {
    "bfd": ("best_fit_decreasing", None),
    "bfd_split": ("best_fit_decreasing", "split"),
    "wrapped": ("wrapped", "split"),
}
"""TRL's strategy name -> (padless planner, the overlong policy the name implies; None: ``overlong``)."""

MAP_KWARGS = ("batch_size", "num_proc", "desc", "keep_in_memory", "load_from_cache_file")
"""``map_kwargs`` keys accepted for TRL compatibility (the packing is not a ``datasets.map``):
``batch_size`` plans each batch of that many rows on its own, as TRL does; ``num_proc`` must be
None or 1; the rest change nothing (the result is built in memory)."""


def resolve_strategy(strategy: str, overlong: str | None) -> tuple[str, str]:
    """``(padless strategy, overlong policy)`` for a TRL or padless ``strategy`` name.

    ``overlong=None`` means ``"error"`` unless the strategy implies a policy (``bfd_split`` and
    ``wrapped`` split); an ``overlong`` that contradicts the strategy is refused.
    """
    if strategy in TRL_STRATEGIES:
        planner, implied = TRL_STRATEGIES[strategy]
    elif strategy in STRATEGIES:
        planner, implied = strategy, ("split" if strategy == "wrapped" else None)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join([*TRL_STRATEGIES, *STRATEGIES])}")
    if overlong is not None and overlong not in OVERLONG_POLICIES:
        raise ValueError(f"unknown overlong policy {overlong!r}; choose one of {', '.join(OVERLONG_POLICIES)}")
    if implied is not None and overlong not in (None, implied):
        raise ValueError(
            f"strategy={strategy!r} splits overlong sequences; it cannot be combined with "
            f"overlong={overlong!r} (use strategy='bfd' for that)"
        )
    return planner, overlong or implied or OVERLONG_DEFAULT


def plan_lengths(
    lengths: Sequence[int] | np.ndarray,
    seq_length: int,
    strategy: str = "bfd",
    *,
    overlong: str | None = None,
    batch_size: int | None = None,
) -> PackPlan:
    """The plan :func:`pack_dataset` uses for sequences of ``lengths`` (zeros allowed: an empty
    sequence appears in no row). ``batch_size`` plans each run of that many sequences on its own."""
    planner, policy = resolve_strategy(strategy, overlong)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {lengths.shape}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"map_kwargs['batch_size'] must be a positive integer or None, got {batch_size!r}")
    step = batch_size or max(1, lengths.size)
    plans = []
    for begin in range(0, lengths.size, step):
        chunk = lengths[begin : begin + step]
        keep = np.flatnonzero(chunk > 0)
        try:
            plan = plan_packs(chunk[keep], seq_length, strategy=planner, overlong=policy)  # type: ignore[arg-type]
        except ValueError as exc:
            if policy == "error" and "longer than max_length" in str(exc):
                raise ValueError(_overlong_message(lengths, seq_length)) from None
            raise
        plans.append((begin + keep, plan))
    return _concatenate(plans, seq_length, lengths.size)


def _overlong_message(lengths: np.ndarray, seq_length: int) -> str:
    long = lengths > seq_length
    first = int(np.flatnonzero(long)[0])
    lost = int((lengths[long] - seq_length).sum())
    return (
        f"sequences longer than seq_length={seq_length}: {int(long.sum())} (the first is row {first}, "
        f"{int(lengths[first])} tokens); trl.pack_dataset's 'bfd' would silently cut {lost} of their tokens. "
        "Choose overlong='truncate' (the same cut, counted), 'split' (keep every token, as separate "
        "documents) or 'drop'"
    )


def _concatenate(plans: list[tuple[np.ndarray, PackPlan]], seq_length: int, num_sequences: int) -> PackPlan:
    """One plan over the whole dataset from plans of subsets (``rows[i]`` of a subset plan is dataset
    row ``rows[i]``), rows in subset order."""
    if not plans:
        return PackPlan(
            max_length=seq_length, num_sequences=num_sequences, index=[], start=[], length=[], row_offsets=[0]
        )
    offsets, pieces = [np.zeros(1, dtype=np.int64)], 0
    for _, plan in plans:
        offsets.append(plan.row_offsets[1:] + pieces)
        pieces += plan.index.size
    return PackPlan(
        max_length=seq_length,
        num_sequences=num_sequences,
        index=np.concatenate([rows[p.index] for rows, p in plans]),
        start=np.concatenate([p.start for _, p in plans]),
        length=np.concatenate([p.length for _, p in plans]),
        row_offsets=np.concatenate(offsets),
        dropped=np.concatenate([rows[p.dropped] for rows, p in plans]),
        truncated=np.concatenate([rows[p.truncated] for rows, p in plans]),
        truncated_tokens=sum(p.truncated_tokens for _, p in plans),
        dropped_tokens=sum(p.dropped_tokens for _, p in plans),
    )


def sequence_lengths(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """int64 ``[n]``: tokens of ``column`` in every row of a ``datasets.Dataset`` (read from the Arrow
    offsets, without decoding rows) or of a sequence of mappings."""
    if hasattr(dataset, "with_format") and hasattr(dataset, "column_names"):
        if column not in dataset.column_names:
            raise ValueError(f"the dataset has no {column!r} column (columns: {dataset.column_names})")
        pc = _require("pyarrow.compute")
        values = dataset.with_format("arrow")[:][column]
        return pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.fromiter((len(row[column]) for row in dataset), dtype=np.int64, count=len(dataset))


def _require(module: str) -> Any:
    from padless._optional import require

    return require(module, "padless.integrations.datasets")


def _check_map_kwargs(map_kwargs: Mapping[str, Any] | None) -> int | None:
    """The ``batch_size`` to plan with (None: the whole dataset); refuses what cannot be honoured."""
    map_kwargs = dict(map_kwargs or {})
    unknown = sorted(set(map_kwargs) - set(MAP_KWARGS))
    if unknown:
        raise ValueError(
            f"map_kwargs {unknown} are not supported (padless packs without datasets.map); "
            f"accepted: {', '.join(MAP_KWARGS)}"
        )
    if map_kwargs.get("num_proc") not in (None, 1):
        raise ValueError(
            f"map_kwargs['num_proc']={map_kwargs['num_proc']!r}: padless plans the whole dataset in "
            "one process (a million sequences in well under a second); leave num_proc unset"
        )
    return map_kwargs.get("batch_size")


def _list_columns(table: Any) -> tuple[list[Any], np.ndarray]:
    """The table's token columns as single list arrays, and the per-row lengths they share (image
    columns, :data:`padless.batching.image_rows.IMAGE_COLUMNS`, are left to :func:`_image_columns`)."""
    from padless.batching.image_rows import IMAGE_COLUMNS, PER_TOKEN_COLUMNS

    pa = _require("pyarrow")
    columns: dict[str, Any] = {}
    lengths = None
    # per-token vision columns last: a null one (a document without images) is filled to the tokens' length
    named = sorted(zip(table.column_names, table.columns), key=lambda nc: nc[0] in PER_TOKEN_COLUMNS)
    first = next((n for n, _ in named if n not in IMAGE_COLUMNS), None)
    for name, column in named:
        if name in IMAGE_COLUMNS:
            continue
        array = _single(column)
        if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
            raise ValueError(
                f"column {name!r} is {array.type}, not a list per row; pack_dataset packs token columns "
                "only (select them first: dataset.select_columns([...]))"
            )
        if array.null_count and name in PER_TOKEN_COLUMNS and lengths is not None:
            array = _zeros_where_null(array, lengths)  # a document without images marks no image token
        if array.null_count:
            raise ValueError(f"column {name!r} has {array.null_count} missing rows")
        own = np.diff(np.asarray(array.offsets, dtype=np.int64))
        if lengths is None:
            lengths = own
        elif not np.array_equal(own, lengths):
            row = int(np.flatnonzero(own != lengths)[0])
            raise ValueError(
                f"column {name!r} has {int(own[row])} values in row {row} but {first!r} "
                f"has {int(lengths[row])}; every column must match the first, row by row"
            )
        columns[name] = array
    ordered = [columns[n] for n in table.column_names if n in columns]
    return ordered, (np.zeros(0, dtype=np.int64) if lengths is None else lengths)


def _zeros_where_null(array: Any, lengths: np.ndarray) -> Any:
    """A per-token list column with its null rows (documents without images) filled with zeros, as many
    as the row's tokens."""
    pa = _require("pyarrow")
    null = np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    flat = array.flatten()  # the non-null rows' values, in order
    own = np.where(null, 0, np.diff(np.asarray(array.offsets, dtype=np.int64)))
    starts = np.where(null, len(flat), np.concatenate(([0], np.cumsum(own)[:-1])))
    values = pa.concat_arrays(
        [flat, pa.array(np.zeros(int(lengths.max(initial=0)), dtype=flat.type.to_pandas_dtype()))]
    )
    pieces = pa.LargeListViewArray.from_arrays(pa.array(starts), pa.array(lengths), values).flatten()
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pieces, type=array.type)


def _single(column: Any) -> Any:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _image_columns(table: Any) -> dict[str, Any]:
    """The table's image columns (one value per document: its processor output, null or empty without
    images), as single arrays."""
    from padless.batching.image_rows import IMAGE_COLUMNS

    return {name: _single(c) for name, c in zip(table.column_names, table.columns) if name in IMAGE_COLUMNS}


def _pack_images(images: dict[str, Any], plan: PackPlan, lengths: np.ndarray, name: Any) -> tuple[list[Any], int]:
    """The image columns packed like the plan's rows (each row its documents' images in order, null
    without), and the documents with images the plan dropped; refuses a plan that cuts one."""
    from padless.batching.image_rows import documents_with_images, pack_image_column, require_whole

    if not images:
        return [], 0
    held = documents_with_images(images.values(), lengths.size)
    require_whole(plan.index, plan.start, plan.length, lengths, held, name)
    rows = np.repeat(np.arange(plan.num_rows), np.diff(plan.row_offsets))
    packed = [pack_image_column(a, key, plan.index, rows, plan.num_rows, images) for key, a in images.items()]
    return packed, int(held[plan.dropped].sum())


def _refuse_empty(lengths: np.ndarray, column: str) -> None:
    """An empty sequence is refused naming its row, as the collators refuse it."""
    if lengths.size and int(lengths.min()) == 0:
        empty = np.flatnonzero(lengths == 0)
        more = f" (and {empty.size - 1} more)" if empty.size > 1 else ""
        raise ValueError(
            f"row {int(empty[0])} of the dataset is an empty sequence ({column!r} has no tokens){more}; "
            "every sequence needs at least one token: filter them out first, e.g. "
            f"dataset.filter(lambda r: len(r[{column!r}]) > 0)"
        )


def _pack_column(array: Any, plan: PackPlan, row_offsets: np.ndarray) -> Any:
    """``array`` (a list column) rearranged into the plan's rows: each piece is a list view into the
    original values, flattened once in row order."""
    import pyarrow as pa

    large = pa.types.is_large_list(array.type)
    offset_type = np.int64 if large else np.int32
    starts = np.asarray(array.offsets, dtype=np.int64)[:-1][plan.index] + plan.start
    view_cls = pa.LargeListViewArray if large else pa.ListViewArray
    pieces = view_cls.from_arrays(
        pa.array(starts.astype(offset_type)), pa.array(plan.length.astype(offset_type)), array.values
    )
    list_cls = pa.LargeListArray if large else pa.ListArray
    return list_cls.from_arrays(pa.array(row_offsets.astype(offset_type)), pieces.flatten(), type=array.type)


def _pack_split(
    dataset: Any, seq_length: int, strategy: str, overlong: str | None, batch_size: int | None
) -> tuple[Any, PackPlan]:
    import pyarrow as pa

    datasets = _datasets()
    if "seq_lengths" in dataset.column_names:
        raise ValueError("the dataset already has a 'seq_lengths' column: it is packed already")
    table = dataset.with_format("arrow")[:]
    columns, lengths = _list_columns(table)
    if not columns:
        raise ValueError("the dataset has no columns to pack")
    images = _image_columns(table)
    names = [n for n in table.column_names if n not in images]
    _refuse_empty(lengths, names[0])
    plan = plan_lengths(lengths, seq_length, strategy, overlong=overlong, batch_size=batch_size)
    packed_images, dropped_images = _pack_images(images, plan, lengths, lambda d: f"row {d} of the dataset")
    cum = np.concatenate(([0], np.cumsum(plan.length)))
    row_offsets = cum[plan.row_offsets]  # token offset of every row
    if row_offsets[-1] >= 2**31 and any(pa.types.is_list(c.type) for c in columns):
        raise ValueError(
            f"{int(row_offsets[-1])} tokens do not fit list<> offsets (int32); cast the columns to large_list first"
        )
    packed = [_pack_column(c, plan, row_offsets) for c in columns]
    docs = pa.ListArray.from_arrays(pa.array(plan.row_offsets.astype(np.int32)), pa.array(plan.length.astype(np.int32)))
    out = pa.Table.from_arrays([*packed, *packed_images, docs], names=[*names, *images, "seq_lengths"])
    out = out.select([*table.column_names, "seq_lengths"])
    features = datasets.Features({**dataset.features, "seq_lengths": datasets.List(datasets.Value("int32"))})
    info = datasets.DatasetInfo(features=features)
    # A fingerprint from the input's and the arguments: left to datasets, it would pickle every token to hash it.
    from padless._version import __version__

    fingerprint = datasets.fingerprint.Hasher.hash(
        ("padless.pack_dataset", __version__, dataset._fingerprint, seq_length, strategy, overlong, batch_size)
    )
    result = datasets.Dataset(
        datasets.table.InMemoryTable(out), info=info, split=dataset.split, fingerprint=fingerprint
    )
    _log(plan, dropped_images)
    return _restore_format(result, dataset.format), plan


def _restore_format(packed: Any, fmt: Mapping[str, Any]) -> Any:
    fmt = dict(fmt)
    fmt.update(fmt.pop("format_kwargs", {}) or {})
    if fmt.get("columns") is not None:
        fmt["columns"] = [*fmt["columns"], "seq_lengths"]
    return packed.with_format(**fmt)


def _log(plan: PackPlan, dropped_images: int = 0) -> None:
    _log_stats(plan.stats, plan.max_length)
    _log_dropped_images(dropped_images)


def _log_dropped_images(documents: int, what: str = "pack_dataset") -> None:
    if documents:
        logger.warning("%s: %d dropped documents held images; their images left with them", what, documents)


def _log_stats(s: Any, max_length: int, what: str = "pack_dataset") -> None:
    logger.info(
        "%s: %d sequences -> %d rows (lower bound %d), efficiency %.4f",
        what,
        s.num_sequences,
        s.num_rows,
        s.lower_bound,
        s.efficiency,
    )
    if s.truncated_tokens or s.dropped_tokens:
        logger.warning(
            "%s: sequences longer than seq_length=%d: truncated %d (%d tokens lost), dropped %d (%d tokens)",
            what,
            max_length,
            s.truncated_sequences,
            s.truncated_tokens,
            s.dropped_sequences,
            s.dropped_tokens,
        )


def _datasets() -> Any:
    datasets = _require("datasets")
    _require("datasets.table")
    _require("datasets.fingerprint")
    return datasets


def _each_split(dataset: Any, fn: Any, stream: Any = None) -> Any:
    """``fn`` on each split of a ``Dataset`` / ``DatasetDict`` (a dict per split), ``stream`` on each
    split of an ``IterableDataset`` / ``IterableDatasetDict`` (an ``IterableDatasetDict`` per split)."""
    datasets = _datasets()
    if isinstance(dataset, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        if stream is None:
            raise ValueError(
                "plan_dataset needs every length up front and cannot take an IterableDataset; "
                "pack_dataset packs one as it streams (and logs what it truncated or dropped)"
            )
        if isinstance(dataset, datasets.IterableDatasetDict):
            return datasets.IterableDatasetDict({name: stream(split) for name, split in dataset.items()})
        return stream(dataset)
    if isinstance(dataset, datasets.DatasetDict):
        return {name: fn(split) for name, split in dataset.items()}
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"dataset must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}")
    return fn(dataset)


def plan_dataset(
    dataset: Any,
    seq_length: int,
    strategy: str = "bfd",
    map_kwargs: Mapping[str, Any] | None = None,
    *,
    overlong: str | None = None,
) -> PackPlan | dict[str, PackPlan]:
    """The plan :func:`pack_dataset` would make (a :class:`padless.PackPlan` whose ``stats`` count rows,
    the lower bound, truncated and dropped tokens), without moving any token; a dict per split for a
    ``DatasetDict``."""
    batch_size = _check_map_kwargs(map_kwargs)

    def plan(split: Any) -> PackPlan:
        table = split.with_format("arrow")[:]
        _, lengths = _list_columns(table)
        _refuse_empty(lengths, table.column_names[0] if table.column_names else "input_ids")
        return plan_lengths(lengths, seq_length, strategy, overlong=overlong, batch_size=batch_size)

    return _each_split(dataset, plan)


def pack_dataset(
    dataset: Any,
    seq_length: int,
    strategy: str = "bfd",
    map_kwargs: Mapping[str, Any] | None = None,
    *,
    overlong: str | None = None,
    buffer_size: int = 4096,
) -> Any:
    """Pack the sequences of ``dataset`` into rows of at most ``seq_length`` tokens (see the module
    docstring): a ``Dataset`` (or ``DatasetDict``) with the same columns, packed, plus ``seq_lengths``;
    an ``IterableDataset`` (or ``IterableDatasetDict``) of the same for a streaming one, holding at most
    ``buffer_size`` sequences (or ``map_kwargs["batch_size"]``) at a time.

    ``strategy``: TRL's ``"bfd"``, ``"bfd_split"``, ``"wrapped"`` or a padless planner name
    (:data:`padless.planning.plan.STRATEGIES`). ``overlong``: what a sequence longer than ``seq_length`` does
    (``"error"`` by default, or ``"truncate"``, ``"split"``, ``"drop"``). ``map_kwargs``: see
    :data:`MAP_KWARGS`. The dataset's format is kept (``seq_lengths`` joins a column selection).
    ``buffer_size``: sequences a streaming dataset's planner holds at most (without a ``batch_size``).
    """
    batch_size = _check_map_kwargs(map_kwargs)
    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")
    resolve_strategy(strategy, overlong)  # a bad name fails before any work
    result = _each_split(
        dataset,
        lambda split: _pack_split(split, int(seq_length), strategy, overlong, batch_size)[0],
        lambda split: _pack_stream(split, int(seq_length), strategy, overlong, batch_size, buffer_size),
    )
    if isinstance(result, dict) and not isinstance(result, _datasets().IterableDatasetDict):
        return _datasets().DatasetDict(result)
    return result


STREAM_PLANNERS: dict[str, str] = {"best_fit_decreasing": "buffered", "histogram_best_fit": "buffered",
                                   "wrapped": "wrapped"}  # fmt: skip
"""padless planner -> how an ``IterableDataset`` is packed without ``map_kwargs["batch_size"]``:
``buffered`` (:class:`padless.planning.buffered.StreamPlanner`) or ``wrapped`` (cut as it streams,
the offline rows exactly). Other planners need a ``batch_size``."""


def _pack_stream(
    dataset: Any, seq_length: int, strategy: str, overlong: str | None, batch_size: int | None, buffer_size: int
) -> Any:
    """An ``IterableDataset`` of the packed rows of a streaming one (see the module docstring)."""
    from datasets.iterable_dataset import ExamplesIterable

    from padless.planning.buffered import StreamOptions

    datasets = _datasets()
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
        _log_stats(counts.plan_stats(self.seq_length), self.seq_length, "pack_dataset (streaming)")
        _log_dropped_images(self.dropped_images, "pack_dataset (streaming)")

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
    """An example's columns as lists, checked as :func:`_list_columns` checks a table's."""
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
