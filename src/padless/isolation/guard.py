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

Shared-prompt and rollout rows (:class:`padless.RolloutCollator`, :class:`padless.PreferenceCollator`)
place completions whose first token is predicted by their prompt's last: such a completion is checked
as ``prompt + completion`` run alone, reading the prompt's columns first (the prompt starts where its
``position_ids`` count from 0).

``budget`` bounds a check's cost for a guard left on by default (the trainers' first-step check,
:mod:`padless.integrations.first_step`): every checked document is cut to its first tokens (its
logits there depend on those tokens only) so that the runs alone and the padded reference together
hold at most ``budget`` x the batch's tokens, and the reference is padded a little past the longest
checked document (:data:`MIN_TOKENS` columns) instead of to the row width.

The guard does not consult the exactness rule (:func:`padless.attention.select.check_exact`) nor the
collator's verdict: it measures, so that it also catches what the rule's verdict cannot see, a
model, backend or batch changed after the verdict was given.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from padless.devices import dtype_name

if TYPE_CHECKING:
    from padless.isolation.compare import Evidence, Tolerance


MIN_TOKENS = 16
"""The fewest tokens a checked document keeps under :attr:`IsolationGuard.budget`, and the padding columns
of the padded reference past the longest checked document there."""


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

    @property
    def tokens(self) -> int:
        """Tokens of the checked documents (each run alone)."""
        return sum(length for *_, length in self.pieces)

    def describe(self) -> str:
        """One line: the documents checked, the difference, padding's noise and the limit, the verdict."""
        if not self.pieces:
            return f"step {self.step}: no document to run alone ({self.image_documents} hold images)"
        where = ", ".join(f"{f} (row {r}, column {o}, {n} tokens)" for f, r, o, n in self.pieces)
        verdict = "isolated" if self.passed else "documents of a packed row are not isolated"
        return (
            f"step {self.step}: packed documents {where} against the same documents run alone: max |diff| "
            f"{self.max_logit_diff:.3g}, padding's own noise {self.noise or 0:.3g}, limit {self.tolerance:.3g} "
            f"({self.dtype}): {verdict}"
        )


@dataclass
class IsolationGuard:
    """Checks packed rows against documents run alone every ``every`` calls (see the module docstring)."""

    every: int | None = 100
    """Check on the 1st call and every ``every`` calls after it; ``None``: on the 1st call only."""
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
    budget: float | None = None
    """The most tokens a check runs (alone and padded together), as a share of the batch's ``R x L``
    tokens: each checked document is cut to its first tokens to fit (at least :data:`MIN_TOKENS`), and
    the padded reference is :data:`MIN_TOKENS` wider than the longest checked document. ``None``: whole
    documents, the reference as wide as the rows (see the module docstring)."""
    calls: int = field(default=0, init=False)
    """Calls so far."""
    last: GuardCheck | None = field(default=None, init=False)
    """The latest check, if any."""

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or self.every < 1):
            raise ValueError(f"every must be >= 1 or None (the first call only), got {self.every}")
        if self.budget is not None and not 0 < self.budget <= 1:
            raise ValueError(f"budget must be a share of the batch's tokens in (0, 1] or None, got {self.budget}")
        if self.documents < 1:
            raise ValueError(f"documents must be >= 1, got {self.documents}")
        if self.on_failure not in ("raise", "warn"):
            raise ValueError(f"on_failure must be 'raise' or 'warn', got {self.on_failure!r}")

    def __call__(self, model: Any, batch: Mapping[str, Any], logits: torch.Tensor | None = None) -> GuardCheck | None:
        """Count a step; on a checking step, compare and return the :class:`GuardCheck` (else None).

        ``batch``: the :class:`padless.batching.batch.PackedBatch` of the step (its placements say
        where the documents are); ``logits``: ``[R, L, V]`` from the step's forward, or None to re-run it.
        """
        due = self.due()
        self.calls += 1
        if not due:
            return None
        check = self.check(model, batch, logits)
        self.last = check
        if not check.passed:
            message = (
                check.describe()
                + "; run padless.verify_isolation(model) on this backend"
                + "".join(f"\n  {e.describe()}" for e in check.evidence)
            )
            if self.on_failure == "raise":
                raise IsolationError(message)
            warnings.warn(message, IsolationWarning, stacklevel=2)
        return check

    def due(self) -> bool:
        """Whether the next call checks (the 1st, then every ``every``-th)."""
        if self.every is None:
            return self.calls == 0
        return self.calls % self.every == 0

    def _pick(self, batch: Mapping[str, Any], image_pieces: np.ndarray | None = None) -> list[tuple[int, int]]:
        """``(piece, first column)`` of the documents to check: pieces that start a document, and
        completions after their prompt (first column: the prompt's), none holding images; documents with
        others before them first."""
        placements = getattr(batch, "placements", None)
        if placements is None:
            raise ValueError(
                "IsolationGuard needs the PackedBatch the collator returned (its placements); "
                "padless.batching.batch.batch_to keeps them when moving it to a device"
            )
        prev = placements.prev_offsets()
        text = np.ones(prev.size, dtype=bool) if image_pieces is None else ~image_pieces
        first_col = placements.offset.copy()
        inner = first_col > 0
        after = np.flatnonzero(prev >= 0)
        positions = batch.get("position_ids")
        if after.size and positions is not None and positions.dim() == 2:
            pos = positions.detach().cpu().numpy()
            first_col[after] = prev[after] - pos[placements.row[after], prev[after]]  # the prompt starts at position 0
            inner[after] = (first_col[after] > 0) | (placements.offset[after] != prev[after] + 1)
        else:  # no positions to find the prompt by: completions are not checked
            text[after] = False
        eligible = np.flatnonzero(text)
        rng = np.random.default_rng([self.seed, self.calls])
        order = np.concatenate(
            [rng.permutation(eligible[inner[eligible]]), rng.permutation(eligible[~inner[eligible]])]
        )
        return [(int(j), int(first_col[j])) for j in order[: self.documents]]

    def _cap(self, shape: tuple[int, ...], documents: int) -> int | None:
        """Tokens each checked document keeps under :attr:`budget` (``None``: whole documents)."""
        if self.budget is None or documents == 0:
            return None
        spare = self.budget * shape[0] * shape[1] - documents * MIN_TOKENS  # the reference's padding columns
        return max(MIN_TOKENS, int(spare / (2 * documents)))

    def check(self, model: Any, batch: Mapping[str, Any], logits: torch.Tensor | None = None) -> GuardCheck:
        """Run the chosen documents alone and compare (no counting, no raising)."""
        from padless.batching.batch import forward_inputs
        from padless.devices import compute_dtype
        from padless.isolation.compare import NOISE_FACTOR, Document, compare_documents, computing_in, padded_logits

        images = _image_pieces(model, batch)
        chosen = self._pick(batch, images)
        was_training = model.training
        if logits is not None and was_training and dropout_active(model):
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
        cap = self._cap(tuple(ids.shape), len(chosen))
        prev = placements.prev_offsets()
        docs = []
        for j, first in chosen:
            r, o, n = int(placements.row[j]), int(placements.offset[j]), int(placements.length[j])
            context = tuple(range(first, int(prev[j]) + 1)) if prev[j] >= 0 else ()  # the prompt before a completion
            columns = (*context, *range(o, o + n))[: None if cap is None or context else cap]
            docs.append(Document(int(placements.feature[j]), tuple(ids[r, list(columns)].tolist()), r, columns))
        if not docs:  # nothing to run alone (every document holds images): an empty check
            return GuardCheck(
                self.calls,
                [],
                0.0,
                0.0,
                None,
                dtype_name(logits.dtype) if logits is not None else "",
                (),
                int(images.sum()) if images is not None else 0,
            )
        model.eval()
        try:
            with torch.no_grad(), _small_runs_threads(model, self.budget is not None):
                if logits is None and self.budget is not None and images is None:
                    logits, docs = _windowed(model, batch, docs)  # each document with the tokens before it
                if logits is None:
                    logits = model(**forward_inputs(batch)).logits
                dtype = compute_dtype(model, logits)
                with computing_in(model, dtype):  # the documents alone in the dtype the logits were computed in
                    longest = max(len(d.columns) for d in docs)  # under a budget: padding enough to be padding's noise
                    width = longest + MIN_TOKENS if self.budget is not None else int(ids.shape[1])
                    padded = padded_logits(model, docs, width)
                    result = compare_documents(
                        model,
                        logits,
                        docs,
                        tolerance=self.tolerance,
                        factor=NOISE_FACTOR if self.factor is None else self.factor,
                        padded=padded,
                    )
        finally:
            model.train(was_training)
        judgment = result.judgment  # measured against the noise floor, not the rule's verdict
        pieces = [(d.index, d.row, d.columns[0], len(d.columns)) for d in docs]  # a completion: from its prompt
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


@contextmanager
def _small_runs_threads(model: Any, small: bool) -> Iterator[None]:
    """One CPU thread for a budgeted check's runs (a few dozen tokens each): ops that small run as fast on
    one thread, and on a CPU shared with other jobs each op of several threads waits for the slowest
    (measured on 2 busy cores, SmolLM2-135M: 1.0-1.6 s on one thread against 9-17 s on two)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    threads = torch.get_num_threads()
    if small and on_cpu and threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


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


def dropout_active(model: Any) -> bool:
    """Whether ``model`` has a dropout that is on in training mode (a module with ``p > 0``, or an
    attention dropout in its config): its training logits then differ from any re-run."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, name, 0) or 0) > 0 for name in ("attention_dropout", "attn_pdrop"))


_CUT_PER_TOKEN = ("input_ids", "labels", "token_type_ids", "mm_token_type_ids")
_BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _windowed(model: Any, batch: Mapping[str, Any], docs: list[Any]) -> tuple[Any, list[Any]]:
    """The checked documents' logits from windows of their rows instead of the whole batch: each
    document with :data:`MIN_TOKENS` tokens of its row before it, cut out with its mask, positions and
    boundaries (:func:`_window`). A document isolated in the row is isolated in the window (it reads only
    its own tokens, which the window holds from its start); one that reads its neighbours reads the
    neighbour tokens the window keeps. Returns ``(None, docs)`` where the batch cannot be cut (the caller
    re-runs it whole), else ``[n, width, V]`` logits and the documents placed in them."""
    from padless.isolation.compare import Document

    runs, placed = [], []
    for i, d in enumerate(docs):
        start, end = max(0, min(d.columns) - MIN_TOKENS), max(d.columns) + 1
        cut = _window(batch, d.row, start, end)
        if cut is None:
            return None, docs
        runs.append(model(**cut).logits[0])
        placed.append(Document(d.index, d.input_ids, i, tuple(c - start for c in d.columns)))
    logits = runs[0].new_zeros(len(runs), max(r.shape[0] for r in runs), runs[0].shape[-1])
    for i, r in enumerate(runs):
        logits[i, : r.shape[0]] = r
    return logits, placed


def _window(batch: Mapping[str, Any], row: int, start: int, end: int) -> dict[str, Any] | None:
    """The model inputs of columns ``start:end`` of one row of a packed batch, as a batch of one row: its
    4D masks' block for those columns, its positions, its boundaries read from those positions (the
    first, cut document counts from where the window starts). ``None`` where the batch carries what is
    not cut by column (images, a shared-prompt tree, tensors unknown here)."""
    from padless.attention.backend import cu_seqlens_from_host_positions
    from padless.batching.batch import forward_inputs
    from padless.batching.rowformat import boundary_inputs
    from padless.layout import ROW_PADDING

    inputs = forward_inputs(batch)
    cols = slice(start, end)
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if key in _BOUNDARY_KEYS or key == ROW_PADDING:  # re-derived for the window (which ends in no padding)
            continue
        if key in _CUT_PER_TOKEN:
            out[key] = value[row : row + 1, cols]
        elif key == "position_ids" and torch.is_tensor(value) and value.ndim in (2, 3):
            r = 0 if value.shape[-2] == 1 else row
            out[key] = value[..., r : r + 1, cols]
        elif key == "attention_mask" and value is not None:
            masks = value if isinstance(value, Mapping) else {None: value}
            if any(not torch.is_tensor(m) or m.ndim != 4 for m in masks.values()):
                return None
            cut = {k: m[0 if m.shape[0] == 1 else row][None, :, cols, cols] for k, m in masks.items()}
            out[key] = cut if isinstance(value, Mapping) else cut[None]
        elif torch.is_tensor(value) or key.startswith(("pixel", "image", "video", "tree")):
            return None  # a tensor this cut does not know how to read
        else:
            out[key] = value  # use_cache and other flags
    if _BOUNDARY_KEYS[0] in inputs:
        pos = out.get("position_ids")
        if pos is None:
            return None
        # the rule padless attention checks boundaries against: the cut first document starts here too
        text = (pos[0] if pos.ndim == 3 else pos).detach().cpu().numpy()
        sent = boundary_inputs([np.diff(cu_seqlens_from_host_positions(text, 1))])
        out.update({k: v.to(out["input_ids"].device) if torch.is_tensor(v) else v for k, v in sent.items()})
    return out
