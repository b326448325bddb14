"""Model FLOPs of a training step, counted from a model's config (no torch): what MFU is measured in.

Only matrix multiplies count (2 FLOPs per multiply-add); a training step costs 3x its forward (the
backward computes two products per forward product: the gradient of each input). With frozen weights
(``--lora``: the base model frozen) a weight matmul's backward computes the activation's gradient
only, so the projections, MLP and head cost 2x their forward; attention's products (activations on
both sides) still cost 3x. The adapters' own rank-r products are left out (r / d of a projection). Per layer and token, the body's projections
cost ``2 * (d * (Hq + 2 Hk) * D + Hq * D * d)`` and the MLP ``2 * m * d * I`` (``m`` = 3 matrices
for a gated MLP such as Llama's, 2 for GPT-2's); causal attention over a block of ``l`` tokens costs
``4 * Hq * D * l (l + 1) / 2`` (scores and values, over the pairs a causal mask keeps); the LM head
``2 * d * V`` per row of logits it computes.

Two counts per step:

- needed (``model``): body over the real tokens, attention over each document, head over the
  trained tokens. The same for every strategy given the same examples.
- executed: body over every token fed (padding included), attention over the blocks the kernel
  computes (a padded row is one block of its padded length; padless varlen computes documents),
  head over the rows of logits computed (trained tokens, or every token with ``full_logits``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that its FLOPs depend on."""

    layers: int
    """Transformer blocks."""
    hidden: int
    """Model width ``d``."""
    heads: int
    """Query heads ``Hq``."""
    kv_heads: int
    """Key/value heads ``Hk`` (``Hq`` without grouped-query attention)."""
    head_dim: int
    """Width of one head ``D``."""
    intermediate: int
    """MLP inner width ``I``."""
    vocab: int
    """Vocabulary ``V`` (LM head outputs)."""
    gated_mlp: bool
    """Three MLP matrices (gate, up, down) instead of two."""

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Read a transformers config (GPT-2 names or Llama-family names); a vision-language model's text
        config (its vision encoder's FLOPs are not counted: the same for every strategy)."""
        if hasattr(config, "get_text_config"):
            config = config.get_text_config()
        if getattr(config, "model_type", "") == "gpt2":
            d, heads = config.n_embd, config.n_head
            return cls(config.n_layer, d, heads, heads, d // heads, config.n_inner or 4 * d, config.vocab_size, False)
        d, heads = config.hidden_size, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or d // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, d, heads, kv, head_dim, config.intermediate_size, config.vocab_size, True)

    def body_per_token(self) -> int:
        """Forward FLOPs of all layers' projections and MLPs for one token."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        projections = 2 * (d * (q + 2 * kv) + q * d)
        mlp = 2 * (3 if self.gated_mlp else 2) * d * self.intermediate
        return self.layers * (projections + mlp)

    def attention_per_block(self, length: int) -> int:
        """Forward FLOPs of causal attention over one block of ``length`` tokens, all layers."""
        return self.layers * 4 * self.heads * self.head_dim * length * (length + 1) // 2

    def head_per_row(self) -> int:
        """Forward FLOPs of the LM head for one row of logits."""
        return 2 * self.hidden * self.vocab


def training_flops(
    shape: ModelShape, tokens: int, blocks: Iterable[int], head_rows: int, *, frozen_weights: bool = False
) -> float:
    """FLOPs of forward + backward for ``tokens`` through the body, causal attention over ``blocks``
    (their lengths) and ``head_rows`` rows of logits: 3x forward, or with ``frozen_weights`` 2x for
    the weight matmuls (no weight gradients) and 3x for attention."""
    weights = tokens * shape.body_per_token() + head_rows * shape.head_per_row()
    attention = sum(shape.attention_per_block(int(n)) for n in blocks)
    return (2.0 if frozen_weights else 3.0) * weights + 3.0 * attention


def needed_step_flops(
    shape: ModelShape, lengths: Iterable[int], trained_tokens: int, *, frozen_weights: bool = False
) -> float:
    """Model FLOPs a step needs: its examples (``lengths``) each attending within itself, logits
    only for its ``trained_tokens``."""
    lengths = [int(n) for n in lengths]
    return training_flops(shape, sum(lengths), lengths, trained_tokens, frozen_weights=frozen_weights)


def executed_step_flops(
    shape: ModelShape,
    micro_batches: Iterable[Mapping[str, Any]],
    trained_tokens: int,
    full_logits: bool,
    *,
    frozen_weights: bool = False,
) -> float:
    """FLOPs of a step as its micro-batches were fed: padding included; a batch that carries
    ``cu_seq_lens_q`` is attended per document (padless varlen), any other row as one causal block."""
    tokens = 0
    blocks: list[int] = []
    for batch in micro_batches:
        ids = batch["input_ids"]
        rows, width = (1, int(ids.shape[-1])) if len(ids.shape) == 1 else (int(ids.shape[0]), int(ids.shape[1]))
        tokens += rows * width
        cu = batch.get("cu_seq_lens_q")
        if cu is not None:
            bounds = [int(c) for c in cu.tolist()]
            blocks += [b - a for a, b in zip(bounds, bounds[1:])]
        else:
            blocks += [width] * rows
    return training_flops(
        shape, tokens, blocks, tokens if full_logits else trained_tokens, frozen_weights=frozen_weights
    )
