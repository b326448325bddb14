"""A guard left on during training: every ``every`` steps, a few documents of the current packed
batch run alone and their logits are compared with the packed row's.

:func:`padless.verify_isolation` proves a (model, backend) exact once, on random data; the guard
keeps checking the real batches of the run, so a change that breaks isolation mid-run (another
attention backend, a cache switched back on, a collator swapped for one without a document mask) is
caught at the step it happens, not in the evaluation curve weeks later::

    guard = padless.IsolationGuard(every=100, documents=2, on_failure="raise")
    for batch in loader:
        out = model(**padless.batching.batch.forward_inputs(batch))
        loss = ...; loss.backward()
        guard(model, batch, out.logits)  # or guard(model, batch): re-runs the batch without gradients
        optimizer.step()

Call it before ``optimizer.step()``: the documents must run alone with the weights that produced
the logits (after the step they differ by the update, and the guard says so).

A checked document is a piece of the batch that starts a document (its first token predicted by
nothing): it is run alone with the same token ids and positions ``0..n-1``. Pieces at a row's
offset 0 are checked last (nothing precedes them to leak from). The checked documents are also run
right-padded together, and the packed differences are judged against that padding noise and the
dtype's floor (:mod:`padless.isolation.compare`). The dtype is the dtype the logits were computed
in: under ``torch.autocast`` (fp32 master weights, ``Trainer(bf16=True)``) the bf16 logits are
judged with bf16's floor, and the documents are re-run under the same autocast. Dropout makes any
two forwards differ, so given logits are refused while dropout is active; ``logits=None`` re-runs
the batch with the model in eval mode. The cost is measured by benchmarks/guard.py.

The guard does not consult the exactness rule (:func:`padless.attention.select.check_exact`) nor the
collator's verdict: it measures, so that it also catches what the rule's verdict cannot see, a
model, backend or batch changed after the verdict was given.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from padless.devices import dtype_name

if TYPE_CHECKING:
    from padless.isolation.compare import Evidence, Tolerance


class IsolationError(RuntimeError):
    """A packed document's logits differ from the same document run alone."""


class IsolationWarning(UserWarning):
    """The warning :class:`IsolationGuard` gives with ``on_failure="warn"``."""


@dataclass(frozen=True)
class GuardCheck:
    """One check of the guard."""

    step: int
    """The guard's call count when it checked (1 = first call)."""
    pieces: list[tuple[int, int, int, int]]
    """``(feature, row, offset, length)`` of each document run alone."""
    max_logit_diff: float
    """Largest |packed - alone| logit over the checked documents' tokens."""
    tolerance: float
    """The limit: ``max(factor x noise, atol + rtol x max|alone logit|)`` (:func:`padless.isolation.compare.judge`)."""
    noise: float | None = None
    """The same documents right-padded together against alone: padding's own noise."""
    dtype: str = ""
    """The dtype the logits were computed in (the autocast dtype under autocast)."""
    evidence: tuple[Evidence, ...] = ()
    """The documents over the limit, their tokens, packed vs padded differences."""
    image_documents: int = 0
    """Documents of the batch holding images, never chosen: the guard re-runs documents from their
    token ids alone, and a document's images are not sliced back out of the batch (a batch's images
    are checked by :func:`padless.check_batch` and the multimodal sweep, tests/multimodal)."""

    @property
    def passed(self) -> bool:
        return self.max_logit_diff <= self.tolerance


@dataclass
class IsolationGuard:
    """Checks packed rows against documents run alone every ``every`` calls (see the module docstring)."""

    every: int = 100
    """Check on the 1st call and every ``every`` calls after it."""
    documents: int = 2
    """Documents of the batch run alone per check."""
    on_failure: Literal["raise", "warn"] = "raise"
    """``raise`` :class:`IsolationError`, or ``warn`` with :class:`IsolationWarning` and go on."""
    tolerance: Tolerance | None = None
    """The absolute floor; default: :data:`padless.isolation.verify.TOLERANCES` of the dtype the logits are computed in."""
    factor: float | None = None
    """How many times padding's noise is allowed; default :data:`padless.isolation.compare.NOISE_FACTOR`."""
    seed: int = 0
    """Seed of the choice of documents (a check's choice depends on the seed and the step)."""
    calls: int = field(default=0, init=False)
    """Calls so far."""
    last: GuardCheck | None = field(default=None, init=False)
    """The latest check, if any."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")
        if self.documents < 1:
            raise ValueError(f"documents must be >= 1, got {self.documents}")
        if self.on_failure not in ("raise", "warn"):
            raise ValueError(f"on_failure must be 'raise' or 'warn', got {self.on_failure!r}")

    def __call__(self, model: Any, batch: Mapping[str, Any], logits: torch.Tensor | None = None) -> GuardCheck | None:
        """Count a step; on a checking step, compare and return the :class:`GuardCheck` (else None).

        ``batch``: the :class:`padless.batching.batch.PackedBatch` of the step (its placements say
        where the documents are); ``logits``: ``[R, L, V]`` from the step's forward, or None to re-run it.
        """
        self.calls += 1
        if (self.calls - 1) % self.every:
            return None
        check = self.check(model, batch, logits)
        self.last = check
        if not check.passed:
            message = (
                f"step {check.step}: packed documents {check.pieces} differ from the same documents run "
                f"alone by {check.max_logit_diff:.3g} (limit {check.tolerance:.3g}; padding's own noise "
                f"{check.noise or 0:.3g}, {check.dtype}): documents of a packed row are not isolated; run "
                "padless.verify_isolation(model) on this backend"
                + "".join(f"\n  {e.describe()}" for e in check.evidence)
            )
            if self.on_failure == "raise":
                raise IsolationError(message)
            warnings.warn(message, IsolationWarning, stacklevel=2)
        return check

    def _pick(self, batch: Mapping[str, Any], image_pieces: np.ndarray | None = None) -> list[int]:
        placements = getattr(batch, "placements", None)
        if placements is None:
            raise ValueError(
                "IsolationGuard needs the PackedBatch the collator returned (its placements); "
                "padless.batching.batch.batch_to keeps them when moving it to a device"
            )
        prev = placements.prev_offsets()
        text = np.ones(prev.size, dtype=bool) if image_pieces is None else ~image_pieces
        starts = np.flatnonzero((prev < 0) & text)  # pieces that start a document (and hold no image)
        rng = np.random.default_rng([self.seed, self.calls])
        inner, first = starts[placements.offset[starts] > 0], starts[placements.offset[starts] == 0]
        order = np.concatenate([rng.permutation(inner), rng.permutation(first)])
        return order[: self.documents].tolist()

    def check(self, model: Any, batch: Mapping[str, Any], logits: torch.Tensor | None = None) -> GuardCheck:
        """Run the chosen documents alone and compare (no counting, no raising)."""
        from padless.batching.batch import forward_inputs
        from padless.devices import compute_dtype
        from padless.isolation.compare import NOISE_FACTOR, Document, compare_documents, computing_in

        images = _image_pieces(model, batch)
        chosen = self._pick(batch, images)
        was_training = model.training
        if logits is not None and was_training and _dropout_active(model):
            raise ValueError(
                "dropout is active, so the step's logits differ from any re-run; call the guard "
                "without logits (it re-runs the batch in eval mode) or turn dropout off"
            )
        placements, ids = batch.placements, batch["input_ids"]
        if logits is not None and logits.shape[:2] != ids.shape:
            raise ValueError(
                f"logits {tuple(logits.shape)} do not cover input_ids {tuple(ids.shape)} (logits kept "
                "only at trained positions?); call the guard without logits to re-run the batch"
            )
        docs = []
        for j in chosen:
            r, o, n = int(placements.row[j]), int(placements.offset[j]), int(placements.length[j])
            docs.append(
                Document(int(placements.feature[j]), tuple(ids[r, o : o + n].tolist()), r, tuple(range(o, o + n)))
            )
        model.eval()
        try:
            with torch.no_grad():
                if logits is None:
                    logits = model(**forward_inputs(batch)).logits
                dtype = compute_dtype(model, logits)
                with computing_in(model, dtype):  # the documents alone in the dtype the logits were computed in
                    result = compare_documents(
                        model,
                        logits,
                        docs,
                        tolerance=self.tolerance,
                        factor=NOISE_FACTOR if self.factor is None else self.factor,
                    )
        finally:
            model.train(was_training)
        judgment = result.judgment  # measured against the noise floor, not the rule's verdict
        pieces = [(d.index, d.row, d.columns[0], len(d.columns)) for d in docs]
        return GuardCheck(
            self.calls,
            pieces,
            judgment.measured,
            judgment.limit,
            judgment.noise,
            dtype_name(dtype),
            tuple(result.evidence),
            int(images.sum()) if images is not None else 0,
        )


def _image_pieces(model: Any, batch: Mapping[str, Any]) -> np.ndarray | None:
    """Per placed piece, whether it holds image placeholder tokens (``None``: the batch carries no images)."""
    from padless.attention.facts import model_facts
    from padless.attention.multimodal import image_inputs

    if not image_inputs(batch):
        return None
    placements = batch.placements
    scheme = model_facts(model).vision
    ids = batch["input_ids"].detach().cpu().numpy()
    marked = None
    for key in ("mm_token_type_ids", "token_type_ids"):
        if batch.get(key) is not None:
            marked = batch[key].detach().cpu().numpy() != 0
    if scheme is not None and scheme.image_token_id is not None:
        marked = (ids == scheme.image_token_id) | (marked if marked is not None else False)
    if marked is None:  # images, but no way to tell which documents hold them: none is re-run alone
        return np.ones(placements.row.size, dtype=bool)
    return np.array(
        [bool(marked[r, o : o + n].any()) for r, o, n in zip(placements.row, placements.offset, placements.length)]
    )


def _dropout_active(model: Any) -> bool:
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, name, 0) or 0) > 0 for name in ("attention_dropout", "attn_pdrop"))
