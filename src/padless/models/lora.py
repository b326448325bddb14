"""A model wrapped in a LoRA adapter (``padless[peft]``), for the bench and the examples.

Packing reads through the wrapper (:func:`padless.attention.adapters.base_model_of`), so a LoRA model
is packed exactly wherever its base model is; this module only builds one, the way users do
(``peft.get_peft_model(model, LoraConfig(...))``), with the base weights frozen.
"""

from __future__ import annotations

from typing import Any


def with_lora(
    model: Any, rank: int, *, alpha: int | None = None, dropout: float = 0.0, target_modules: Any = None
) -> Any:
    """``model`` wrapped in a LoRA adapter of ``rank`` (``alpha`` defaults to ``2 * rank``) on peft's
    default modules for its architecture (``target_modules`` to choose); only the adapter trains.
    GPT-2's ``Conv1D`` layers get ``fan_in_fan_out=True``, as peft requires."""
    from padless._optional import require

    peft = require("peft", "a LoRA adapter")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    from transformers.pytorch_utils import Conv1D

    conv1d = any(isinstance(m, Conv1D) for m in model.modules())
    config = peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=target_modules,
        fan_in_fan_out=conv1d,
    )
    return peft.get_peft_model(model, config)
