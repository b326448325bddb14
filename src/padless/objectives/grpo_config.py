"""The settings of :func:`padless.objectives.grpo.grpo_loss`, as TRL 1.16's ``GRPOConfig`` names them:
:class:`GRPOLossConfig`, read from a TRL config by :meth:`GRPOLossConfig.from_trl` (which refuses the
TRL loss terms ``grpo_loss`` does not compute), and the warnings ``GRPOTrainer`` gives for odd
combinations (:func:`trl_warnings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
"""TRL 1.16's ``GRPOConfig.loss_type`` values."""
LOSS_TYPES: tuple[str, ...] = get_args(LossType)
ImportanceSamplingLevel = Literal["token", "sequence"]
IMPORTANCE_SAMPLING_LEVELS: tuple[str, ...] = ("token", "sequence")


@dataclass(frozen=True, kw_only=True)
class GRPOLossConfig:
    """The settings of :func:`grpo_loss`, named as TRL 1.16's ``GRPOConfig`` names them (defaults: TRL's,
    except ``max_completion_length`` and ``use_bias_correction_kl``, see below)."""

    loss_type: LossType = "dapo"
    """One of :data:`LOSS_TYPES` (:mod:`padless.objectives.grpo` gives each one's objective and normalisation)."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """``token``: one ratio per token; ``sequence`` (GSPO): one per rollout, exp of its mean log-ratio."""
    beta: float = 0.0
    """KL coefficient; non-zero needs ``ref_per_token_logps``."""
    epsilon: float = 0.2
    """Lower clip: ratios below ``1 - epsilon`` are clipped (TRL's ``epsilon_low``)."""
    epsilon_high: float | None = None
    """Upper clip ``1 + epsilon_high`` (``None``: ``epsilon``); for ``cispo`` the absolute cap on the ratio."""
    delta: float | None = None
    """Two-sided clip (INTELLECT-2): the unclipped ratio is capped at ``delta`` too (clipped types only)."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature for non-positive advantages."""
    vespo_k_pos: float = 2.0
    """VESPO gamma-weight power for non-negative advantages."""
    vespo_lambda_pos: float = 3.0
    """VESPO gamma-weight decay for non-negative advantages."""
    vespo_k_neg: float = 3.0
    """VESPO gamma-weight power for negative advantages."""
    vespo_lambda_neg: float = 2.0
    """VESPO gamma-weight decay for negative advantages."""
    use_bias_correction_kl: bool = False
    """Multiply the per-token KL by the ratio (DeepSeek-V3.2). TRL 1.16's ``GRPOConfig`` defaults it to
    ``True``; ``config=`` reads the config's value."""
    max_completion_length: int | None = None
    """``dr_grpo``'s constant (TRL's ``GRPOConfig`` default: 512); required for ``dr_grpo``."""
    num_processes: int = 1
    """Data-parallel ranks (DDP averages their gradients); read from ``GRPOConfig.world_size``."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimiser step (TRL's ``current_gradient_accumulation_steps``: the last window
    of an epoch may hold fewer). 1 for evaluation, where TRL does not scale."""
    steps_per_generation: int | None = None
    """Micro-batches one generation batch is split into (``None``: ``gradient_accumulation_steps``, TRL's
    default). 1 for evaluation."""

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"unknown loss_type {self.loss_type!r}; choose one of {', '.join(LOSS_TYPES)} "
                "(TRL 1.16's GRPOConfig.loss_type)"
            )
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"unknown importance_sampling_level {self.importance_sampling_level!r}; choose token or sequence"
            )
        for name in ("num_processes", "gradient_accumulation_steps", "steps_per_generation", "max_completion_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError(
                "loss_type='dr_grpo' divides by B * max_completion_length; pass max_completion_length= "
                "(GRPOConfig.max_completion_length, 512 by default) or config="
            )
        if self.loss_type == "sapo" and not (self.sapo_temperature_pos > 0 and self.sapo_temperature_neg > 0):
            raise ValueError(
                f"sapo temperatures must be > 0, got sapo_temperature_pos={self.sapo_temperature_pos}, "
                f"sapo_temperature_neg={self.sapo_temperature_neg}"
            )

    @property
    def epsilon_upper(self) -> float:
        """The upper clip TRL uses: ``epsilon_high``, else ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def generation_steps(self) -> int:
        return self.gradient_accumulation_steps if self.steps_per_generation is None else self.steps_per_generation

    @classmethod
    def from_trl(cls, args: Any, **overrides: Any) -> GRPOLossConfig:
        """The settings of a TRL ``GRPOConfig`` (or an object with its attribute names; a missing one keeps
        its default), ``overrides`` winning. A config that turns on a TRL loss term :func:`grpo_loss` does
        not compute is refused, naming the field."""
        for name, off, what in _NOT_COMPUTED:
            value = getattr(args, name, off)
            vllm_off = name == "vllm_importance_sampling_correction" and not getattr(args, "use_vllm", False)
            if value != off and not vllm_off:  # the correction only applies to vLLM generation
                raise ValueError(
                    f"config.{name}={value!r}: grpo_loss does not compute TRL's {what}, so its loss "
                    f"would differ from GRPOTrainer's; set {name}={off!r} or train with GRPOTrainer"
                )
        read = {}
        for f in dataclasses.fields(cls):
            for attr in (f.name, _TRL_NAMES.get(f.name)):
                if attr is not None and hasattr(args, attr):
                    read[f.name] = getattr(args, attr)
                    break
        return cls(**{**read, **overrides})


_TRL_NAMES = {"num_processes": "world_size"}
"""Fields whose ``GRPOConfig`` attribute has another name."""
_NOT_COMPUTED: tuple[tuple[str, Any, str], ...] = (
    ("top_entropy_quantile", 1.0, "entropy mask"),
    ("entropy_coef", 0.0, "entropy bonus"),
    ("use_adaptive_entropy", False, "adaptive entropy bonus"),
    ("off_policy_mask_threshold", None, "off-policy sequence mask"),
    ("vllm_importance_sampling_correction", False, "vLLM importance-sampling correction (with use_vllm=True)"),
)


def trl_warnings(loss_type: str, level: str) -> list[str]:
    """What ``GRPOTrainer.__init__`` warns about (it trains anyway; so does :func:`grpo_loss`, warning
    the same)."""
    out = []
    if loss_type == "luspo" and level != "sequence":
        out.append("loss_type='luspo' is meant for importance_sampling_level='sequence' (the LUSPO paper's setup)")
    if loss_type == "vespo" and level != "token":
        out.append(
            "loss_type='vespo' computes sequence-level weights itself; importance_sampling_level should be 'token'"
        )
    if level == "sequence" and loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        out.append(
            f"importance_sampling_level='sequence' with loss_type={loss_type!r} sums per-token terms, weighting "
            "each rollout by its length; GSPO's per-sequence objective is loss_type='grpo'"
        )
    return out
