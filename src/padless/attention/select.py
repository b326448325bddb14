"""The one rule that says whether a packed batch is exact on a (model, backend, device, dtype).

Each transformers attention backend is described by a :class:`BackendSpec`: what a packed batch
must carry for it (:data:`AttentionInputs`) and why it would *not* isolate documents for a given
model, device and dtype. :func:`check_exact` is the one rule (model, backend, device, dtype, row
length -> exact, or ``ValueError`` naming a backend that is); :func:`resolve_backend` picks the
fastest backend it accepts. The collator's ``for_model``, ``verify`` and the bench ask them, never a
rule of their own, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from padless.attention.kernels import flash_boundary_refusal, head_dim_of, kernel_refusal
from padless.attention.rules import AttentionRules, MaskWindows, attention_rules, config_of, model_class_of

if TYPE_CHECKING:
    import torch

AttentionInputs = Literal["mask4d", "varlen", "position_ids"]
"""What a packed batch carries so the attention backend isolates documents:
``mask4d`` a 4D additive block-causal float mask (SDPA, eager); ``varlen`` cumulative sequence
lengths ``cu_seq_lens_q/k`` and ``max_length_q/k`` (padless varlen, flash-attn); ``position_ids``
restarted position ids alone (flash-attn's own detection)."""
ATTENTION_INPUTS: tuple[str, ...] = ("mask4d", "varlen", "position_ids")

Layout = Literal["documents", "shared_prompt"]
"""How a row is laid out: ``documents`` (each document attends to itself only: SFT packing, preference
pairs with ``share_prompt=False``) or ``shared_prompt`` (a prompt once, several completions attending
to it and not to each other: :class:`padless.PreferenceCollator`, :class:`padless.RolloutCollator`)."""
LAYOUTS: tuple[str, ...] = ("documents", "shared_prompt")


@dataclass(frozen=True)
class _Target:
    device: torch.device
    dtype: torch.dtype
    config: Any
    model_class: type | None
    max_length: int | None
    rules: AttentionRules
    head_dim: int | None = None
    """The attention head size (``None``: unknown), for the fused kernels' limits."""
    backend: str = ""
    """The backend being judged (set by :func:`_reason`)."""
    layout: str = "documents"
    """:data:`Layout` of the rows."""
    attention_free: bool = False
    """:func:`attention_free`: no softmax attention runs, so no backend is involved."""
    mixers: str | None = None
    """What the model's token mixers that are not softmax attention need (:mod:`padless.attention.mixers`):
    ``None`` none found (a bare config: unknown), ``""`` found and every one runs per document, else
    :func:`padless.attention.mixers.mixer_refusal`'s reason."""


@dataclass(frozen=True)
class BackendSpec:
    """How a transformers attention backend isolates packed documents."""

    inputs: AttentionInputs
    """What the collator must send: ``varlen`` (position_ids + cu_seq_lens_q/k, max_length_q/k, no
    attention_mask), ``mask4d`` (4D float additive block-causal mask + position_ids) or ``position_ids``."""
    refuse: Callable[[_Target], str | None]
    """Why the backend cannot guarantee isolation for a model, device and dtype (None: it can)."""


def _lacks(t: _Target, flag: str) -> bool:
    return t.model_class is not None and not getattr(t.model_class, flag, False)


def _refuse_model(t: _Target) -> str | None:
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
        return (f"{t.model_class.__name__}.forward takes no position_ids, so packed documents would be given "
                "positions that run on across document boundaries")  # fmt: skip
    if r.bidirectional:
        return "the model attends in both directions (use_bidirectional_attention, or is_decoder=False)"
    if r.offset_positions:
        return ("the model numbers positions from padding_idx + 1 when it computes them itself (RoBERTa family), "
                "so position ids restarted at 0 would give each packed document other positions than it has alone")  # fmt: skip
    if t.mixers:  # found and not all per-document
        return t.mixers
    others = r.other_layer_types if t.mixers is None else tuple(x for x in r.other_layer_types if x not in MIXER_LAYER_TYPES)
    if others:
        kinds = ", ".join(map(repr, others))
        fix = ""
        if t.mixers is None and any(x in MIXER_LAYER_TYPES for x in others):
            fix = ("; on a model (not a bare config), padless.enable_per_document_mixers(model) runs them on each "
                   "document alone (PackingCollator.for_model calls it)")
        return (f"layers of type {kinds} mix tokens without the attention mask (recurrent, linear, convolution or "
                f"sparse-indexed layers), so their state runs along the whole row, across documents{fix}")  # fmt: skip
    return None


MIXER_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "mamba", "attention")
"""``config.layer_types`` entries exact once every token mixer found in the model runs per document
(:func:`padless.enable_per_document_mixers`): gated DeltaNet / Kimi delta / lightning attention / Mamba
mixers (``linear_attention``, ``mamba``), LFM2 short convolutions (``conv``), Falcon-H1 / Zamba's
parallel or shared blocks (``hybrid``) and GraniteMoeHybrid's name for softmax attention
(``attention``). Other non-attention types (``indexed_attention``, compressed attention) stay refused."""


def attention_free(model_or_config: Any) -> bool:
    """A model (not a bare config: a config cannot show its layers) that runs no softmax attention and
    whose token mixers all run per document: its forward takes ``position_ids`` only through
    ``**kwargs`` (Mamba, Mamba2, Falcon-Mamba, RWKV, xLSTM in transformers 5.24: no position embeddings
    either), every token mixer is patched (:func:`padless.attention.mixers.mixer_refusal` is ``None``)
    and no module outside the mixers is an ``*Attention`` class. Restarted ``position_ids`` passed as a
    keyword then reach the mixers (the hook of :mod:`padless.attention.mixer_documents`), whatever
    ``attn_implementation`` says, since no attention runs; the batch carries no ``attention_mask``,
    which these models read as a 2D padding mask."""
    if model_or_config is None or not hasattr(model_or_config, "named_modules"):
        return False
    model_class = model_class_of(model_or_config)
    params = inspect.signature(model_class.forward).parameters if model_class is not None else {}
    if "position_ids" in params or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return False
    if _mixer_state(model_or_config) != "":
        return False
    from padless.attention.mixers import mixer_layers

    mixers = [m.name for m in mixer_layers(model_or_config)]
    inside = lambda name: any(name == m or name.startswith(m + ".") for m in mixers)  # noqa: E731
    return not any(type(module).__name__.endswith("Attention") and not inside(name)
                   for name, module in model_or_config.named_modules())  # fmt: skip


def _mixer_state(model_or_config: Any) -> str | None:
    """:attr:`_Target.mixers` for a model or config."""
    if model_or_config is None or not hasattr(model_or_config, "named_modules"):
        return None
    from padless.attention.mixers import mixer_layers, mixer_refusal

    if not mixer_layers(model_or_config):
        return None
    reason = mixer_refusal(model_or_config)
    if reason is None:
        return ""
    if "enable_per_document_mixers" in reason:
        reason += " (PackingCollator.for_model and the other collators' for_model call it)"
    return reason


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


def _flash_softcap_dropout(t: _Target) -> str | None:
    if t.rules.softcap is not None and t.rules.dropout > 0:
        return "flash-attn has no attention dropout together with logit soft-capping (attention_dropout > 0)"
    return None


def _refuse_padless(t: _Target) -> str | None:
    if _lacks(t, "_supports_attention_backend"):
        return f"{t.model_class.__name__} does not pass position_ids and attention kwargs to its attention layers"
    model_type = getattr(t.config.get_text_config() if hasattr(t.config, "get_text_config") else t.config, "model_type", None)
    if model_type in _PADLESS_REFUSED:
        return f"{model_type} {_PADLESS_REFUSED[model_type]}"
    qk, v = _head_sizes(t.config)
    if qk is not None and v is not None and qk != v:
        return (f"padless attention needs value heads as large as query/key heads, and this model's are {v} and {qk} "
                "(v_head_dim != qk_head_dim)")  # fmt: skip
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


def _refuse_mask4d(t: _Target, name: str, flag: str | None) -> str | None:
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
        return (f"layers differ in sliding window ({windows}) and the per-layer-type 4D masks have none for the "
                f"token-mixer layers ({', '.join(map(repr, mixer_types))}), which the model looks up by layer type")  # fmt: skip
    if name == "sdpa" and t.rules.softcap is not None:
        return "sdpa has no attention logit soft-capping"
    return None


def _refuse_flash2(t: _Target) -> str | None:
    kernel = kernel_refusal("flash_attn", t.device, t.dtype, t.head_dim, name="flash_attention_2")
    if kernel is not None:
        return kernel
    if _lacks(t, "_supports_flash_attn"):
        return f"{t.model_class.__name__} does not support flash_attention_2"
    return flash_boundary_refusal(t.model_class) or _flash_softcap_dropout(t)


def _refuse_flex(t: _Target) -> str | None:
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
    chunks); :func:`check_exact` accepts that only where the model builds its masks from position ids."""
    inputs = backend_inputs(backend)
    if attention_free(model_or_config):  # no attention runs: restarted position_ids reach the mixers
        return "position_ids"
    rules = attention_rules(model_or_config) if model_or_config is not None else None
    if inputs == "mask4d" and rules is not None and rules.chunk_size is not None and rules.masks_from_position_ids:
        return "position_ids"
    return inputs


def compute_target(model_or_config: Any, device: Any = None, dtype: Any = None) -> tuple[torch.device, torch.dtype]:
    """Where the attention of a training step will run: ``(device, compute dtype)``.

    ``device`` defaults to the device of the model's parameters (the CPU for a config), ``dtype`` to
    the model's dtype (float32 for a config). Give both when the weights are not yet where training
    runs: a collator built before ``model.to("cuda")``, under FSDP / DeepSpeed, or for fp32 master
    weights trained under bf16 autocast (``Trainer(bf16=True)``). Autocast enabled for the device's
    type when this is called counts too: its dtype is the compute dtype."""
    import torch

    if device is None:
        params = model_or_config.parameters() if hasattr(model_or_config, "parameters") else iter(())
        first = next(params, None)
        device = first.device if first is not None else "cpu"
    device = torch.device(device)
    if torch.is_autocast_enabled(device.type):
        return device, torch.get_autocast_dtype(device.type)
    if dtype is None:
        dtype = getattr(model_or_config, "dtype", None) if hasattr(model_or_config, "forward") else None
    if dtype is None:
        dtype = torch.float32
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype (torch.bfloat16, ...), got {dtype!r}")
    return device, dtype


def _target(model_or_config: Any, device: Any, dtype: Any, max_length: int | None, layout: str = "documents") -> _Target:
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    config = config_of(model_or_config)
    device, dtype = compute_target(model_or_config, device, dtype)
    return _Target(device, dtype, config, model_class_of(model_or_config), max_length,
                   attention_rules(model_or_config), head_dim=head_dim_of(config), layout=layout,
                   mixers=_mixer_state(model_or_config), attention_free=attention_free(model_or_config))  # fmt: skip


def _reason(target: _Target, backend: str) -> str | None:
    target = dataclasses.replace(target, backend=backend)
    if target.attention_free:  # no attention runs: the backend's limits do not matter
        return _refuse_model(target) or _refuse_attention_free_layout(target)
    return _refuse_model(target) or BACKENDS[backend].refuse(target) or _refuse_layout(target)


def _refuse_attention_free_layout(t: _Target) -> str | None:
    if t.layout == "shared_prompt":
        return ("a shared-prompt tree needs attention to let completions see the prompt; the state-space / "
                "recurrent mixers of a model without attention run each document alone")
    return None


def _refuse_layout(t: _Target) -> str | None:
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
) -> None:
    """The one rule: return if packed rows trained with attention ``backend`` on ``model_or_config``
    (a transformers model or config; ``None``: no model-specific rule) on ``device`` in ``dtype``
    (where training will run and its compute dtype: :func:`compute_target` fills them from the model
    and the autocast state when not given) compute exactly what each document computes alone, else
    raise ``ValueError`` naming a backend that does (or saying that none does). ``max_length`` bounds the tokens of a document in a row
    (``None``: unbounded); a sliding window at least that long never cuts a document. ``layout``
    (:data:`Layout`): ``shared_prompt`` rows also need a backend that expresses the tree.

    Checked: the model's own attention rules (:func:`padless.attention.rules.attention_rules`:
    sliding windows per layer type, soft-capping, sinks, ALiBi, bidirectional or recurrent layers,
    position_ids) against what each backend honours, and the fused kernels' limits (CUDA capability,
    head size: :mod:`padless.attention.kernels`) and whether the model's flash-attention code carries
    document boundaries to the kernel. The collator's ``for_model``,
    :func:`resolve_backend`, :func:`padless.verify_isolation`, the preference and rollout collators
    and the bench all ask this function."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    target = _target(model_or_config, device, dtype, max_length, layout)
    reason = _reason(target, backend)
    if reason is None:
        return
    alternative, reasons = _first_exact(target)
    if alternative:
        advice = f"use backend {alternative!r}"
    elif all(r.endswith(": " + reason) for r in reasons):  # the model's own rule: the same for every backend
        advice = "no attention backend can"
    else:
        advice = "no attention backend can (" + "; ".join(reasons) + ")"
    raise ValueError(
        f"attention backend {backend!r} cannot guarantee isolated packed documents here: {reason}; {advice}"
    )


def mask_windows(model_or_config: Any, max_length: int | None) -> MaskWindows:
    """The sliding windows a 4D packed mask must carry for this model and row length (see
    :data:`padless.attention.rules.MaskWindows`)."""
    return attention_rules(model_or_config).mask_windows(max_length)


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
    from padless.attention.backend import BACKEND_NAME, register_padless_attention

    if chosen == BACKEND_NAME:
        register_padless_attention()
    return chosen


def _first_exact(target: _Target) -> tuple[str | None, list[str]]:
    """The fastest exact backend (None if none) and, per backend tried, why it was refused."""
    reasons = []
    for name in _PREFERENCE:
        reason = _reason(target, name)
        if reason is None:
            return name, reasons
        reasons.append(f"{name}: {reason}")
    return None, reasons
