"""Is a batch that another library built isolated? Checked on the model it feeds.

:func:`padless.verify_isolation` builds its own packed batches; this module checks *someone else's*
batch (TRL's padding-free collator, transformers' ``DataCollatorWithFlattening``, a padded batch, a
padless one), exactly as their trainer would feed it, against the truth: where the documents are.

For each document span ``(row, offset, length)``:

1. its logits inside the batch must equal its logits alone (``input_ids`` of the document only,
   ``use_cache=False``): the largest absolute difference, judged against the same documents
   right-padded together (padding's own noise) and the dtype's floor, by the judgment of
   :mod:`padless.isolation.compare`;
2. no token before it may be trained to predict its first token: ``labels[row, offset]`` must be
   ignored when ``offset > 0`` (a *cross-document target*).

A span is a true document (an example of the dataset, or a piece of one cut into its own document),
so the caller says where they are: tests/integrations/test_exactness.py packs a document-id column
along with the tokens, benchmarks/integrations.py splits its examples at their EOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from padless.batching.batch import forward_inputs
from padless.layout import IGNORE_INDEX

Span = tuple[int, int, int]
"""``(row, offset, length)`` of one document in a batch."""


@dataclass(frozen=True)
class BatchAudit:
    """What one batch did to its documents."""

    documents: int
    """Document spans checked."""
    max_logit_diff: float
    """Largest |logit in the batch - logit of the document alone| over every checked token."""
    logit_tolerance: float
    """What ``max_logit_diff`` is allowed: ``max(factor x padding's noise, dtype floor)``."""
    cross_document_targets: int
    """Document starts (after the first token of a row) whose label is trained: the previous
    document's last token learns to predict them."""

    @property
    def isolated(self) -> bool:
        """Every document computed as if alone and no target crosses a boundary."""
        return self.max_logit_diff <= self.logit_tolerance and self.cross_document_targets == 0

    def merge(self, other: BatchAudit) -> BatchAudit:
        """The audit of both batches together."""
        return BatchAudit(
            self.documents + other.documents,
            max(self.max_logit_diff, other.max_logit_diff),
            min(self.logit_tolerance, other.logit_tolerance),
            self.cross_document_targets + other.cross_document_targets,
        )


def audit_batch(
    model: Any,
    batch: Mapping[str, Any],
    spans: Sequence[Span],
    *,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> BatchAudit:
    """Feed ``batch`` (labels withheld, ``forward_kwargs`` added, e.g. ``use_cache=False`` as a trainer
    would) to ``model`` and compare each span with the document alone (see the module docstring).
    The model runs in eval mode (no dropout) and is put back as it was."""
    from padless.isolation.compare import Document, compare_documents, compute_dtype, computing_in

    if not spans:
        raise ValueError("spans is empty: say where the documents of the batch are")
    device = next(model.parameters()).device
    inputs = forward_inputs({k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()})
    inputs.update(forward_kwargs or {})
    ids = inputs["input_ids"]
    docs = [
        Document(k, tuple(ids[row, offset : offset + length].tolist()), row, tuple(range(offset, offset + length)))
        for k, (row, offset, length) in enumerate(spans)
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(**inputs).logits
            with computing_in(model, compute_dtype(model, logits)):
                check = compare_documents(model, logits, docs)
    finally:
        model.train(was_training)
    labels = batch.get("labels")
    crossing = 0
    if labels is not None:
        crossing = sum(1 for row, offset, _ in spans if offset > 0 and int(labels[row, offset]) != IGNORE_INDEX)
    return BatchAudit(len(spans), check.judgment.measured, check.judgment.limit, crossing)
