"""How a model encodes positions, and when a packed row keeps ALiBi models exact.

Packing restarts ``position_ids`` at every document, so a model whose positions come from
``position_ids`` (rotary, learned tables) sees each document at the positions it has alone. ALiBi
models (BLOOM, MPT, Falcon with ``alibi=True``) take no ``position_ids``: they add ``-slope * (q - k)``
to the attention scores. That bias is relative, so a block mask alone would keep them exact in exact
arithmetic (inside a document the absolute offset adds a constant per query, which softmax ignores);
whether transformers (the version :mod:`padless.attention.transformers_compat` names) lets a packed
batch reach that is per model, as measured here (tests/attention/test_positions.py holds each verdict):

- **MPT** (eager, its only attention implementation) takes the 4D block mask and is exact. Its bias
  is measured from the row's last key, so a document early in a long row adds a large per-query
  constant (``slope * distance to the row's end``) before softmax removes it; MPT keeps the bias in
  float32, so bfloat16 scores pass through unchanged (max |logit diff| 0 for a 32-token document at
  the start of a 1,024-token row) and float32 ones pick up rounding that grows with the row
  (1.4e-6 at 2,048 tokens with the default init; 2.0e-5 at 1,024 with init std 0.2 and logits up
  to 6.2, inside :data:`padless.isolation.verify.TOLERANCES` float32: 1e-5 + 1e-5 x 6.2).
- **BLOOM** builds its ALiBi from a 2D ``attention_mask`` (cumsum): a 4D mask fails inside
  transformers ("too many values to unpack"), and without one documents attend to each other. Refused.
- **Falcon** (``alibi=True``) fails the same way with a 4D mask; with restarted ``position_ids`` and
  no mask transformers detects the documents, but its ALiBi positions are rounded to bfloat16, so a
  document past a row's 256th token gets other biases than alone (5.5e-3 at 512). Refused (padless'
  mask4d backends send a 4D mask).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from padless.attention.rules import config_of, model_class_of
from padless.attention.transformers_compat import SERIES

PositionScheme = Literal["position_ids", "alibi", "none"]
"""``position_ids``: positions come from the ``position_ids`` argument (rotary, learned tables);
``alibi``: a relative bias built inside the model; ``none``: the forward takes no ``position_ids``
and the model is not known to use ALiBi (packing cannot restart its positions)."""

ALIBI_MODEL_TYPES = ("bloom", "mpt")
"""``config.model_type`` of the transformers models that always use ALiBi; Falcon does when ``config.alibi``."""

_MASK4D_BACKENDS = ("sdpa", "eager")


def position_scheme(model_or_config: Any) -> PositionScheme:
    """How ``model_or_config`` (a transformers model or config) encodes positions."""
    config = config_of(model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in ALIBI_MODEL_TYPES or (model_type == "falcon" and getattr(config, "alibi", False)):
        return "alibi"
    model_class = model_class_of(model_or_config)
    if model_class is None:  # unknown to transformers: assume the usual argument; the collator checks the model
        return "position_ids"
    return "position_ids" if "position_ids" in inspect.signature(model_class.forward).parameters else "none"


def alibi_refusal(model_or_config: Any, *, backend: str) -> str | None:
    """Why packed rows would not be exact for an ALiBi model on ``backend`` (``None``: exact, or the
    model is not an ALiBi model). See the module docstring for the measurements."""
    config = config_of(model_or_config)
    if position_scheme(config) != "alibi":
        return None
    model_type = getattr(config, "model_type", None)
    if model_type == "bloom":
        return (
            f"BLOOM builds its ALiBi bias from a 2D attention_mask in transformers {SERIES} and cannot take the 4D "
            "block mask that keeps packed documents apart"
        )
    if model_type == "falcon":
        return (
            f"Falcon with alibi=True cannot take a 4D block mask in transformers {SERIES}, and rounds its ALiBi "
            "positions to bfloat16, so documents past a row's 256th token would get other biases than alone"
        )
    if backend not in _MASK4D_BACKENDS:
        return f"ALiBi models are packed exactly only with a 4D block mask ({' or '.join(_MASK4D_BACKENDS)}), not {backend!r}"
    return None
