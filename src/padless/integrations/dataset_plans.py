"""The plans behind :func:`padless.integrations.datasets.pack_dataset`: TRL's strategy names, the
lengths of a dataset (or of each ``batch_size`` run of it) -> one :class:`padless.PackPlan`, the
``map_kwargs`` honoured, and what is logged of a plan. The offline packing of a ``Dataset`` and the
streaming one (:mod:`padless.integrations.datasets_stream`) both plan here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from padless.planning.checks import OVERLONG_DEFAULT
from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs

logger = logging.getLogger("padless.integrations.datasets")
"""``pack_dataset``'s logger, whichever of its modules logs (one name to configure)."""

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


def require_module(module: str) -> Any:
    from padless._optional import require

    return require(module, "padless.integrations.datasets")


def check_map_kwargs(map_kwargs: Mapping[str, Any] | None) -> int | None:
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


def datasets_module() -> Any:
    datasets = require_module("datasets")
    require_module("datasets.table")
    require_module("datasets.fingerprint")
    return datasets


def log_dropped_images(documents: int, what: str = "pack_dataset") -> None:
    if documents:
        logger.warning("%s: %d dropped documents held images; their images left with them", what, documents)


def log_stats(s: Any, max_length: int, what: str = "pack_dataset") -> None:
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
