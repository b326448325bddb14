"""GRPO-family policy losses on TRL's ``(B, T)`` completion layout, as TRL 1.16's ``GRPOTrainer`` computes them.

:func:`grpo_loss` is a pure function of tensors: the policy's per-token log-probs of ``B`` rollouts
(``[B, T]``, completion tokens only, right-padded), their advantages and a completion mask. It drops in
where ``GRPOTrainer._compute_loss`` computes its loss, so per-token log-probs read from packed rows
(``padless.sequence_logprobs(model, batch, per_token=True)``, padded into ``[B, T]``) train exactly
what TRL's padded batch trains. Per token, with ``r = exp(logp - old_logp)`` (one ratio per token, or
per rollout for ``importance_sampling_level="sequence"``, GSPO: the exp of the mean log-ratio)::

    clipped  (grpo, bnpo, dr_grpo, dapo, luspo)  -min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A),
                                                  r' = min(r, delta) when delta is set
    cispo    -sg(min(r, epsilon_high)) A logp     (epsilon_high is the absolute cap, e.g. 5.0)
    sapo     -sigmoid(tau (r - 1)) 4 / tau A      (tau: sapo_temperature_pos for A > 0, else _neg)
    vespo    -sg(phi(w)) A logp                   (phi: gamma weight of the rollout's summed ratio w)

plus ``beta * KL`` to a reference (``exp(ref - logp) - (ref - logp) - 1``, times ``r`` with
``use_bias_correction_kl``). Each loss type then reduces over the micro-batch its own way, scaled for
the accumulation window as TRL scales it (``N``: ``num_items_in_batch``, the trained tokens of the whole
generation batch on every rank; ``G``: gradient_accumulation_steps; ``S``: steps_per_generation;
``P``: num_processes)::

    grpo, sapo   mean over rollouts of (token sum / rollout's tokens)          / G
    bnpo         token sum / micro-batch tokens                                / G
    dr_grpo      token sum / (B * max_completion_length)                       / G
    dapo, cispo, vespo   token sum / (N / P * G / S)
    luspo        mean over rollouts of token sum                               / G

so the summed micro-batch losses of a step, averaged over ranks by DDP, are the step's loss. A token
is trained where ``completion_mask * tool_mask`` is non-zero; the values of the log-prob tensors at
other positions are never read (a NaN or -inf in padding stays out). A rollout with no trained token
contributes 0 and is counted in ``empty_rollouts``.

Not computed here (``grpo_loss(config=...)`` refuses a TRL config that sets them): TRL's entropy mask
(``top_entropy_quantile``), entropy bonus (``entropy_coef``), off-policy sequence mask
(``off_policy_mask_threshold``) and vLLM importance-sampling correction.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from padless.objectives.grpo_config import (  # noqa: F401 (re-exported: the settings' public names)
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    GRPOLossConfig,
    ImportanceSamplingLevel,
    LossType,
    trl_warnings,
)


@dataclass(frozen=True)
class GRPOLossResult:
    """What :func:`grpo_loss` returns: the loss and TRL's diagnostics as 0-d tensors, local to this
    micro-batch and rank (TRL reduces its logged means over ranks before logging them)."""

    loss: torch.Tensor
    """The scalar to backpropagate, already scaled for accumulation and ranks as TRL scales it."""
    policy_loss: torch.Tensor
    """TRL's logged ``policy_loss`` (detached): before the ``/ G`` of grpo, bnpo, dr_grpo, luspo and sapo;
    equal to ``loss`` for dapo, cispo and vespo."""
    kl: torch.Tensor | None
    """Mean per-token KL to the reference over trained tokens; ``None`` when ``beta == 0``."""
    clip_ratio_low: torch.Tensor | None
    """Clipped types: the share of trained tokens (of rollouts, at sequence level) with ``r < 1 - epsilon``
    and ``A < 0``; ``None`` for cispo, sapo and vespo."""
    clip_ratio_high: torch.Tensor | None
    """Clipped types: the share with ``r > 1 + epsilon_high`` and ``A > 0``; cispo: ``r > epsilon_high``
    and ``A > 0`` (TRL's ``cispo_clip_ratio``); ``None`` for sapo and vespo."""
    clip_ratio_region: torch.Tensor | None
    """Clipped types: the share clipped low or high; ``None`` otherwise."""
    phi_mean: torch.Tensor | None
    """vespo: the mean gamma weight (TRL's ``vespo/phi_seq_mean``); ``None`` otherwise."""
    trained_tokens: torch.Tensor
    """Trained tokens of this micro-batch (``completion_mask * tool_mask``)."""
    empty_rollouts: torch.Tensor
    """Rollouts with no trained token (they contribute 0, never NaN)."""


class _Default:
    """A keyword's default, told apart from the same value passed explicitly (explicit keywords win over
    ``config``); it prints as the value, so ``help(grpo_loss)`` shows the defaults."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def _default(value: Any) -> Any:
    return cast(Any, _Default(value))


_D = {f.name: f.default for f in dataclasses.fields(GRPOLossConfig)}


def grpo_loss(
    per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    old_per_token_logps: torch.Tensor | None = None,
    ref_per_token_logps: torch.Tensor | None = None,
    tool_mask: torch.Tensor | None = None,
    loss_type: LossType = _default(_D["loss_type"]),
    beta: float = _default(_D["beta"]),
    epsilon: float = _default(_D["epsilon"]),
    epsilon_high: float | None = _default(_D["epsilon_high"]),
    delta: float | None = _default(_D["delta"]),
    importance_sampling_level: ImportanceSamplingLevel = _default(_D["importance_sampling_level"]),
    sapo_temperature_pos: float = _default(_D["sapo_temperature_pos"]),
    sapo_temperature_neg: float = _default(_D["sapo_temperature_neg"]),
    vespo_k_pos: float = _default(_D["vespo_k_pos"]),
    vespo_lambda_pos: float = _default(_D["vespo_lambda_pos"]),
    vespo_k_neg: float = _default(_D["vespo_k_neg"]),
    vespo_lambda_neg: float = _default(_D["vespo_lambda_neg"]),
    max_completion_length: int | None = _default(_D["max_completion_length"]),
    num_items_in_batch: int | torch.Tensor | None = None,
    num_processes: int = _default(_D["num_processes"]),
    gradient_accumulation_steps: int = _default(_D["gradient_accumulation_steps"]),
    steps_per_generation: int | None = _default(_D["steps_per_generation"]),
    use_bias_correction_kl: bool = _default(_D["use_bias_correction_kl"]),
    config: Any = None,
) -> GRPOLossResult:
    """The GRPO-family loss of one micro-batch of ``B`` rollouts, equal (loss and gradients) to TRL 1.16's
    ``GRPOTrainer._compute_loss`` on the same tensors.

    ``per_token_logps`` ``[B, T]``: the policy's log-prob of each completion token (gradients flow);
    ``advantages`` ``[B]`` (or ``[B, 1]``, ``[B, T]``); ``completion_mask`` and ``tool_mask`` ``[B, T]``
    (trained where their product is non-zero); ``old_per_token_logps`` ``[B, T]`` (the sampling policy;
    ``None``: on-policy, the detached current log-probs, as TRL); ``ref_per_token_logps`` ``[B, T]``
    (needed when ``beta != 0``). ``num_items_in_batch``: trained tokens of the whole generation batch
    summed over ranks, as TRL counts it (``accelerator.gather(loss_mask.sum()).sum()``), needed by
    dapo, cispo and vespo unless one process trains one micro-batch per generation (then this
    micro-batch's count). The other keywords are :class:`GRPOLossConfig`'s fields; ``config``: a TRL
    ``GRPOConfig`` (read by :meth:`GRPOLossConfig.from_trl`) or a :class:`GRPOLossConfig`, explicit
    keywords winning. Computed in float32 at least.
    """
    settings_given = {k: v for k, v in locals().items() if k in _D}  # the keywords named like GRPOLossConfig's fields
    explicit = {k: v for k, v in settings_given.items() if not isinstance(v, _Default)}
    if config is None:
        settings = GRPOLossConfig(**explicit)
    elif isinstance(config, GRPOLossConfig):
        settings = dataclasses.replace(config, **explicit)
    else:
        settings = GRPOLossConfig.from_trl(config, **explicit)
    for message in trl_warnings(settings.loss_type, settings.importance_sampling_level):
        warnings.warn(message, UserWarning, stacklevel=2)
    return _compute(
        settings,
        per_token_logps,
        advantages,
        completion_mask,
        old_per_token_logps,
        ref_per_token_logps,
        tool_mask,
        num_items_in_batch,
    )


def _check_like(name: str, t: torch.Tensor | None, logps: torch.Tensor, why: str = "") -> None:
    if t is not None and tuple(t.shape) != tuple(logps.shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)} but per_token_logps has {tuple(logps.shape)}{why}")


def _compute(
    s: GRPOLossConfig,
    per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    tool_mask: torch.Tensor | None,
    num_items: int | torch.Tensor | None,
) -> GRPOLossResult:
    if per_token_logps.dim() != 2 or not per_token_logps.is_floating_point():
        raise ValueError(
            f"per_token_logps must be a float [B, T] tensor (rollouts x completion tokens), got "
            f"{per_token_logps.dtype} of shape {tuple(per_token_logps.shape)}"
        )
    B, T = per_token_logps.shape
    _check_like("completion_mask", completion_mask, per_token_logps)
    _check_like("tool_mask", tool_mask, per_token_logps)
    _check_like("old_per_token_logps", old, per_token_logps, ": log-probs from another batch?")
    _check_like("ref_per_token_logps", ref, per_token_logps, ": log-probs from another batch?")
    if tuple(advantages.shape) not in ((B,), (B, 1), (B, T)):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)} but per_token_logps has {(B, T)}: expected "
            f"{(B,)} (one per rollout) or {(B, T)} (one per token)"
        )
    if s.beta != 0.0 and ref is None:
        raise ValueError(
            f"beta={s.beta} needs ref_per_token_logps (the reference model's per-token log-probs, "
            "[B, T]); pass them or set beta=0.0"
        )
    one_window = (s.num_processes, s.gradient_accumulation_steps, s.generation_steps) == (1, 1, 1)
    if _LOSSES[s.loss_type][1] is _generation_tokens and num_items is None and not one_window:
        raise ValueError(
            f"loss_type={s.loss_type!r} divides by num_items_in_batch, the trained tokens of the whole "
            "generation batch on every rank (TRL: accelerator.gather(loss_mask.sum()).sum()); pass it "
            "when num_processes, gradient_accumulation_steps or steps_per_generation is above 1"
        )

    device, work = per_token_logps.device, torch.promote_types(per_token_logps.dtype, torch.float32)
    mask = completion_mask.to(device, work)  # [B, T]
    if tool_mask is not None:
        mask = mask * tool_mask.to(device, work)
    trained = mask != 0
    read = lambda t: torch.where(trained, t.to(device, work), 0.0)  # noqa: E731  (untrained positions never read)
    logps = read(per_token_logps)
    old_logps = logps.detach() if old is None else read(old)
    adv = advantages.to(device, work)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]

    log_ratio = logps - old_logps  # [B, T]
    if s.importance_sampling_level == "token":
        log_weights = log_ratio
    else:  # one weight per rollout: the exp of its mean log-ratio
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(log_weights)  # [B, T] or [B, 1]
    per_token_kl = None
    if s.beta != 0.0:
        d = read(cast(torch.Tensor, ref)) - logps
        per_token_kl = torch.exp(d) - d - 1  # [B, T]
        if s.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio

    objective, reduce = _LOSSES[s.loss_type]
    per_token_loss, flags = objective(s, ratio, adv, logps, log_ratio, mask)
    if per_token_kl is not None:
        per_token_loss = per_token_loss + s.beta * per_token_kl
    loss, policy_loss = reduce(s, per_token_loss, mask, num_items)

    with torch.no_grad():
        means = {k: _masked_mean(v, mask) for k, v in flags.items()}
        kl = None if per_token_kl is None else _masked_mean(per_token_kl, mask)
    return GRPOLossResult(
        loss=loss,
        policy_loss=policy_loss,
        kl=kl,
        clip_ratio_low=means.get("low"),
        clip_ratio_high=means.get("high"),
        clip_ratio_region=means.get("region"),
        phi_mean=means.get("phi"),
        trained_tokens=trained.sum(),
        empty_rollouts=(~trained.any(-1)).sum(),
    )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over trained tokens of ``x [B, T]``, or over rollouts of ``x [B, 1]`` (one value per rollout,
    at sequence level), as TRL's logged means."""
    x = x.to(mask.dtype)
    if x.shape[1] == 1:
        return x.sum() / max(x.shape[0], 1)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


# --- objectives: (settings, ratio, A, logp, log_ratio, mask) -> (per-token loss, diagnostic flags) ---

Flags = dict[str, torch.Tensor]


def _clipped(
    s: GRPOLossConfig,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, Flags]:
    clipped = torch.clamp(ratio, 1 - s.epsilon, 1 + s.epsilon_upper)
    if s.delta is not None:
        ratio = torch.clamp(ratio, max=s.delta)
    loss = -torch.min(ratio * adv, clipped * adv)
    low = (ratio < 1 - s.epsilon) & (adv < 0)  # TRL counts clips on the delta-capped ratio
    high = (ratio > 1 + s.epsilon_upper) & (adv > 0)
    return loss, {"low": low, "high": high, "region": low | high}


def _cispo(
    s: GRPOLossConfig,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, Flags]:
    capped = torch.clamp(ratio, max=s.epsilon_upper).detach()
    return -capped * adv * logps, {"high": (ratio > s.epsilon_upper) & (adv > 0)}


def _sapo(
    s: GRPOLossConfig,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, Flags]:
    tau = torch.where(adv > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return -gate * adv, {}


def _vespo(
    s: GRPOLossConfig,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, Flags]:
    phi = _gamma_weights(s, adv, log_ratio, mask)  # [B, 1], no gradient
    return -phi * adv * logps, {"phi": phi}


@torch.no_grad()
def _gamma_weights(s: GRPOLossConfig, adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """VESPO's ``phi(w) = exp(lambda) w^k exp(-lambda w)`` (``phi(1) = 1``) of each rollout's summed
    log-ratio ``log w``, in log space and clamped as TRL clamps it."""
    floor = math.log(1e-8)
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True).clamp(floor, 20.0)  # [B, 1]
    nonneg = adv >= 0
    k = torch.where(nonneg, s.vespo_k_pos, s.vespo_k_neg)
    lam = torch.where(nonneg, s.vespo_lambda_pos, s.vespo_lambda_neg).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * torch.exp(log_w)
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# --- reductions: (settings, per-token loss, mask, num_items) -> (loss, TRL's policy_loss) ---


def _sequence_mean(
    s: GRPOLossConfig, ptl: torch.Tensor, mask: torch.Tensor, n: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return loss / s.gradient_accumulation_steps, loss.detach()


def _token_mean(s: GRPOLossConfig, ptl: torch.Tensor, mask: torch.Tensor, n: Any) -> tuple[torch.Tensor, torch.Tensor]:
    loss = (ptl * mask).sum() / mask.sum().clamp(min=1.0)
    return loss / s.gradient_accumulation_steps, loss.detach()


def _constant(s: GRPOLossConfig, ptl: torch.Tensor, mask: torch.Tensor, n: Any) -> tuple[torch.Tensor, torch.Tensor]:
    loss = (ptl * mask).sum() / (ptl.size(0) * cast(int, s.max_completion_length))
    return loss / s.gradient_accumulation_steps, loss.detach()


def _generation_tokens(
    s: GRPOLossConfig, ptl: torch.Tensor, mask: torch.Tensor, n: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_items_in_batch`` spans the generation batch on every rank: rescaled to this rank's share of
    one accumulation window (``N / P * G / S``)."""
    count = mask.sum() if n is None else torch.as_tensor(n, device=mask.device)
    normalizer = count.to(mask.dtype).clamp(min=1.0) / s.num_processes
    normalizer = normalizer * s.gradient_accumulation_steps / s.generation_steps
    loss = (ptl * mask).sum() / normalizer
    return loss, loss.detach()


def _sequence_sum(
    s: GRPOLossConfig, ptl: torch.Tensor, mask: torch.Tensor, n: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    loss = (ptl * mask).sum(-1).mean()
    return loss / s.gradient_accumulation_steps, loss.detach()


Objective = Callable[..., tuple[torch.Tensor, Flags]]
Reduction = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_LOSSES: dict[str, tuple[Objective, Reduction]] = {
    "grpo": (_clipped, _sequence_mean),
    "bnpo": (_clipped, _token_mean),
    "dr_grpo": (_clipped, _constant),
    "dapo": (_clipped, _generation_tokens),
    "cispo": (_cispo, _generation_tokens),
    "sapo": (_sapo, _sequence_mean),
    "luspo": (_clipped, _sequence_sum),
    "vespo": (_vespo, _generation_tokens),
}
"""Each loss type (:data:`LOSS_TYPES`, in order): its per-token objective and its reduction (the module
docstring's two tables)."""
