"""A batch's logits compared with each document run alone, and the judgment of that difference.

Every isolation check of padless (:func:`padless.verify_isolation`, :class:`padless.IsolationGuard`,
:func:`padless.isolation.audit.audit_batch`) runs a document alone (its token ids, positions
``0..n-1``, no mask, ``use_cache=False``) and reads where the same document sits in the batch::

    alone     [d0 d1 d2]                 -> logits A [n, V]
    batch row [x x | d0 d1 d2 | y y ...] -> logits B[row, columns] [n, V]
    difference of the document = max |A - B| over its tokens and the vocabulary

Packing is exact in mathematics but not in floating point: a packed row runs other kernels (other
shapes, other reduction orders) than the document alone, so the difference is never 0 in bf16. The
reference for "how large may it be" is padding's own noise, measured in the same run: the same
documents right-padded into one batch as wide as the checked rows (also exact in mathematics,
numerically not, and run by kernels of the same shapes) against the same runs alone. The judgment
(:func:`judge`)::

    passed  <=>  measured <= max(NOISE_FACTOR x noise, floor)

``floor`` is the dtype's absolute floor (:data:`TOLERANCES`: ``atol + rtol x max|logit alone|``
for logits, ``grad_rtol`` for gradients), so a noise of exactly 0 (same kernels) does not demand
bit equality. A leaked token changes logits by the size of the logits themselves, far above both.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from padless.devices import compute_dtype, dtype_name, is_half_precision  # noqa: F401 (compute_dtype re-exported)

if TYPE_CHECKING:  # torch is imported where used: `padless verify` refuses bad flags before torch loads
    import torch

NOISE_FACTOR = 4.0
"""Packed differences may be this many times padding's own noise (see the module docstring)."""


@dataclass(frozen=True)
class Tolerance:
    """The absolute floor of the judgment for one dtype (:func:`judge`)."""

    logits_atol: float
    """Absolute part of the logit floor."""
    logits_rtol: float
    """Relative part, times the largest |logit| of the documents run alone."""
    grad_rtol: float
    """Floor of ``||g - g_alone|| / ||g_alone||`` over all parameters."""

    def logit_floor(self, scale: float) -> float:
        """``atol + rtol x scale`` for logits whose largest magnitude is ``scale``."""
        return self.logits_atol + self.logits_rtol * scale


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(logits_atol=1e-12, logits_rtol=1e-12, grad_rtol=1e-6),
    "float32": Tolerance(logits_atol=1e-5, logits_rtol=1e-5, grad_rtol=1e-5),
    "bfloat16": Tolerance(logits_atol=5e-2, logits_rtol=2e-2, grad_rtol=5e-2),
    "float16": Tolerance(logits_atol=1e-2, logits_rtol=5e-3, grad_rtol=1e-2),
}
"""The floor of the judgment per compute dtype; float64 is the oracle's (``padless verify --oracle``).
Its gradient floor is float32 resolution, not 1e-12: transformers' RMSNorm (the Llama family) rounds
through float32 even in a float64 model, and a shared prompt sums the gradients of its positions over
its completions before that rounding, so it differs from the runs alone by ~1e-8 (docs/verify.md;
tests/isolation/test_oracle.py holds it at <= 1e-12 once the norm computes in float64)."""


def tolerance_for(dtype: Any, tolerance: Tolerance | None = None) -> Tolerance:
    """``tolerance`` if given, else :data:`TOLERANCES` of ``dtype`` (a torch dtype or its name)."""
    if tolerance is not None:
        return tolerance
    name = dtype_name(dtype)
    if name not in TOLERANCES:
        raise ValueError(
            f"no tolerance for dtype {name} (known: {', '.join(TOLERANCES)}); pass tolerance=Tolerance(...)"
        )
    return TOLERANCES[name]


def computing_in(model: Any, dtype: torch.dtype) -> AbstractContextManager[Any]:
    """A context in which ``model`` computes in ``dtype``: autocast when ``dtype`` is half precision
    and the weights are not (and autocast is not already on), else nothing."""
    import torch

    device_type = next(model.parameters()).device.type
    if is_half_precision(dtype) and not is_half_precision(model.dtype) and not torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, dtype=dtype)
    return nullcontext()


@dataclass(frozen=True)
class Document:
    """Where one document's tokens sit in a batch."""

    index: int
    """The document's number in the caller's terms (a feature index, a span index)."""
    input_ids: tuple[int, ...]
    """Its token ids, as run alone."""
    row: int
    """The batch row holding it."""
    columns: tuple[int, ...]
    """The row's column of each token, in order (contiguous for a packed piece; a shared-prompt
    completion reads its prompt's columns first)."""


@dataclass(frozen=True)
class DocumentDiff:
    """One document's logits in a batch against the same document alone."""

    index: int
    """:attr:`Document.index`."""
    row: int
    """The batch row holding it."""
    max_diff: float
    """Largest |logit in the batch - logit alone| over its tokens and the vocabulary."""
    positions: tuple[float, ...]
    """The largest difference at each of its tokens (token 0 first)."""
    scale: float
    """Largest |logit alone| of the document."""


@dataclass(frozen=True)
class Judgment:
    """A measured difference against padding's noise and the dtype's floor."""

    measured: float
    """The packed (or checked) difference."""
    noise: float | None
    """Padding's own difference, measured in the same run (None: not measured)."""
    floor: float
    """The dtype's absolute floor (:data:`TOLERANCES`)."""
    factor: float
    """How many times the noise is allowed (:data:`NOISE_FACTOR`)."""

    @property
    def limit(self) -> float:
        """``max(factor x noise, floor)``."""
        return max(self.floor, self.factor * (self.noise or 0.0))

    @property
    def passed(self) -> bool:
        return self.measured <= self.limit


def judge(measured: float, noise: float | None, floor: float, factor: float = NOISE_FACTOR) -> Judgment:
    """The judgment of every isolation check (see the module docstring)."""
    return Judgment(float(measured), None if noise is None else float(noise), float(floor), float(factor))


@dataclass(frozen=True)
class Evidence:
    """A document over the limit, with padding's difference for the same document beside it."""

    document: int
    """:attr:`Document.index`."""
    row: int
    """The batch row holding it."""
    positions: tuple[int, ...]
    """Its tokens (0 = first) whose difference is over the limit."""
    packed: tuple[float, ...]
    """The checked batch's difference at each of those tokens."""
    padded: tuple[float, ...] | None
    """Padding's difference at the same tokens (None: not measured)."""

    def describe(self) -> str:
        """One line: document, positions, packed vs padded differences side by side."""
        cells = [
            f"{p}: {a:.3g}" + ("" if self.padded is None else f" vs {b:.3g}")
            for p, a, b in zip(self.positions, self.packed, self.padded or self.packed)
        ][:8]
        more = f" (+{len(self.positions) - 8} more)" if len(self.positions) > 8 else ""
        side = "packed vs padded" if self.padded is not None else "checked"
        return f"document {self.document} (row {self.row}), tokens {side}: {', '.join(cells)}{more}"


@dataclass(frozen=True)
class LogitCheck:
    """Every document of a batch against itself alone, padding's noise, and the judgment."""

    documents: tuple[DocumentDiff, ...]
    """The checked batch's difference per document."""
    noise: tuple[DocumentDiff | None, ...] | None
    """The same documents right-padded into one batch (None: not measured; an entry None: that
    document was not padded, as in the verifier's sampled check)."""
    judgment: Judgment
    """The largest document difference against ``factor x`` the largest padded one, or the floor."""

    @property
    def passed(self) -> bool:
        return self.judgment.passed

    @property
    def evidence(self) -> list[Evidence]:
        """The documents over the limit (empty when passed)."""
        limit, out = self.judgment.limit, []
        for k, doc in enumerate(self.documents):
            over = [i for i, d in enumerate(doc.positions) if d > limit]
            if over:
                noise = None if self.noise is None else self.noise[k]
                padded = None if noise is None else tuple(noise.positions[i] for i in over)
                out.append(Evidence(doc.index, doc.row, tuple(over), tuple(doc.positions[i] for i in over), padded))
        return out


def alone_logits(model: Any, input_ids: Sequence[int]) -> torch.Tensor:
    """``[n, V]`` logits of one document run alone (positions ``0..n-1``, no mask, no cache)."""
    import torch

    ids = torch.tensor([list(input_ids)], device=next(model.parameters()).device)
    return model(input_ids=ids, use_cache=False).logits[0]


def document_diff(doc: Document, alone: torch.Tensor, logits: torch.Tensor) -> DocumentDiff:
    """``doc``'s logits in a batch's ``logits [R, L, V]`` against ``alone [n, V]``, compared in float32
    or wider (the difference of two close floats is exact in their own precision)."""
    import torch

    wide = torch.promote_types(torch.promote_types(logits.dtype, alone.dtype), torch.float32)
    got = logits[doc.row, torch.tensor(doc.columns, device=logits.device)].to(wide)
    alone = alone.to(wide)
    per_token = (got - alone).abs().amax(-1).tolist()
    return DocumentDiff(doc.index, doc.row, max(per_token), tuple(per_token), alone.abs().max().item())


def padded_logits(model: Any, docs: Sequence[Document], width: int | None = None) -> torch.Tensor:
    """``[len(docs), T, V]`` logits of the documents right-padded into one batch (row ``k`` = ``docs[k]``),
    ``T`` = ``width`` (the checked batch's row width, so that padding runs kernels of the packed rows'
    shapes) or the longest document."""
    import torch

    device = next(model.parameters()).device
    width = max([len(d.input_ids) for d in docs] + ([width] if width else []))
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    for k, d in enumerate(docs):
        ids[k, : len(d.input_ids)] = torch.tensor(d.input_ids)
        mask[k, : len(d.input_ids)] = 1
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits


def compare_documents(
    model: Any,
    logits: torch.Tensor,
    docs: Sequence[Document],
    *,
    noise: bool = True,
    tolerance: Tolerance | None = None,
    factor: float = NOISE_FACTOR,
    alone: Sequence[torch.Tensor] | None = None,
    padded: torch.Tensor | None = None,
) -> LogitCheck:
    """Each of ``docs`` alone against its place in ``logits [R, L, V]`` and, with ``noise``, against
    its row of the documents right-padded together; judged by :func:`judge` with the floor of the
    dtype ``logits`` were computed in (:func:`compute_dtype`); the padded batch is as wide as the rows of
    ``logits``. Runs without gradients, in the
    caller's mode and autocast state. ``alone`` (``[n, V]`` per document) and ``padded`` (``[K, T, V]``,
    row ``k`` = ``docs[k]``) are the caller's runs of them when it already has them (the verifier
    takes gradients of the same forwards), else they are run here."""
    import torch

    if not docs:
        raise ValueError("no document to compare: the batch holds no document start")
    tol = tolerance_for(compute_dtype(model, logits), tolerance)
    with torch.no_grad():
        if alone is None:
            alone = [alone_logits(model, d.input_ids) for d in docs]
        checked = tuple(document_diff(d, a.detach(), logits.detach()) for d, a in zip(docs, alone))
        noisy = None
        if noise:
            if padded is None:
                padded = padded_logits(model, docs, logits.shape[1] if logits.dim() == 3 else None)
            noisy = tuple(
                document_diff(
                    Document(d.index, d.input_ids, k, tuple(range(len(d.input_ids)))), a.detach(), padded.detach()
                )
                for k, (d, a) in enumerate(zip(docs, alone))
            )
    scale = max(d.scale for d in checked)
    worst_noise = None if noisy is None else max(d.max_diff for d in noisy)
    verdict = judge(max(d.max_diff for d in checked), worst_noise, tol.logit_floor(scale), factor)
    return LogitCheck(checked, noisy, verdict)


def relative_difference(got: torch.Tensor, reference: torch.Tensor) -> float:
    """``||got - reference|| / ||reference||`` in float32 or wider (0 when both are 0)."""
    import torch

    wide = torch.promote_types(torch.promote_types(got.dtype, reference.dtype), torch.float32)
    ref = reference.to(wide)
    norm = ref.norm().item()
    diff = (got.to(wide) - ref).norm().item()
    return diff / norm if norm > 0 else diff
