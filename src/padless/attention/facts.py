"""Everything the exactness rule asks about a model, read once: :class:`ModelFacts`.

The rule (:mod:`padless.attention.select`), ``for_model``, :func:`padless.check_collator`,
:func:`padless.check_batch`, ``verify`` and the trainers ask the same questions of a model: which
class and config, which attention backend, what its own attention computes
(:func:`padless.attention.rules.attention_rules`: windows, chunks, position scheme, soft-capping, an
adapter), which token mixers it holds and whether they run per document, whether it runs any
attention at all, where it runs and in which dtype (:mod:`padless.devices`). :func:`model_facts`
answers all of them in one pass over the model (one walk of its module tree, one read of its rules)
and keeps the answer for as long as nothing it depends on changes::

    model -> model_facts(model, device, dtype) -> ModelFacts  (cached per model)
                                                      |
            select.decide(facts, backend, max_length, layout) -> Verdict (exact, or refused with why)

The cache is keyed by what can change cheaply detectably: the model's class and the wrapped model's
class (a PEFT wrap, FSDP's swap), the attention implementation and every config value (a snapshot of
``config.__dict__``, sub-configs included), the active adapter, the weights' dtype, the run's device
and compute dtype, and a counter bumped whenever padless patches or restores mixer layers
(:func:`padless.attention.mixers.patches`). A change elsewhere (modules swapped by hand) calls for
``model_facts(model, refresh=True)``.
"""

from __future__ import annotations

import enum
import inspect
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from padless.attention.adapters import base_model_of
from padless.attention.kernels import head_dim_of
from padless.attention.mixers import MixerInfo, mixer_layers, mixer_refusal, patches
from padless.attention.multimodal import VisionScheme, vision_scheme
from padless.attention.rules import AttentionRules, attention_rules, config_of, model_class_of
from padless.devices import compute_target


class MixerState(enum.Enum):
    """What a model's token mixers that are not softmax attention need (:mod:`padless.attention.mixers`)."""

    NONE_FOUND = "none_found"
    """None found: the model has none, or a bare config cannot show its layers (unknown)."""
    PER_DOCUMENT = "per_document"
    """Found, and every one runs on each packed document alone."""
    REFUSED = "refused"
    """Found, and some do not (:attr:`ModelFacts.mixer_reason` says why)."""


@dataclass(frozen=True)
class ModelFacts:
    """What the exactness rule reads about a model (or config), where it runs and in which dtype."""

    config: Any
    """The config of the model (of the model a PEFT adapter wraps), or the config itself."""
    model_class: type | None
    """The causal-LM class (the class an adapter wraps, FSDP's swap undone); ``None``: unknown."""
    name: str
    """The model as the collators name what they were fitted to: ``"LlamaForCausalLM (sdpa)"``."""
    backend: str | None
    """``config._attn_implementation`` (``None``: a config or stand-in without one)."""
    device: torch.device
    """Where the forward runs (:func:`padless.devices.compute_target`)."""
    dtype: torch.dtype
    """The compute dtype there (autocast, FSDP's ``param_dtype``, else the weights')."""
    weights_dtype: torch.dtype | None
    """``model.dtype``: the dtype of a 4D mask (autocast casts the scores, not the mask)."""
    rules: AttentionRules
    """The model's own attention semantics: windows, chunks, positions, soft-capping, sinks, adapter."""
    head_dim: int | None
    """The attention head size (``None``: unknown), for the fused kernels' limits."""
    mixers: MixerState
    """Its token mixers' state."""
    mixer_reason: str | None
    """Why they are refused (set where :attr:`mixers` is :attr:`MixerState.REFUSED`)."""
    mixer_layers: tuple[MixerInfo, ...]
    """The token mixers found (:func:`padless.attention.mixers.mixer_layers`)."""
    attention_free: bool
    """No softmax attention runs and every token mixer runs per document (:func:`attention_free`)."""
    base_class: str | None
    """The class name of the model a PEFT adapter or DDP wrapper wraps (``None``: a config)."""
    vision: VisionScheme | None = None
    """How the model reads images (:func:`padless.attention.multimodal.vision_scheme`); ``None``: it
    has no vision tower, or its family is refused for images (:attr:`vision_reason`)."""
    vision_reason: str | None = None
    """Why images cannot be packed for this vision-language model (``None``: they can, or there is no
    vision tower)."""

    @property
    def mixers_patchable(self) -> bool:
        """Mixers were found, all of kinds padless can run per document: ``for_model`` patches them
        (:func:`padless.attention.mixers.enable_per_document_mixers`, idempotent); an unknown kind is the rule's to refuse."""
        return bool(self.mixer_layers) and all(m.kind != "unknown" for m in self.mixer_layers)


_CACHE: weakref.WeakKeyDictionary[Any, tuple[Any, ModelFacts]] = weakref.WeakKeyDictionary()
"""model -> (the key its facts were read under, the facts). Weakly keyed: a model freed, or copied
(``copy.deepcopy``, pickling), carries no stale entry."""


def model_facts(model_or_config: Any, device: Any = None, dtype: Any = None, *, refresh: bool = False) -> ModelFacts:
    """The :class:`ModelFacts` of a transformers model or config (``None``: no model-specific rule) run on
    ``device`` in ``dtype`` (:func:`padless.devices.compute_target` fills them from the model and the
    autocast state). Read once per model and kept while its key holds (see the module docstring);
    ``refresh=True`` reads them again. A :class:`ModelFacts` is returned as it is."""
    if isinstance(model_or_config, ModelFacts):
        return model_or_config
    is_model = hasattr(model_or_config, "named_modules") and hasattr(model_or_config, "forward")
    inner = base_model_of(model_or_config) if is_model else model_or_config
    device, dtype = compute_target(inner, device, dtype)
    if not is_model:
        return _read(model_or_config, device, dtype)
    key = _key(model_or_config, inner, device, dtype)
    try:
        cached = None if refresh else _CACHE.get(model_or_config)
        if cached is not None and _same(cached[0], key):
            return cached[1]
    except TypeError:  # not weakly referable, or unhashable: read without a cache
        return _read(model_or_config, device, dtype)
    facts = _read(model_or_config, device, dtype)
    _CACHE[model_or_config] = (key, facts)
    return facts


def _read(model_or_config: Any, device: Any, dtype: Any) -> ModelFacts:
    """The one pass: the rules once, the module tree walked once."""
    config = config_of(model_or_config)
    model_class = model_class_of(model_or_config)
    has_modules = model_or_config is not None and hasattr(model_or_config, "named_modules")
    modules = list(model_or_config.named_modules()) if has_modules else []  # walked once; the facts below read it
    layers = mixer_layers(model_or_config, modules) if has_modules else []
    if not layers:
        state, reason = MixerState.NONE_FOUND, None
    else:
        reason = mixer_refusal(model_or_config, layers)
        state = MixerState.PER_DOCUMENT if reason is None else MixerState.REFUSED
        if reason is not None and "enable_per_document_mixers" in reason:
            reason += " (PackingCollator.for_model and the other collators' for_model call it)"
    is_model = hasattr(model_or_config, "config")  # a model or a stand-in for one (not a config)
    inner = base_model_of(model_or_config) if is_model else None
    backend = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    name = f"{type(inner).__name__} ({backend})" if inner is not None else type(model_or_config).__name__
    vision, vision_reason = vision_scheme(model_or_config, modules if has_modules else None)
    return ModelFacts(
        config=config,
        model_class=model_class,
        name=name,
        backend=backend,
        device=device,
        dtype=dtype,
        weights_dtype=getattr(model_or_config, "dtype", None) if is_model else None,
        rules=attention_rules(model_or_config),
        head_dim=head_dim_of(config),
        mixers=state,
        mixer_reason=reason,
        mixer_layers=tuple(layers),
        attention_free=has_modules and _attention_free(model_class, state, layers, modules),
        base_class=type(inner).__name__ if inner is not None else None,
        vision=vision,
        vision_reason=vision_reason,
    )


def _attention_free(model_class: type | None, state: MixerState, layers: list[MixerInfo], modules: list) -> bool:
    """See :func:`attention_free`; ``modules``: the model's ``named_modules()``, already listed."""
    params = inspect.signature(model_class.forward).parameters if model_class is not None else {}
    if "position_ids" in params or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return False
    if state is not MixerState.PER_DOCUMENT:
        return False
    mixers = [m.name for m in layers]
    inside = lambda name: any(name == m or name.startswith(m + ".") for m in mixers)  # noqa: E731
    return not any(type(module).__name__.endswith("Attention") and not inside(name) for name, module in modules)


def attention_free(model_or_config: Any) -> bool:
    """A model (not a bare config: a config cannot show its layers) that runs no softmax attention and
    whose token mixers all run per document: its forward takes ``position_ids`` only through
    ``**kwargs`` (Mamba, Mamba2, Falcon-Mamba, RWKV, xLSTM in transformers: no position embeddings
    either), every token mixer is patched (:func:`padless.attention.mixers.mixer_refusal` is ``None``)
    and no module outside the mixers is an ``*Attention`` class. Restarted ``position_ids`` passed as a
    keyword then reach the mixers (the hook of :mod:`padless.attention.mixer_documents`), whatever
    ``attn_implementation`` says, since no attention runs; the batch carries no ``attention_mask``,
    which these models read as a 2D padding mask."""
    if model_or_config is None or not hasattr(model_or_config, "named_modules"):
        return False
    return model_facts(model_or_config).attention_free


_SCALARS = (int, float, str, type(None))


def _freeze(value: Any, depth: int = 0) -> Any:
    """A comparable copy of a config value: sub-configs and containers copied, so that a value changed
    in place later differs from the recorded copy."""
    if isinstance(value, _SCALARS) or depth > 4:
        return value
    if isinstance(value, dict):
        return ("{}", tuple((k, v if isinstance(v, _SCALARS) else _freeze(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, list | tuple | set):
        return (type(value).__name__, tuple(v if isinstance(v, _SCALARS) else _freeze(v, depth + 1) for v in value))
    if hasattr(value, "to_dict") and hasattr(value, "__dict__"):  # a sub-config
        return ("config", type(value), _freeze(vars(value), depth + 1))
    return value


def _key(model: Any, inner: Any, device: Any, dtype: Any) -> tuple:
    config = getattr(inner, "config", None)
    active = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None
    adapters = tuple(getattr(model, "peft_config", {}) or ()) if hasattr(model, "peft_config") else ()
    return (
        type(model),
        type(inner),
        id(inner),
        device,
        dtype,
        getattr(model, "dtype", None),
        patches(),
        str(active),
        adapters,
        _freeze(vars(config)) if hasattr(config, "__dict__") else id(config),
    )


def _same(a: tuple, b: tuple) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (a config value that compares elementwise: read the facts again)
        return False
