"""The one rule that says whether a packed batch is exact on a (model, backend, device, dtype).

Each transformers attention backend is described by a :class:`BackendSpec` of the backend table
(:mod:`padless.attention.backend_table`, its names re-exported here): what a packed batch must carry for
it (:data:`padless.layout.AttentionInputs`) and why it would *not* isolate documents for a given
model, device and dtype. :func:`decide` is the one rule (model facts
(:mod:`padless.attention.facts`), backend, row length, layout -> :class:`padless.attention.verdict.Verdict`:
exact with what the batch must carry, or refused naming a backend that is exact); :func:`check_exact`
is its public face (a model or config in, the exact verdict out, else ``ValueError``), and
:func:`resolve_backend` picks the fastest backend it accepts. The collator's ``for_model``,
:func:`padless.check_collator`, :func:`padless.check_batch`, ``verify`` and the bench ask them, never a
rule of their own, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

import torch

from padless.attention.backend_table import (  # noqa: F401 (re-exported: the backend table)
    _PREFERENCE,
    BACKENDS,
    MIXER_LAYER_TYPES,
    BackendSpec,
    _Case,
    backend_inputs,
)
from padless.attention.facts import MixerState, ModelFacts, attention_free, model_facts  # noqa: F401 (re-exported)
from padless.attention.multimodal import image_refusal
from padless.attention.verdict import Verdict
from padless.devices import compute_target  # noqa: F401 (re-exported: a training step's compute dtype)
from padless.layout import ATTENTION_INPUTS, LAYOUTS, AttentionInputs, Layout, MaskWindows  # noqa: F401 (re-exported)


def _refuse_model(t: _Case) -> str | None:
    """What no backend can make exact: the model's own rules reach across the whole row."""
    r = t.rules
    if r.adapter is not None:
        return r.adapter
    if r.alibi:  # relative positions: exact with a block mask alone where the model takes one
        from padless.attention.positions import alibi_refusal

        reason = alibi_refusal(t.config, backend=t.backend)
        if reason is not None:
            return f"the model uses ALiBi positions: {reason}"
    elif r.takes_position_ids is False and not t.attention_free:
        return (
            f"{t.model_class.__name__}.forward takes no position_ids, so packed documents would be given "
            "positions that run on across document boundaries"
        )
    if r.bidirectional:
        return "the model attends in both directions (use_bidirectional_attention, or is_decoder=False)"
    if r.offset_positions:
        return (
            "the model numbers positions from padding_idx + 1 when it computes them itself (RoBERTa family), "
            "so position ids restarted at 0 would give each packed document other positions than it has alone"
        )
    mixers = t.facts.mixers
    if mixers is MixerState.REFUSED:
        return t.facts.mixer_reason
    found = mixers is not MixerState.NONE_FOUND
    others = tuple(x for x in r.other_layer_types if x not in MIXER_LAYER_TYPES) if found else r.other_layer_types
    if others:
        kinds = ", ".join(map(repr, others))
        fix = ""
        if not found and any(x in MIXER_LAYER_TYPES for x in others):
            fix = (
                "; on a model (not a bare config), padless.attention.mixers.enable_per_document_mixers(model) runs them on each "
                "document alone (PackingCollator.for_model calls it)"
            )
        return (
            f"layers of type {kinds} mix tokens without the attention mask (recurrent, linear, convolution or "
            f"sparse-indexed layers), so their state runs along the whole row, across documents{fix}"
        )
    return None


def model_inputs(model_or_config: Any, backend: str) -> AttentionInputs:
    """What a packed batch must carry for ``backend`` on this model: :func:`backend_inputs`, except that a
    model with chunked attention (Llama 4) on a 4D-mask backend gets restarted ``position_ids`` alone,
    from which transformers builds per-document chunked masks itself (a 4D mask would replace its
    chunks); :func:`check_exact` accepts that only where the model builds its masks from position ids.
    ``model_or_config`` may be its :class:`padless.attention.facts.ModelFacts`."""
    return _inputs(model_facts(model_or_config), backend)


def _inputs(facts: ModelFacts, backend: str) -> AttentionInputs:
    inputs = backend_inputs(backend)
    if facts.attention_free:  # no attention runs: the mixers read the boundaries sent (cu_seq_lens_q/k)
        return "varlen"
    rules = facts.rules
    if inputs == "mask4d" and rules.chunk_size is not None and rules.masks_from_position_ids:
        return "position_ids"
    return inputs


def _target(model_or_config: Any, device: Any, dtype: Any, max_length: int | None, layout: str = "documents") -> _Case:
    """The question about a model (or its facts) before a backend is named."""
    return _case(model_facts(model_or_config, device, dtype), None, max_length, layout)


def _case(facts: ModelFacts | None, backend: str | None, max_length: int | None, layout: str) -> _Case:
    """The question, its arguments checked (``backend=None``: none named yet)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return _Case(facts, backend or "", max_length, layout)  # type: ignore[arg-type]


def _reason(target: _Case, backend: str) -> str | None:
    target = _Case(target.facts, backend, target.max_length, target.layout)
    if target.attention_free:  # no attention runs: the backend's limits do not matter
        return _refuse_model(target) or _refuse_attention_free_layout(target)
    return _refuse_model(target) or BACKENDS[backend].refuse(target) or _refuse_layout(target)


def _refuse_attention_free_layout(t: _Case) -> str | None:
    if t.layout == "shared_prompt":
        return (
            "a shared-prompt tree needs attention to let completions see the prompt; the state-space / "
            "recurrent mixers of a model without attention run each document alone"
        )
    return None


def _refuse_layout(t: _Case) -> str | None:
    """What a shared-prompt tree needs beyond document isolation."""
    if t.layout != "shared_prompt":
        return None
    from padless.attention.tree import shared_prompt_refusal

    reason = shared_prompt_refusal(t.backend)
    if reason is None and BACKENDS[t.backend].inputs == "mask4d" and t.rules.active_windows(t.max_length):
        reason = "the 4D tree mask of a shared prompt carries no sliding window"
    if reason is None and t.rules.chunk_size is not None:
        reason = "the tree of a shared prompt carries no chunked attention"
    return reason


def check_exact(
    model_or_config: Any,
    backend: str,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    max_length: int | None = None,
    layout: Layout = "documents",
) -> Verdict:
    """The one rule: the exact :class:`padless.attention.verdict.Verdict` (what the batch must carry)
    if packed rows trained with attention ``backend`` on ``model_or_config`` (a transformers model or
    config, or its :class:`padless.attention.facts.ModelFacts`; ``None``: no model-specific rule) on
    ``device`` in ``dtype`` (where training will run and its compute dtype:
    :func:`padless.devices.compute_target` fills them from the model and the autocast state when not
    given) compute exactly what each document computes alone, else raise ``ValueError`` naming a
    backend that does (or saying that none does). ``max_length`` bounds the tokens of a document in a
    row (``None``: unbounded); a sliding window at least that long never cuts a document. ``layout``
    (:data:`Layout`): ``shared_prompt`` rows also need a backend that expresses the tree.

    Checked: the model's own attention rules (:func:`padless.attention.rules.attention_rules`:
    sliding windows per layer type, soft-capping, sinks, ALiBi, bidirectional or recurrent layers,
    position_ids) against what each backend honours, and the fused kernels' limits (CUDA capability,
    head size: :mod:`padless.attention.kernels`) and whether the model's flash-attention code carries
    document boundaries to the kernel. The collator's ``for_model``,
    :func:`resolve_backend`, :func:`padless.verify_isolation`, the preference and rollout collators
    and the bench all ask this function (or :func:`decide`, its answer without the raise)."""
    _case(None, backend, max_length, layout)  # bad arguments are named before the model is read
    facts = model_facts(model_or_config, device, dtype)
    return decide(facts, backend, max_length=max_length, layout=layout).require()


def decide(facts: ModelFacts, backend: str, *, max_length: int | None = None, layout: Layout = "documents") -> Verdict:
    """The rule's :class:`padless.attention.verdict.Verdict` on ``facts`` (:func:`padless.attention.facts.model_facts`)
    for ``backend``, rows whose documents hold at most ``max_length`` tokens and ``layout``: exact with
    what the batch must carry, or refused with why and a backend that is exact. Bad arguments (an
    unknown backend or layout) raise ``ValueError``; a refusal does not (:meth:`Verdict.require` does)."""
    case = _case(facts, backend, max_length, layout)
    reason = _reason(case, backend)
    inputs = _inputs(facts, backend)
    message = None
    if reason is not None:
        alternative, reasons = _first_exact(case)
        if alternative:
            advice = f"use backend {alternative!r}"
        elif all(r.endswith(": " + reason) for r in reasons):  # the model's own rule: the same for every backend
            advice = "no attention backend can"
        else:
            advice = "no attention backend can (" + "; ".join(reasons) + ")"
        message = f"attention backend {backend!r} cannot guarantee isolated packed documents here: {reason}; {advice}"
    windows = mask_windows(facts, max_length) if reason is None and inputs == "mask4d" else None
    images_reason = image_refusal(facts.vision, facts.vision_reason, inputs, layout) if reason is None else None
    return Verdict(
        model=facts.name,
        backend=backend,
        max_length=max_length,
        layout=layout,
        reason=reason,
        message=message,
        inputs=inputs,
        backend_inputs=BACKENDS[backend].inputs,
        windows=windows,
        mask_dtype=facts.weights_dtype,
        positions_alone=facts.rules.masks_from_position_ids,
        attention_free=facts.attention_free,
        boundaries=bool(facts.mixer_layers),
        mixers=mixer_paths(facts.mixer_layers),
        model_class=facts.base_class or "this model",
        vision=facts.vision if reason is None and images_reason is None else None,
        images_reason=images_reason,
    )


_PATHS = {
    "scan": "one chunked scan over the row (boundaries as masks)",
    "per_document": "each document alone (regrouped by length, right-padded: no scan for this kind yet)",
    "kernel_cu_seqlens": "the CUDA kernel, given the boundaries",
}


def mixer_paths(layers: Any) -> str | None:
    """What :attr:`padless.attention.verdict.Verdict.mixers` says of ``layers`` (:class:`MixerInfo`)."""
    if not layers:
        return None
    counts: dict[tuple[str, str], int] = {}
    for layer in layers:
        key = (layer.kind, _PATHS.get(layer.how, layer.how))
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} {kind} layer{'s' * (n > 1)}: {how}" for (kind, how), n in counts.items())


def mask_windows(model_or_config: Any, max_length: int | None) -> MaskWindows:
    """The sliding windows a 4D packed mask must carry for this model (or its
    :class:`padless.attention.facts.ModelFacts`) and row length (see :data:`padless.layout.MaskWindows`)."""
    return model_facts(model_or_config).rules.mask_windows(max_length)


def resolve_backend(
    requested: str | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    config: Any = None,
    max_length: int | None = None,
    layout: Layout = "documents",
) -> str:
    """The attention backend to train packed rows with: ``requested`` if :func:`check_exact` accepts
    it for this model (``config``: a transformers config or model), device and compute dtype
    (:func:`compute_target`: where training runs, autocast included) and ``max_length``
    (longest document; ``None``: unbounded), else ``ValueError`` naming one that can; with
    ``requested=None`` the fastest exact one. Registers the padless backend when it is returned, so
    the name can be used at once. A hybrid model's token mixers are patched to keep documents apart
    first (:func:`padless.attention.mixers.enable_per_document_mixers`, as every collator's ``for_model``
    does), so the answer is the backend those collators will use."""
    if config is not None and hasattr(config, "named_modules") and model_facts(config).mixers_patchable:
        from padless.attention.mixers import enable_per_document_mixers

        enable_per_document_mixers(config)
    if requested is not None:
        check_exact(config, requested, device=device, dtype=dtype, max_length=max_length, layout=layout)
        chosen = requested
    else:
        target = _target(config, device, dtype, max_length, layout)
        found, reasons = _first_exact(target)
        if found is None:
            raise ValueError("no attention backend can isolate packed documents here (" + "; ".join(reasons) + ")")
        chosen = found
    return use_backend(chosen)


def use_backend(backend: str) -> str:
    """``backend``, registered with transformers first where it is padless attention (idempotent), so
    ``model.set_attn_implementation(backend)`` finds it: padless registers its backend only here, and
    only when it is chosen (:func:`resolve_backend`, ``verify``)."""
    from padless.attention.backend import BACKEND_NAME, register_padless_attention

    if backend == BACKEND_NAME:
        register_padless_attention()
    return backend


def _first_exact(target: _Case) -> tuple[str | None, list[str]]:
    """The fastest exact backend (None if none) and, per backend tried, why it was refused."""
    reasons = []
    for name in _PREFERENCE:
        reason = _reason(target, name)
        if reason is None:
            return name, reasons
        reasons.append(f"{name}: {reason}")
    return None, reasons
