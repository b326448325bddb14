"""Adapters (PEFT): packing answers from the transformers model an adapter wraps.

``peft.get_peft_model(model, LoraConfig(...))`` returns a ``PeftModel`` whose ``forward`` takes
``*args, **kwargs`` and hands ``position_ids``, the 4D mask and the varlen kwargs to the model it
wraps; LoRA, DoRA, IA3 and the other weight adapters (merged or not) change weights inside the
layers, never which tokens a layer mixes. So whether packed rows are exact is a question about the
wrapped model: :func:`base_model_of` is the one place that unwraps, and the exactness rule
(:func:`padless.attention.rules.attention_rules`, hence :func:`padless.check_exact` and every
``for_model``) reads the model it returns.

Prompt learning (prompt tuning, p-tuning, prefix tuning, multitask prompt tuning, CPT) is different:
PEFT puts virtual tokens (or prefix key/values) in front of every *row*, not of every document, so
the second document of a packed row would not see them. :func:`adapter_refusal` names that.
"""

from __future__ import annotations

from typing import Any


def is_adapter(model: Any) -> bool:
    """``model`` is a PEFT wrapper (``PeftModel`` or ``PeftMixedModel``), told without importing peft."""
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def without_ddp(model: Any) -> Any:
    """The model a ``DistributedDataParallel`` wrapper holds (its ``.module``), or ``model`` itself when it
    is not one; told without importing torch.distributed."""
    inner = getattr(model, "module", None) if type(model).__name__ == "DistributedDataParallel" else None
    return model if inner is None else inner


def base_model_of(model: Any) -> Any:
    """The transformers model inside PEFT wrappers (``model.get_base_model()``, repeated), or ``model``
    itself when it wears none. A ``DistributedDataParallel`` wrapper (``.module``) is looked through too."""
    seen = 0
    while seen < 8:  # wrappers do not nest deeper than DDP(PeftModel(LoraModel(model)))
        inner = without_ddp(model)
        if inner is model and is_adapter(model):
            inner = model.get_base_model()
        if inner is None or inner is model:
            return model
        model, seen = inner, seen + 1
    return model


def adapter_refusal(model: Any) -> str | None:
    """Why packed rows cannot be exact on this adapter (``None``: no adapter, or a weight adapter
    such as LoRA / DoRA / IA3, which is exact wherever its base model is)."""
    if not is_adapter(model):
        return None
    configs = getattr(model, "peft_config", {}) or {}
    active = getattr(model, "active_adapter", None)
    names = active if isinstance(active, list | tuple) else [active]
    for name in names:
        config = configs.get(name) if isinstance(configs, dict) else None
        if config is not None and getattr(config, "is_prompt_learning", False):
            kind = getattr(getattr(config, "peft_type", None), "value", None) or type(config).__name__
            virtual = getattr(config, "num_virtual_tokens", None)
            return (
                f"the PEFT adapter {name!r} is prompt learning ({kind}): it puts {virtual} virtual tokens in "
                "front of each row, not of each packed document, so every document but a row's first would "
                "train without them; train it with PaddingCollator, or use a weight adapter (LoRA, DoRA, IA3)"
            )
    return None
