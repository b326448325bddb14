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
The plans are :mod:`padless.integrations.dataset_plans`', the streaming packing
:mod:`padless.integrations.datasets_stream`'s; their public names import from here too.

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

from collections.abc import Mapping
from typing import Any

import numpy as np

from padless.integrations.dataset_plans import (  # noqa: F401 (re-exported: pack_dataset's plans)
    MAP_KWARGS,
    TRL_STRATEGIES,
    check_map_kwargs,
    datasets_module,
    log_dropped_images,
    log_stats,
    plan_lengths,
    require_module,
    resolve_strategy,
)
from padless.integrations.datasets_stream import STREAM_PLANNERS, pack_stream  # noqa: F401 (re-exported)
from padless.planning.plan import PackPlan


def sequence_lengths(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """int64 ``[n]``: tokens of ``column`` in every row of a ``datasets.Dataset`` (read from the Arrow
    offsets, without decoding rows) or of a sequence of mappings."""
    if hasattr(dataset, "with_format") and hasattr(dataset, "column_names"):
        if column not in dataset.column_names:
            raise ValueError(f"the dataset has no {column!r} column (columns: {dataset.column_names})")
        pc = require_module("pyarrow.compute")
        values = dataset.with_format("arrow")[:][column]
        return pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.fromiter((len(row[column]) for row in dataset), dtype=np.int64, count=len(dataset))


def _list_columns(table: Any) -> tuple[list[Any], np.ndarray]:
    """The table's token columns as single list arrays, and the per-row lengths they share (image
    columns, :data:`padless.batching.image_rows.IMAGE_COLUMNS`, are left to :func:`_image_columns`)."""
    from padless.batching.image_rows import IMAGE_COLUMNS, PER_TOKEN_COLUMNS

    pa = require_module("pyarrow")
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
    pa = require_module("pyarrow")
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

    datasets = datasets_module()
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
    log_stats(plan.stats, plan.max_length)
    log_dropped_images(dropped_images)


def _each_split(dataset: Any, fn: Any, stream: Any = None) -> Any:
    """``fn`` on each split of a ``Dataset`` / ``DatasetDict`` (a dict per split), ``stream`` on each
    split of an ``IterableDataset`` / ``IterableDatasetDict`` (an ``IterableDatasetDict`` per split)."""
    datasets = datasets_module()
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
    batch_size = check_map_kwargs(map_kwargs)

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
    batch_size = check_map_kwargs(map_kwargs)
    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")
    resolve_strategy(strategy, overlong)  # a bad name fails before any work
    result = _each_split(
        dataset,
        lambda split: _pack_split(split, int(seq_length), strategy, overlong, batch_size)[0],
        lambda split: pack_stream(split, int(seq_length), strategy, overlong, batch_size, buffer_size),
    )
    if isinstance(result, dict) and not isinstance(result, datasets_module().IterableDatasetDict):
        return datasets_module().DatasetDict(result)
    return result
