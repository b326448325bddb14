"""The one rule that says whether a packed batch is exact on a (model, backend, device, dtype), and
the backend table it reads.

Each transformers attention backend is described by a :class:`BackendSpec`: what a packed batch
must carry for it (:data:`padless.layout.AttentionInputs`) and why it would *not* isolate documents
for a given model, device and dtype. :func:`decide` is the one rule (model facts
(:mod:`padless.attention.facts`), backend, row length, layout -> :class:`padless.attention.verdict.Verdict`:
exact with what the batch must carry, or refused naming a backend that is exact); :func:`check_exact`
is its public face (a model or config in, the exact verdict out, else ``ValueError``), and
:func:`resolve_backend` picks the fastest backend it accepts. The collator's ``for_model``,
:func:`padless.check_collator`, :func:`padless.check_batch`, ``verify`` and the bench ask them, never a
rule of their own, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from padless.attention.facts import MixerState, ModelFacts, attention_free, model_facts  # noqa: F401 (re-exported)
from padless.attention.kernels import flash_boundary_refusal, kernel_refusal
from padless.attention.verdict import Verdict
from padless.devices import compute_target  # noqa: F401 (re-exported: the one compute dtype)
from padless.layout import ATTENTION_INPUTS, LAYOUTS, AttentionInputs, Layout, MaskWindows  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class _Case:
    """One question put to the rule: these model facts, with this backend, for rows of this length
    and layout. The refusals read the facts through it."""

    facts: ModelFacts
    backend: str
    max_length: int | None
    layout: str = "documents"

    rules = property(lambda self: self.facts.rules)
    config = property(lambda self: self.facts.config)
    model_class = property(lambda self: self.facts.model_class)
    device = property(lambda self: self.facts.device)
    dtype = property(lambda self: self.facts.dtype)
    head_dim = property(lambda self: self.facts.head_dim)
    attention_free = property(lambda self: self.facts.attention_free)


@dataclass(frozen=True)
class BackendSpec:
    """How a transformers attention backend isolates packed documents."""

    inputs: AttentionInputs
    """What the collator must send: ``varlen`` (position_ids + cu_seq_lens_q/k, max_length_q/k, no
    attention_mask), ``mask4d`` (4D float additive block-causal mask + position_ids) or ``position_ids``."""
    refuse: Callable[[_Case], str | None]
    """Why the backend cannot guarantee isolation for a model, device and dtype (None: it can)."""


def _lacks(t: _Case, flag: str) -> bool:
    return t.model_class is not None and not getattr(t.model_class, flag, False)


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


MIXER_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "mamba", "attention")
"""``config.layer_types`` entries exact once every token mixer found in the model runs per document
(:func:`padless.attention.mixers.enable_per_document_mixers`): gated DeltaNet / Kimi delta / lightning attention / Mamba
mixers (``linear_attention``, ``mamba``), LFM2 short convolutions (``conv``), Falcon-H1 / Zamba's
parallel or shared blocks (``hybrid``) and GraniteMoeHybrid's name for softmax attention
(``attention``). Other non-attention types (``indexed_attention``, compressed attention) stay refused."""


_NO_BOUNDARIES = "decoder layers pass its attention no position_ids or document boundaries"
_PADLESS_REFUSED: dict[str, str] = {
    "granitemoehybrid": _NO_BOUNDARIES,
    "zamba": _NO_BOUNDARIES,
    "recurrent_gemma": _NO_BOUNDARIES,
    "doge": "attention layers add a 4D mask of their own (a dynamic mask) that padless attention would drop",
}
"""Model types (transformers 5.24) padless attention refuses although their class declares
``_supports_attention_backend``, with why: decoder layers that call attention without the
``position_ids`` / ``cu_seq_lens`` padless attention separates documents by (found running
tests/attention/test_mixers.py), and attention layers that add a 4D mask of their own making to the
scores (Doge's dynamic mask), which padless attention, computing per document without a mask, would
drop (found by the sweep, tests/attention/test_sweep.py)."""


def _head_sizes(config: Any) -> tuple[int | None, int | None]:
    """(query/key head size, value head size) where a config declares them apart (MLA: Kimi-Linear,
    Bailing-hybrid, DeepSeek-V3), else ``(None, None)``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    qk, v = getattr(text, "qk_head_dim", None), getattr(text, "v_head_dim", None)
    if isinstance(qk, int) and isinstance(v, int):
        return qk, v
    return None, None


def _flash_softcap_dropout(t: _Case) -> str | None:
    if t.rules.softcap is not None and t.rules.dropout > 0:
        return "flash-attn has no attention dropout together with logit soft-capping (attention_dropout > 0)"
    return None


def _refuse_padless(t: _Case) -> str | None:
    if _lacks(t, "_supports_attention_backend"):
        return f"{t.model_class.__name__} does not pass position_ids and attention kwargs to its attention layers"
    model_type = getattr(
        t.config.get_text_config() if hasattr(t.config, "get_text_config") else t.config, "model_type", None
    )
    if model_type in _PADLESS_REFUSED:
        return f"{model_type} {_PADLESS_REFUSED[model_type]}"
    qk, v = _head_sizes(t.config)
    if qk is not None and v is not None and qk != v:
        return (
            f"padless attention needs value heads as large as query/key heads, and this model's are {v} and {qk} "
            "(v_head_dim != qk_head_dim)"
        )
    if t.rules.chunk_size is not None:
        return "the model uses chunked attention"
    if t.rules.sinks:
        return "padless attention has no attention sinks (s_aux)"
    if t.rules.softcap is not None:
        kernel = kernel_refusal("flash_attn", t.device, t.dtype, t.head_dim)
        if kernel is not None:
            return f"attention logit soft-capping needs flash-attn on CUDA with fp16/bf16, and here {kernel}"
        return _flash_softcap_dropout(t)
    return None


def _refuse_mask4d(t: _Case, name: str, flag: str | None) -> str | None:
    if flag and _lacks(t, flag):
        return f"{t.model_class.__name__} does not support attn_implementation={name!r}"
    if not t.rules.takes_4d_mask:
        owner = t.model_class.__name__ if t.model_class is not None else "this model"
        return f"{owner} expands a 2D padding mask itself and cannot take the 4D block mask"
    if t.rules.chunk_size is not None and not t.rules.masks_from_position_ids:
        return "a 4D mask replaces the model's chunked attention, and the model builds no mask from position_ids"
    windows = t.rules.mask_windows(t.max_length)
    if isinstance(windows, dict) and not t.rules.accepts_mask_dict:
        owner = t.model_class.__name__ if t.model_class is not None else "this model"
        return f"layers differ in sliding window ({windows}) and {owner} takes no 4D mask per layer type"
    mixer_types = [x for x in t.rules.other_layer_types if x in MIXER_LAYER_TYPES]
    if isinstance(windows, dict) and mixer_types:
        return (
            f"layers differ in sliding window ({windows}) and the per-layer-type 4D masks have none for the "
            f"token-mixer layers ({', '.join(map(repr, mixer_types))}), which the model looks up by layer type"
        )
    if name == "sdpa" and t.rules.softcap is not None:
        return "sdpa has no attention logit soft-capping"
    return None


def _refuse_flash2(t: _Case) -> str | None:
    kernel = kernel_refusal("flash_attn", t.device, t.dtype, t.head_dim, name="flash_attention_2")
    if kernel is not None:
        return kernel
    if _lacks(t, "_supports_flash_attn"):
        return f"{t.model_class.__name__} does not support flash_attention_2"
    return flash_boundary_refusal(t.model_class) or _flash_softcap_dropout(t)


def _refuse_flex(t: _Case) -> str | None:
    if t.device.type == "cpu":
        return "FlexAttention has no backward on CPU in torch 2.13 and crashes the process with 4D masks"
    if _lacks(t, "_supports_flex_attn"):
        return f"{t.model_class.__name__} does not support flex_attention"
    if getattr(t.config, "use_cache", False):
        return "config.use_cache=True disables transformers' packed-row detection from position_ids"
    return None


BACKENDS: dict[str, BackendSpec] = {
    "padless": BackendSpec("varlen", _refuse_padless),
    "sdpa": BackendSpec("mask4d", lambda t: _refuse_mask4d(t, "sdpa", "_supports_sdpa")),
    "eager": BackendSpec("mask4d", lambda t: _refuse_mask4d(t, "eager", None)),
    # transformers 5.24 infers documents from position_ids only when the batch has one row
    # (_is_packed_sequence): with B > 1 it needs cu_seq_lens_q/k, so flash_attention_2 takes varlen.
    "flash_attention_2": BackendSpec("varlen", _refuse_flash2),
    "flex_attention": BackendSpec("position_ids", _refuse_flex),
}
"""Backend name -> what the collator sends for it and when it is refused."""

_PREFERENCE = ("padless", "flash_attention_2", "sdpa", "eager")
"""Fastest exact first: padless' cost follows the documents; the mask4d backends pay for L x L."""


def backend_inputs(backend: str) -> AttentionInputs:
    """What a packed batch must carry for ``backend`` (see :class:`BackendSpec`)."""
    spec = BACKENDS.get(backend)
    if spec is None:
        raise ValueError(
            f"attention backend {backend!r} has no known way to isolate packed documents; "
            f"use one of {', '.join(BACKENDS)}"
        )
    return spec.inputs


def model_inputs(model_or_config: Any, backend: str) -> AttentionInputs:
    """What a packed batch must carry for ``backend`` on this model: :func:`backend_inputs`, except that a
    model with chunked attention (Llama 4) on a 4D-mask backend gets restarted ``position_ids`` alone,
    from which transformers builds per-document chunked masks itself (a 4D mask would replace its
    chunks); :func:`check_exact` accepts that only where the model builds its masks from position ids.
    ``model_or_config`` may be its :class:`padless.attention.facts.ModelFacts`."""
    return _inputs(model_facts(model_or_config), backend)


def _inputs(facts: ModelFacts, backend: str) -> AttentionInputs:
    inputs = backend_inputs(backend)
    if facts.attention_free:  # no attention runs: restarted position_ids reach the mixers
        return "position_ids"
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
        model_class=facts.base_class or "this model",
    )


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
    the name can be used at once."""
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
    ``model.set_attn_implementation(backend)`` finds it: the one place padless registers its backend
    when it is chosen (:func:`resolve_backend`, ``verify``)."""
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
