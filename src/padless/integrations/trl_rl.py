"""TRL's ``GRPOTrainer`` and ``DPOTrainer`` whose log-prob passes run on padless' packed rows.

    from padless.integrations.trl import GRPOTrainer, DPOTrainer   # was: from trl import ...

The same classes, arguments and configs (``GRPOConfig``, ``DPOConfig``; TRL 1.16). What changes is
where the per-token log-probs come from. TRL scores rollouts and preference pairs on padded rows
``[prompt | completion]`` (GRPO left-pads the prompts, DPO right-pads the pairs), through a fused LM
head that divides the logits by the temperature. Here each pass reads the same tensors off packed rows:

* GRPO: every call of ``_get_per_token_logps_and_entropies`` (the policy, the old policy and the
  reference pass; the reference being the adapter disabled under PEFT, as in TRL) rebuilds each row's
  prompt and completion from TRL's masks, groups the rows that share prompt ids (:func:`_rollout_groups`),
  packs the groups with :class:`padless.RolloutCollator` for the model and returns TRL's ``(B, T)``
  log-probs and entropies (:func:`padless.objectives.rollouts.completion_token_stats`). Generation,
  rewards, advantages and the loss stay TRL's. A pass runs in forward chunks of at most TRL's
  ``batch_size`` completions, in TRL's order; ``balance="cost"`` (an argument of the trainer) deals the
  groups to as many chunks by cost ``a * l + l**2`` instead (:func:`_forward_chunks`, docs/balance.md),
  and each chunk's log-probs go back to their TRL rows, so the loss is the same.
* DPO: while TRL's ``compute_loss`` and ``compute_ref_log_probs`` run, the fused forward TRL put on
  the policy (and the reference model) answers ``model(..., labels=..., fused_lm_head=True)`` from
  pairs packed by :class:`padless.PreferenceCollator` (:meth:`PackedDPOTrainer._packed_forward`),
  with every per-token field TRL reads (log-probs, entropy, mean logits, top-1, the WPO term) in
  TRL's shifted ``(2B, L - 1)`` layout, so all of TRL's DPO losses and metrics run on top unchanged.

Layouts. ``share_prompt`` (an argument of both trainers): ``True`` puts each prompt once before its
completions (a tree: a 4D mask on sdpa/eager, tree kwargs on padless attention), ``False`` makes every
completion its own document; ``None`` (default) shares the prompt wherever the exactness rule accepts that
layout for the model's backend, else packs documents and says why in the start line. ``max_length``:
tokens per packed row; ``None`` (default) packs each forward chunk (TRL's ``batch_size`` rollouts, or a
DPO micro-batch) into one row, the cheapest form for padless attention; on sdpa/eager the 4D mask grows
with the row's square, so bound the row there. A group never splits across rows: a group longer than
``max_length`` raises.

Refused (``ValueError`` naming the argument), because packed rows could not compute them exactly yet:
images and other multimodal inputs (``pixel_values``, token type ids), a prompt-learning PEFT adapter,
the MoE load-balancing loss (``output_router_logits``), TRL's context-parallel ``shift_labels``, and DPO
prompts that TRL's ``truncation_mode="keep_end"`` cut differently for chosen and rejected. vLLM
generation and its importance sampling stay TRL's (they compare TRL's old log-probs, computed here).

``train`` first logs one line through the padless logger: the model, its attention backend, the row
layout, the rule's verdict, the layout chosen and the guard (:func:`padless.integrations.transformers.start_line`).
The first packed forward is checked on the model (``guard``, an argument of both trainers: its documents
re-run alone against their packed rows, :mod:`padless.integrations.first_step`); a line after the first
step says what it found and cost.

The code: :mod:`padless.integrations.trl_logprobs` (what both share), :mod:`padless.integrations.trl_grpo`,
:mod:`padless.integrations.trl_dpo`; every name is importable from here as before.
"""

from __future__ import annotations

from padless.integrations.trl_dpo import DPO_WORDS, DPOTrainer, PackedDPOTrainer, _preference_pairs  # noqa: F401
from padless.integrations.trl_grpo import (  # noqa: F401
    GRPO_WORDS,
    GRPOTrainer,
    PackedGRPOTrainer,
    _forward_chunks,
    _rollout_groups,
)
from padless.integrations.trl_logprobs import _check_group_sizes, _PackedLogprobs, _refuse_multimodal, _span  # noqa: F401
