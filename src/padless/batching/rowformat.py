"""The row format every packing collator shares: how features are validated (:class:`FeatureSpec`)
and what shape the packed rows take (:class:`RowFormat`).

- :class:`FeatureSpec`: raw features -> validated token ids and labels (vocabulary, separator,
  per-token loss weights); shared with the padding collator, so padded and packed batches of the same
  features hold the same tokens.
- :class:`RowFormat`: row length, planner strategy, overlong policy, padding, the attention inputs,
  the 4D mask's dtype and sliding windows. Its fields are documented here once;
  :class:`padless.PackingCollator`, :class:`padless.PreferenceCollator` and
  :class:`padless.RolloutCollator` are row formats that differ only in how features become pieces.
  :meth:`RowFormat.for_model` fits any row format to a model, in these steps: the exactness rule
  (:func:`padless.attention.select.check_exact`) -> the backend's inputs -> the mask dtype and windows
  -> the vocabulary.
- :func:`check_collator`: the check that a format built without the model fits it (the same rule,
  its settings compared with the rule's verdict); it returns the format fitted. A fitted format holds
  the rule's :class:`padless.attention.verdict.Verdict` (:attr:`RowFormat.verdict`), and a packing
  collator collates only fitted, by one or the other, with settings that still fit that verdict, or
  made ``model_free=True`` (checked once, where a batch is built); preference and
  rollout batches are checked where ``sequence_logprobs`` reads them.
- :func:`round_up`: row-width rounding (``pad_to_multiple_of``) for every row format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from padless.attention.adapters import base_model_of
from padless.devices import compute_target
from padless.layout import (  # noqa: F401 (VISION_KEYS re-exported)
    ATTENTION_INPUTS,
    VISION_KEYS,
    AttentionInputs,
    Layout,
    MaskWindows,
    append_separator,
    check_tokens,
    cu_seqlens_from_lengths,
    position_ids_from_lengths,
    untokenized,
)
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int
from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES

if TYPE_CHECKING:
    from padless.attention.verdict import Verdict

_Format = TypeVar("_Format", bound="RowFormat")


@dataclass(frozen=True)
class Sequences:
    """Validated token ids and labels of a batch, as int64 numpy arrays."""

    input_ids: list[np.ndarray]
    """One ``[n_i]`` array of token ids per feature (separator appended)."""
    labels: list[np.ndarray]
    """One ``[n_i]`` array of unshifted labels per feature (``IGNORE_INDEX`` where not trained)."""

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((ids.size for ids in self.input_ids), dtype=np.int64, count=len(self.input_ids))


@dataclass(frozen=True)
class FeatureSpec:
    """How raw features become validated sequences; shared by every collator so that padded and
    packed batches of the same features hold exactly the same tokens."""

    vocab_size: int | None = None
    """If set, every token id and every trained label must lie in ``[0, vocab_size)``; checked here
    (:func:`padless.layout.check_tokens`) because an id past the embedding table fails deep inside
    the model with an unhelpful index error (on a GPU, a device assert)."""
    separator_id: int | None = None
    """If set, appended to every sequence that does not already end with it (e.g. EOS)."""
    train_on_separator: bool = True
    """Whether an appended separator may be a training target: it is one exactly when the token
    before it is (:func:`padless.layout.append_separator`); ``False``: never."""
    loss_weights: str | None = None
    """If set, the feature key holding one loss weight per token; the batch then carries them as
    ``loss_weights`` (:mod:`padless.batching.weights`) for ``model_loss(..., weighting="weights")``."""

    def weights(self, features: Sequence[Mapping[str, Any]]) -> list[np.ndarray] | None:
        """Each feature's validated per-token loss weights (``None`` unless :attr:`loss_weights` is set)."""
        if self.loss_weights is None:
            return None
        from padless.batching.weights import feature_weights

        return [
            feature_weights(f, self.loss_weights, self.separator_id, f"feature {i}") for i, f in enumerate(features)
        ]

    def tokens(self, values: Any, where: str) -> np.ndarray:
        """Validated token ids (no labels, no separator): a prompt."""
        return check_tokens(values, vocab_size=self.vocab_size, where=where)[0]

    def sequence(self, values: Any, labels: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Validated ``(input_ids, labels)`` of one sequence, the separator appended (:attr:`separator_id`)."""
        ids, labels = check_tokens(values, labels, vocab_size=self.vocab_size, where=where)
        if self.separator_id is not None:
            ids, labels = append_separator(ids, labels, self.separator_id, trainable=self.train_on_separator)
            check_tokens(ids[-1:], vocab_size=self.vocab_size, where=f"{where}'s separator")
        return ids, labels

    def prepare(self, features: Sequence[Mapping[str, Any]], carried: Sequence[str] = ()) -> Sequences:
        """Every feature's validated sequence (``input_ids`` and optional ``labels``); every other key
        is one the rows re-derive and it agrees with them (:func:`check_feature_keys`), or one the
        caller carries itself (``carried``: a packing collator's image inputs), else refused."""
        if len(features) == 0:
            raise ValueError("the batch is empty: a collator needs at least one feature")
        all_ids: list[np.ndarray] = []
        all_labels: list[np.ndarray] = []
        for i, feature in enumerate(features):
            if not isinstance(feature, Mapping) or "input_ids" not in feature:
                raise ValueError(untokenized(feature, f"feature {i}"))
            check_feature_keys(feature, f"feature {i}", self.loss_weights, carried)
            ids, labels = self.sequence(feature["input_ids"], feature.get("labels"), f"feature {i}")
            all_ids.append(ids)
            all_labels.append(labels)
        return Sequences(all_ids, all_labels)


FEATURE_KEYS: tuple[str, ...] = ("input_ids", "labels", "seq_lengths")
"""What a feature may carry that the collators read: token ids, labels (``-100``: not trained) and,
for a row packed beforehand, its documents' lengths; plus the ``FeatureSpec(loss_weights=KEY)`` key."""
REDERIVED_KEYS: tuple[str, ...] = ("attention_mask", "position_ids", "token_type_ids", "length")
"""Keys whose information a packed row builds itself. A feature may carry them only where they say
what the row will say: an ``attention_mask`` of ones (a 0 is padding, which packing would train
on), ``position_ids`` counting ``0..n-1`` from each document's start, ``token_type_ids`` of zeros,
a ``length`` equal to the ids'. Anything else a feature carries is refused, never dropped."""


def check_feature_keys(
    feature: Mapping[str, Any], where: str, loss_weights: str | None = None, carried: Sequence[str] = ()
) -> None:
    """Refuse a feature key the collators would not carry into the batch (:data:`FEATURE_KEYS`,
    :data:`REDERIVED_KEYS`, ``carried``: the keys the calling collator carries itself), naming it and
    where the fix goes; nothing a feature holds is dropped without a word."""
    known = (*FEATURE_KEYS, *REDERIVED_KEYS, *carried, loss_weights)
    extra = [k for k in feature if k not in known]
    vision = [k for k in extra if k in VISION_KEYS]
    if vision:
        raise ValueError(
            f"{where} carries image inputs ({', '.join(map(repr, vision))}): this collator does not carry "
            "images (padless.PackingCollator.for_model(model) and padless.PaddingCollator do), and a batch "
            "without them would train the model on image placeholder tokens; remove the image records"
        )
    if extra:
        raise ValueError(
            f"{where} has keys the collator does not pack: {', '.join(map(repr, extra))} (it packs "
            f"{', '.join(map(repr, FEATURE_KEYS))} and re-derives {', '.join(map(repr, REDERIVED_KEYS))}); "
            "remove them from the features (datasets: dataset.remove_columns([...])), or turn a mask "
            "into labels (-100 where a token is not trained)"
        )
    n = len(feature["input_ids"])
    mask = feature.get("attention_mask")
    if mask is not None:
        mask = np.asarray(mask)
        zeros = int(mask.size - np.count_nonzero(mask))
        if mask.shape != (n,) or zeros:
            what = (
                f"{zeros} padding position{'s' if zeros > 1 else ''} (0)"
                if zeros
                else f"shape {mask.shape}, not ({n},)"
            )
            raise ValueError(
                f"{where}'s attention_mask has {what}: a packed row marks documents itself, and "
                "padding inside a feature would be packed as tokens; pass the features unpadded"
            )
    positions = feature.get("position_ids")
    documents = feature.get("seq_lengths", [n])
    if positions is not None and sum(documents) == n:  # lengths that do not sum to n: the pre-packed check says so
        if not np.array_equal(np.asarray(positions).reshape(-1), position_ids_from_lengths(documents)):
            raise ValueError(
                f"{where}'s position_ids do not count 0..n-1 from each document's start (multimodal "
                "or shifted positions?); packed rows restart positions per document themselves, so "
                "they cannot carry these: remove 'position_ids' from the features"
            )
    types = feature.get("token_type_ids") if "token_type_ids" not in carried else None
    if types is not None and np.count_nonzero(np.asarray(types)):
        raise ValueError(
            f"{where}'s token_type_ids are not all 0: packed rows do not carry token types; remove "
            "'token_type_ids', or train padded"
        )
    length = feature.get("length")
    if length is not None and int(np.asarray(length).reshape(-1)[0]) != n:
        raise ValueError(f"{where}'s length {length} is not the length of its input_ids ({n})")


def round_up(n: int, multiple: int | None) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (``None`` or 0: ``n``), as every row width is rounded."""
    return n if not multiple else -(-n // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class RowFormat:
    """What a packed row looks like: its length and padding, how sequences are planned into rows, and
    what the batch carries so that the attention backend keeps documents apart. Every packing
    collator is a row format (its constructor takes these keywords) plus the way it turns features
    into pieces; build one for a model with :meth:`for_model`."""

    max_length: int | None = None
    """Tokens per packed row. ``None``: the whole batch becomes one row (padding-free)."""
    strategy: str = "best_fit_decreasing"
    """Planner strategy (:data:`padless.planning.plan.STRATEGIES`) used when ``max_length`` is set."""
    overlong: str = OVERLONG_DEFAULT
    """Policy for a sequence (or group) longer than ``max_length`` (:data:`padless.planning.plan.OVERLONG_POLICIES`)."""
    pad_token_id: int = 0
    """Id written into padding at the end of a row."""
    pad_to_max_length: bool = False
    """Pad every row to ``max_length`` (static shapes) instead of the longest row of the batch."""
    pad_to_multiple_of: int | None = None
    """Round the row length up to a multiple of this (tensor-core friendly shapes)."""
    attention: AttentionInputs = "mask4d"
    """What the batch carries for the attention backend (see :data:`padless.layout.AttentionInputs`):
    ``mask4d`` (sdpa, eager), ``varlen`` (padless attention, flash-attn) or ``position_ids``."""
    mask_dtype: torch.dtype | None = None
    """Dtype of the 4D additive mask: the dtype of the model's weights (default float32); under
    autocast the attention op casts it with the scores."""
    windows: MaskWindows = None
    """The model's sliding windows, kept inside each document by the 4D mask: ``None`` none, ``w``
    one window for every layer, or layer type -> window (``attention_mask`` is then a dict of masks
    by layer type, which transformers models with ``layer_types`` take as they are). A 4D mask
    replaces the model's own mask, window included: :meth:`for_model` sets this from the model."""
    max_image_patches: int | None = None
    """The most vision-encoder patches a row may hold (images of vision-language features, counted by
    :func:`padless.batching.vision.image_patches`), a second limit beside ``max_length`` so that one row
    does not collect every large image (:mod:`padless.planning.costs`); ``None``: tokens only. A
    micro-batch of ``k`` rows then holds at most ``k * max_image_patches``."""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    """Token validation (vocabulary), the separator appended to every sequence (EOS) and per-token
    loss weights; shared with :class:`padless.PaddingCollator`."""
    verdict: Verdict | None = None
    """The one rule's verdict on the model this format was fitted to (its name, backend, row length,
    layout and what the batch must carry): set by :meth:`for_model` and :func:`check_collator`.
    ``None``: built without a model, and such a :class:`padless.PackingCollator` refuses to collate
    (its preference and rollout kin collate, their batches checked by ``sequence_logprobs``); a format
    whose settings no longer fit the verdict (``dataclasses.replace``) refuses too, where a batch is
    built, unless :attr:`model_free` says so. The one name of the fitted state: ``verdict is None``
    is "not fitted"."""
    model_free: bool = False
    """``True`` states that this format collates without knowing the model and that its batches are
    yours to check: a model-free batch cannot carry the model's sliding windows, chunked attention,
    position scheme or hybrid layers, and runs contaminated on such models. Check each (model, batch)
    pair with :func:`padless.check_batch` (padless' consumers do: ``sequence_logprobs``,
    ``PackedTrainer``) or never hand the batches to a model (layout inspection, tests)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_INPUTS:
            raise ValueError(
                f"unknown attention inputs {self.attention!r}; choose one of {', '.join(ATTENTION_INPUTS)}"
            )
        if self.max_length is not None:
            check_int(self.max_length, "max_length")
        if self.pad_to_multiple_of is not None:
            check_int(self.pad_to_multiple_of, "pad_to_multiple_of")
        if self.max_image_patches is not None:
            check_int(self.max_image_patches, "max_image_patches")
            if self.max_length is None:
                raise ValueError("max_image_patches bounds planned rows; it needs max_length")
        check_choice(self.strategy, STRATEGIES, "strategy")
        check_choice(self.overlong, OVERLONG_POLICIES, "overlong policy")
        values = list(self.windows.values()) if isinstance(self.windows, dict) else [self.windows]
        if any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1) for w in values):
            raise ValueError(
                f"windows must be None, a positive int or a dict of them by layer type, got {self.windows!r}"
            )
        if self.windows is not None and self.attention != "mask4d":
            raise ValueError(
                f"windows apply to the 4D mask only; attention={self.attention!r} takes the model's own windows"
            )

    _checked_downstream = False  # a class attribute, not a field
    """``True`` where a format without a :attr:`verdict` may collate all the same because every batch
    it makes is checked before a forward: the preference and rollout collators, whose batches
    ``sequence_logprobs`` reads after :func:`padless.check_batch`; a :class:`padless.PackingCollator`'s
    batches go straight to ``model(**batch)``, so it needs the verdict."""

    def _check_verdict(self) -> None:
        """Raise ``ValueError`` unless this format may collate: it holds a :attr:`verdict` its settings
        still fit, or is :attr:`model_free`, or its batches are checked downstream
        (:attr:`_checked_downstream`). The one check where a batch is built: collators call it once the
        features are validated, so no batch that some model would run contaminated leaves a collator
        that never saw the model, and bad input is still reported by name."""
        if self.model_free:
            return
        name = type(self).__name__
        if self.verdict is not None:
            changed = self._unfit(self.verdict)
            if not changed:
                return
            raise ValueError(
                f"this {name} was fitted to {self.verdict.model}, and since then its settings changed "
                f"({changed}), which that model was not checked for; fit it again: "
                f"{name}.for_model(model, ...) or padless.check_collator(model, collator)"
            )
        if self._checked_downstream:
            return
        raise ValueError(
            f"this {name} was built without a model, so its batches cannot carry the model's sliding windows, "
            f"chunked attention, position scheme or hybrid layers, and would run contaminated on such models; "
            f"build it with {name}.for_model(model, ...), or fit it with "
            f"collator = padless.check_collator(model, collator); model_free=True collates anyway and leaves "
            f"each batch to you (padless.check_batch(model, batch) before model(**batch))"
        )

    def _unfit(self, verdict: Verdict) -> str:
        """What of this format's settings does not fit ``verdict`` (empty: all of it fits): the row
        length and layout it was judged for, then what the batch carries, by the comparison
        :func:`padless.check_batch` makes of a batch (:func:`padless.attention.verdict.mismatch`)."""
        from padless.attention.verdict import mismatch

        judged = {"max_length": verdict.max_length, "layout": verdict.layout}
        changed = [f"{k} {v!r} -> {getattr(self, k)!r}" for k, v in judged.items() if getattr(self, k) != v]
        if changed:
            return ", ".join(changed)
        reason = mismatch(
            verdict,
            self.attention,
            subject="collator",
            windows=self.windows,
            mask_dtype=self.mask_dtype or torch.float32,
        )
        return "" if reason is None else reason.rsplit("; ", 1)[0]

    def exactness_settings(self) -> dict[str, Any]:
        """The settings a model's exactness depends on (what :attr:`verdict` is checked against): the row length
        (windows and refusals depend on the longest document), the attention inputs, the mask's
        windows and dtype, the layout. Padding, planner and validation settings do not matter."""
        windows = tuple(sorted(self.windows.items())) if isinstance(self.windows, dict) else self.windows
        return {
            "max_length": self.max_length,
            "attention": self.attention,
            "windows": windows,
            "mask_dtype": self.mask_dtype,
            "layout": self.layout,
        }

    @property
    def layout(self) -> Layout:
        """The row layout this format builds (:meth:`layout_of` its own options)."""
        return self.layout_of(self.__dict__)

    @classmethod
    def layout_of(cls, options: Mapping[str, Any]) -> Layout:
        """The row layout (:data:`padless.layout.Layout`) built with ``options``; collators
        of shared-prompt trees answer ``shared_prompt`` where their options ask for one."""
        return "documents"

    @classmethod
    def for_model(cls: type[_Format], model: Any, *, device: Any = None, dtype: Any = None, **options: Any) -> _Format:
        """An instance whose attention inputs, mask dtype, sliding windows and vocabulary fit ``model``'s
        attention backend (``model.config._attn_implementation``) for documents of at most
        ``max_length`` tokens; ``options`` are the constructor's keywords (given ones are kept).

        ``device`` and ``dtype``: where training will run and its compute dtype (e.g. ``"cuda"`` and
        ``torch.bfloat16`` under autocast over float32 weights), when they differ from where the
        weights sit now (a collator is often built before the model is moved); default: the model's
        device and compute dtype (:func:`padless.devices.compute_target`: an FSDP2 model's
        ``param_dtype``, else ``model.dtype``).

        Hybrid and state-space models (gated DeltaNet, Mamba / Mamba2 mixers, short convolutions, ...)
        just work: their token mixers are first patched to run on each packed document alone
        (:func:`padless.attention.mixers.enable_per_document_mixers`, in place and idempotent; a model without such
        layers is untouched, and one with a mixer of unknown kind is refused by the rule), so
        ``PackingCollator.for_model`` and the preference / rollout collators' ``for_model`` pack them.

        The one sequence: the exactness rule (:func:`padless.attention.select.check_exact`, which
        raises ``ValueError`` naming a backend that is exact when this one is not) -> the inputs the
        backend needs (a different ``attention`` given is refused) -> the mask's dtype and, for a 4D
        mask, the model's sliding windows -> the vocabulary size for token validation."""
        from padless.attention import select
        from padless.attention.backend import BACKEND_NAME
        from padless.attention.facts import model_facts
        from padless.attention.mixer_documents import capture_model_forward
        from padless.attention.mixers import enable_per_document_mixers

        backend = model.config._attn_implementation
        device, dtype = compute_target(model, device, dtype)
        if model_facts(model, device, dtype).mixers_patchable:  # unknown kinds: the rule says why not
            enable_per_document_mixers(model)  # idempotent; keeps no-mixer models untouched
        verdict = select.check_exact(
            model,
            backend,
            device=device,
            dtype=dtype,
            max_length=options.get("max_length"),
            layout=cls.layout_of(options),
        )
        needed = verdict.inputs  # chunked attention: position_ids alone (transformers' own masks)
        if options.setdefault("attention", needed) != needed:
            raise ValueError(
                f"attention={options['attention']!r} does not isolate documents on backend {backend!r}, "
                f"which needs attention={needed!r}"
            )
        if backend == BACKEND_NAME:  # its attention checks that the boundaries sent to the model reach it
            capture_model_forward(model)
        options.setdefault("mask_dtype", verdict.mask_dtype)
        if needed == "mask4d":
            options.setdefault("windows", verdict.windows)
        vocab_size = getattr(model.config, "vocab_size", None)
        features = options.get("features") or FeatureSpec()
        if vocab_size and features.vocab_size is None:
            features = dataclasses.replace(features, vocab_size=vocab_size)
        options["features"] = features
        fitted = cls(**options, verdict=verdict)
        unfit = fitted._unfit(verdict)  # windows or a mask dtype given that the model does not take
        if unfit:
            raise ValueError(f"the options given do not fit {verdict.model}: {unfit}; leave them to for_model")
        return fitted

    def row_width(self, used: int) -> int:
        """Tokens per row of a batch whose longest row holds ``used``: ``max_length`` with
        ``pad_to_max_length``, then rounded up to ``pad_to_multiple_of``."""
        width = self.max_length if self.pad_to_max_length and self.max_length else used
        return round_up(width, self.pad_to_multiple_of)

    def row_inputs(
        self,
        input_ids: np.ndarray,
        labels: np.ndarray,
        position_ids: np.ndarray,
        row_docs: Sequence[Sequence[int]] | None,
        blocks: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The model inputs of packed ``[R, L]`` rows: ``input_ids``, ``labels``, ``position_ids``,
        ``use_cache=False`` (a cache silently turns off transformers' packed-row handling) and, for rows
        of plain documents (``row_docs``: each row's document lengths, the trailing pad the last one),
        what :attr:`attention` carries: the 4D block-causal mask (with :attr:`windows`) or
        ``cu_seq_lens_q/k`` and ``max_length_q/k`` (sent beside a 4D mask too where the model's token
        mixers read them: :attr:`padless.attention.verdict.Verdict.boundaries`). ``row_docs=None``: the caller adds the attention
        inputs (a shared-prompt tree). ``blocks``: ``[R, L]`` bidirectional image blocks the 4D mask
        carries (:func:`padless.batching.vision.block_ids`)."""
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "use_cache": False,
        }
        if row_docs is None:
            return batch
        if self.attention == "mask4d":
            from padless.attention.masks import additive_block_causal_mask

            mask = lambda w: additive_block_causal_mask(row_docs, dtype=self.mask_dtype, window=w, blocks=blocks)  # noqa: E731
            if isinstance(self.windows, dict):  # one mask per distinct window, shared by its layer types
                made = {w: mask(w) for w in set(self.windows.values())}
                batch["attention_mask"] = {t: made[w] for t, w in self.windows.items()}
            else:
                batch["attention_mask"] = mask(self.windows)
        if self.attention == "varlen" or (self.verdict is not None and self.verdict.boundaries):
            batch.update(boundary_inputs(row_docs))  # a hybrid's token mixers read them beside a 4D mask
        return batch


def boundary_inputs(row_docs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """``cu_seq_lens_q/k`` (int32 offsets over the flat ``R * L`` tokens) and ``max_length_q/k`` of
    rows holding documents of these lengths (each row's trailing pad its last document)."""
    docs = np.concatenate([np.asarray(d, dtype=np.int64) for d in row_docs])
    cu = torch.from_numpy(cu_seqlens_from_lengths(docs)).to(torch.int32)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": int(docs.max()), "max_length_k": int(docs.max())}


def check_collator(model: Any, collator: _Format, *, device: Any = None, dtype: Any = None) -> _Format:
    """The collator fitted to ``model`` (a copy holding the rule's verdict, :attr:`RowFormat.verdict`; the running
    totals stay shared), if the batches ``collator`` (a :class:`padless.PackingCollator`,
    :class:`padless.PreferenceCollator` or :class:`padless.RolloutCollator`, built with or without the
    model) makes are exact on it; raise ``ValueError`` naming why otherwise. It asks the exactness rule once
    for this model, layout and row length (its :class:`padless.attention.verdict.Verdict`), then
    compares the collator's settings (attention inputs, sliding windows, mask dtype) with what the
    verdict needs, by the comparison :func:`padless.check_batch` makes of a batch's contents
    (:func:`padless.attention.verdict.mismatch`). ``device`` / ``dtype``: where training runs
    (default: the model's parameters)."""
    from padless.attention import select
    from padless.attention.verdict import mismatch

    backend = base_model_of(model).config._attn_implementation
    verdict = select.check_exact(
        model, backend, device=device, dtype=dtype, max_length=collator.max_length, layout=collator.layout
    )
    reason = mismatch(
        verdict,
        collator.attention,
        subject="collator",
        windows=collator.windows,
        mask_dtype=collator.mask_dtype or torch.float32,
    )
    if reason is not None:
        raise ValueError(reason)
    return dataclasses.replace(collator, verdict=verdict)  # a copy: the running totals stay shared
