"""A packed row split over the ranks of a context-parallel group, everything computed BEFORE the split.

Positions inside documents, document ids and the SHIFTED targets (``targets[t]`` is the label of
token ``t + 1`` when it is in the same document, else ``IGNORE_INDEX``) are computed on the whole row
and then sliced into ``cp`` equal shards: contiguous (rank ``r`` holds ``[r L/cp, (r+1) L/cp)``) or zigzag
(the row cut into ``2 cp`` equal chunks, rank ``r`` holding chunk ``r`` then chunk ``2 cp - 1 - r``, so a
long document's cheap head and expensive tail share ranks: :mod:`padless.planning.context_balance`). Shifting after the split would drop the target
of each shard's last token (it lives on the next rank); computing positions on a shard would restart
documents at every shard boundary. The trained-token count is the whole row's, identical on every
rank, so each rank's loss is its share of one loss over the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from padless.attention.context_parallel import row_multiple, shard_index
from padless.layout import IGNORE_INDEX


@dataclass(frozen=True)
class RowShard:
    """This rank's shard of packed rows ``[R, L]`` split over ``cp`` ranks."""

    input_ids: torch.Tensor
    """``[R, L / cp]`` the shard's tokens."""
    position_ids: torch.Tensor
    """``[R, L / cp]`` positions inside their documents, counted on the whole row."""
    targets: torch.Tensor
    """``[R, L / cp]`` already shifted: the token each position is trained to predict, or ``IGNORE_INDEX``."""
    document_ids: torch.Tensor
    """``[R, L]`` document ids of the WHOLE rows (every attention layer's global mask reads them)."""
    num_items: int
    """Trained targets in the whole rows: the same on every rank of the group."""
    start: int
    """Global index of the shard's first token."""
    index: torch.Tensor
    """``[L / cp]`` int64 global indices of the shard's tokens, in local order (the layout's rule)."""
    layout: str
    """``"contiguous"`` or ``"zigzag"``."""


def document_ids_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """``[R, L]`` positions restarting at 0 per document -> ``[R, L]`` document ids (a new document
    wherever a position is not its predecessor + 1; padding at a row end restarts at 0: its own document)."""
    start = torch.ones_like(position_ids, dtype=torch.bool)
    start[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return torch.cumsum(start.long(), dim=1) - 1


def shifted_targets(labels: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """``[R, L]`` unshifted labels -> ``[R, L]`` targets: ``labels[t + 1]`` where token ``t + 1`` is in
    token ``t``'s document, else ``IGNORE_INDEX`` (no token predicts the next document's first)."""
    out = torch.full_like(labels, IGNORE_INDEX)
    same = document_ids[:, 1:] == document_ids[:, :-1]
    out[:, :-1] = torch.where(same, labels[:, 1:], IGNORE_INDEX)
    return out


def split_row(
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    cp: int,
    rank: int,
    pad_id: int = 0,
    layout: str = "contiguous",
) -> RowShard:
    """Rank ``rank``'s shard of packed rows split over ``cp`` ranks (module docstring).

    ``input_ids``, ``labels`` (unshifted), ``position_ids`` (restarting at 0 per document): ``[R, L]``
    or ``[L]``. ``layout``: ``"contiguous"`` or ``"zigzag"`` (module docstring). A row whose length does
    not divide by ``cp`` (``2 cp`` under zigzag) is padded at its end with ``pad_id`` up to the next multiple: never trained, each padding token a document of its own (position 0), so it
    costs one key per token (the work :mod:`padless.planning.context_balance` counts for padding)."""
    if cp < 1 or not 0 <= rank < cp:
        raise ValueError(f"cp must be >= 1 and rank in [0, cp), got cp={cp}, rank={rank}")
    rows = [t if t.ndim == 2 else t.unsqueeze(0) for t in (input_ids, labels, position_ids)]
    if not rows[0].shape == rows[1].shape == rows[2].shape or rows[0].ndim != 2:
        raise ValueError(
            f"input_ids, labels and position_ids must be the same [R, L] shape, got "
            f"{[tuple(t.shape) for t in (input_ids, labels, position_ids)]}"
        )
    ids, lab, pos = rows
    extra = -ids.shape[1] % row_multiple(cp, layout)
    if extra:
        ids = torch.nn.functional.pad(ids, (0, extra), value=pad_id)
        lab = torch.nn.functional.pad(lab, (0, extra), value=IGNORE_INDEX)
        pos = torch.nn.functional.pad(pos, (0, extra), value=0)  # each padding token its own document
    docs = document_ids_from_positions(pos)
    targets = shifted_targets(lab, docs)
    cut = shard_index(ids.shape[1], cp, rank, layout).to(ids.device)
    return RowShard(
        input_ids=ids[:, cut],
        position_ids=pos[:, cut],
        targets=targets[:, cut],
        document_ids=docs,
        num_items=int((targets != IGNORE_INDEX).sum()),
        start=int(cut[0]),
        index=cut,
        layout=layout,
    )
