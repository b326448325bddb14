"""The DPO loss (Rafailov et al. 2023, sigmoid form) from per-sequence log-probs of packed pairs.

Each pair has the summed log-probs of its chosen and rejected completion under the policy and under
the frozen reference model (``padless.sequence_logprobs`` on a :class:`padless.PreferenceCollator`
batch gives them as ``[num_pairs, 2]``). Per pair::

    loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

which is TRL's ``DPOTrainer`` loss with ``loss_type="sigmoid"`` (the test holds them equal). Packing
changes nothing here: the log-probs are those of each sequence alone.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F


def _split(pairs: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"{name} must be [num_pairs, 2] (chosen, rejected), got shape {tuple(pairs.shape)}")
    return pairs[:, 0], pairs[:, 1]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None = None,
    ref_rejected: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    reduction: Literal["mean", "sum", "none"] = "mean",
) -> torch.Tensor:
    """DPO sigmoid loss. Two ways to call it:

    - ``dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected)``: four ``[N]`` tensors;
    - ``dpo_loss(policy, reference)``: two ``[N, 2]`` tensors, column 0 chosen, column 1 rejected
      (what ``sequence_logprobs`` returns for a pair batch).

    ``reduction``: ``mean`` over pairs (TRL's), ``sum`` (divide by the step's pair count yourself
    under gradient accumulation), ``none`` (``[N]``). Computed in float32 at least.
    """
    if ref_chosen is None and ref_rejected is None:
        (policy_chosen, policy_rejected), (ref_chosen, ref_rejected) = (
            _split(policy_chosen, "policy"),
            _split(policy_rejected, "reference"),
        )
    elif ref_chosen is None or ref_rejected is None:
        raise ValueError(
            "give ref_chosen and ref_rejected together, or call dpo_loss(policy, reference) with [N, 2] tensors"
        )
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"policy and reference log-probs must be four [N] tensors of one shape, got {sorted(shapes)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"unknown reduction {reduction!r}; choose mean, sum or none")
    work = torch.promote_types(policy_chosen.dtype, torch.float32)
    ref_c, ref_r = ref_chosen.to(policy_chosen.device, work), ref_rejected.to(policy_chosen.device, work)
    margin = (policy_chosen.to(work) - ref_c) - (policy_rejected.to(work) - ref_r)  # [N]
    losses = -F.logsigmoid(beta * margin)
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.mean()
