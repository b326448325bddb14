"""The rule's answer, :class:`Verdict`, and the comparison of what a batch carries with what it needs.

:func:`padless.attention.select.decide` reads a model's facts (:class:`padless.attention.facts.ModelFacts`)
for a backend, a row length and a layout and returns a :class:`Verdict`: exact, or refused with the
reason and the backend that would be exact; and for an exact one what the batch must carry (the
attention inputs, the 4D mask's sliding windows and dtype). Everything downstream reads the verdict
and derives none of it again: ``for_model`` builds from it, :func:`padless.check_collator` compares a
collator's settings with it and :func:`padless.check_batch` a batch's contents, both through
:func:`mismatch`::

    what is carried (collator settings | batch contents) --mismatch--> verdict's needs -> None | why not
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from padless.layout import AttentionInputs, Layout, MaskWindows

if TYPE_CHECKING:
    import torch

    from padless.attention.multimodal import VisionScheme

COLLATOR_FIX = "build the collator with its for_model(model, ...)"
BATCH_FIX = "build the collator with PackingCollator.for_model(model, ...)"
_UNSEEN: Any = object()


@dataclass(frozen=True)
class Verdict:
    """Whether packed rows of a layout and row length are exact on a model with a backend, and what
    their batches must carry when they are."""

    model: str
    """The model judged and its backend, as collators name what they were fitted to:
    ``"LlamaForCausalLM (sdpa)"``."""
    backend: str
    """The attention backend judged."""
    max_length: int | None
    """The longest document of a row (``None``: unbounded)."""
    layout: Layout
    """:data:`padless.layout.Layout` of the rows."""
    reason: str | None
    """Why the rows would not be exact (``None``: exact)."""
    message: str | None
    """The refusal as :meth:`require` raises it: the reason and a backend that is exact (or that none is)."""
    inputs: AttentionInputs
    """What a batch must carry (:data:`padless.layout.AttentionInputs`)."""
    backend_inputs: AttentionInputs
    """What the backend itself takes (:func:`padless.backend_inputs`): ``inputs`` differs where no
    attention runs, or where the model builds chunked masks from ``position_ids``."""
    windows: MaskWindows = None
    """The sliding windows a 4D mask must carry (``None`` where ``inputs`` is not ``mask4d``)."""
    mask_dtype: torch.dtype | None = None
    """The dtype of a 4D mask: the weights' (autocast casts the scores, not the mask); ``None``: a
    stand-in for a model that has no dtype (not compared)."""
    positions_alone: bool = False
    """Restarted ``position_ids`` alone (no mask, ``use_cache=False``) are exact too on this 4D-mask
    backend: the model builds per-document masks, windows included, from them."""
    attention_free: bool = False
    """No attention runs (:func:`padless.attention.facts.attention_free`)."""
    mixers: str | None = None
    """How the model's token mixers keep packed documents apart, by kind (``None``: it has none), e.g.
    ``"3 gated_deltanet layers: one chunked scan over the row"``; a kind without a scan says it is
    regrouped per document (:data:`padless.attention.mixers.MixerInfo.how`)."""
    boundaries: bool = False
    """The batch carries ``cu_seq_lens_q/k`` and ``max_length_q/k`` whatever its attention inputs: the
    model's token mixers (gated DeltaNet, Mamba, short convolutions) read the documents from them
    (:mod:`padless.attention.mixer_documents`), never from the positions or a mask."""
    model_class: str = ""
    """The class name of the model an adapter wraps, for messages."""
    vision: VisionScheme | None = None
    """How the batch carries images (:class:`padless.attention.multimodal.VisionScheme`), where rows
    with images are exact too; ``None``: rows may carry text only (:attr:`images_reason` says why)."""
    images_reason: str | None = None
    """Why rows with images would not be exact here (``None``: they would, or the rows are refused)."""

    @property
    def exact(self) -> bool:
        return self.reason is None

    def require(self) -> Verdict:
        """This verdict if exact, else ``ValueError`` with :attr:`message`."""
        if self.reason is not None:
            raise ValueError(self.message)
        return self


def mismatch(
    verdict: Verdict,
    carried: str,
    *,
    subject: Literal["collator", "batch"],
    windows: Any = _UNSEEN,
    mask_dtype: Any = _UNSEEN,
    use_cache: Any = False,
    boundaries: Any = _UNSEEN,
) -> str | None:
    """Why what is carried does not fit an exact ``verdict`` (``None``: it fits): ``carried`` attention
    inputs (a collator's :attr:`padless.batching.rowformat.RowFormat.attention`, or what a batch holds:
    :func:`padless.attention.accept.carried_inputs`), and for a 4D mask its ``windows`` and
    ``mask_dtype`` where known from settings (a batch's masks are compared entry by entry by
    :func:`padless.check_batch`). ``use_cache``: the batch's flag (position ids alone need ``False``).
    ``boundaries``: whether ``cu_seq_lens_q/k`` are carried (a batch's keys; a collator sends them where
    its verdict says so)."""
    batch = subject == "batch"
    fix = BATCH_FIX if batch else COLLATOR_FIX
    if verdict.boundaries and boundaries is False:
        return (
            f"this {subject} carries no document boundaries (cu_seq_lens_q/k), and {verdict.model_class}'s token-mixing "
            f"layers read the documents from them alone (a forward without them runs each layer over the whole row); "
            f"{fix}"
        )
    if carried == "position_ids" and verdict.backend_inputs == "mask4d" and not verdict.attention_free:
        if verdict.positions_alone:  # transformers builds per-document masks, windows included, from them
            if use_cache is not False:
                return (
                    "this batch carries position_ids alone without use_cache=False; with a cache transformers "
                    f"does not look for documents in them; {fix}"
                )
            return None
        if batch:
            return (
                f"this batch carries position_ids alone, and {verdict.model_class} does not build its masks "
                f"from them, so its documents would attend to each other; {fix}"
            )
    if carried != verdict.inputs:
        what = (
            f"this batch carries {carried!r} attention inputs" if batch else f"the collator sends attention={carried!r}"
        )
        return (
            f"{what}, but attn_implementation={verdict.backend!r} isolates documents only with "
            f"{verdict.inputs!r}; {fix}"
        )
    if carried != "mask4d":
        return None
    if windows is not _UNSEEN and _normal(windows) != _normal(verdict.windows):
        return f"the collator's 4D masks carry sliding windows {windows!r}, the model needs {verdict.windows!r}; {fix}"
    if mask_dtype is not _UNSEEN and verdict.mask_dtype is not None and mask_dtype != verdict.mask_dtype:
        return f"the collator's 4D mask is {mask_dtype}, the model's weights are {verdict.mask_dtype}; {fix}"
    return None


def _normal(windows: MaskWindows) -> Any:
    """Windows as a comparable value: a dict whose layer types share one window is that window."""
    if isinstance(windows, Mapping):
        values = set(windows.values())
        return next(iter(values)) if len(values) == 1 else dict(windows)
    return windows
