"""Isolation and equivalence checks for packed training, for any causal LM and attention backend.

For each backend, :func:`verify_isolation` runs:

1. every sequence alone (no padding, no mask) and all of them packed into rows, and reports the
   largest absolute logit difference over real tokens: ~1e-7 in fp32 means isolated, ~1 means a
   token saw another document;
2. the token-normalised loss of a padded batch and of the packed batch of the same sequences, and
   reports the relative difference of their parameter gradients.

Each figure is judged against a tolerance that depends on the dtype (:data:`TOLERANCES`). A backend
that padless refuses for this model and device (say FlexAttention on a CPU) is reported as refused,
with the reason; a backend that is not installed as unavailable. Only a backend that runs and differs
fails the check. Use it in your own tests: ``assert padless.verify_isolation(model).passed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:

    import torch

DEFAULT_BACKENDS = ("sdpa", "eager", "padless", "flash_attention_2", "flex_attention")
DEFAULT_LENGTHS = (1, 7, 13, 5, 24, 3, 9, 2)


@dataclass(frozen=True)
class Tolerance:
    """Largest differences accepted for one dtype."""

    logits_atol: float
    """Absolute part of the logit tolerance."""
    logits_rtol: float
    """Relative part, times the largest |logit| of the reference."""
    grad_rtol: float
    """Largest ||g_packed - g_padded|| / ||g_padded|| over all parameters."""


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(logits_atol=1e-5, logits_rtol=1e-5, grad_rtol=1e-5),
    "bfloat16": Tolerance(logits_atol=5e-2, logits_rtol=2e-2, grad_rtol=5e-2),
    "float16": Tolerance(logits_atol=1e-2, logits_rtol=5e-3, grad_rtol=1e-2),
}

Status = Literal["pass", "fail", "refused", "unavailable"]


@dataclass(frozen=True)
class BackendResult:
    """The verdict for one attention backend."""

    backend: str
    status: Status
    max_logit_diff: float | None = None
    logit_tolerance: float | None = None
    grad_rel_diff: float | None = None
    grad_tolerance: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class VerifyReport:
    """Every backend's result plus what was checked."""

    model: str
    dtype: str
    device: str
    lengths: list[int]
    max_length: int | None
    results: list[BackendResult] = field(default_factory=list)

    @property
    def ran(self) -> bool:
        """Some backend ran (passed or failed); False when every one was refused or unavailable."""
        return any(r.status in ("pass", "fail") for r in self.results)

    @property
    def passed(self) -> bool:
        """No backend that ran was contaminated or trained differently from padding."""
        return all(r.status != "fail" for r in self.results) and any(r.status == "pass" for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "ran": self.ran}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _random_sequences(lengths: Sequence[int], vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab_size, int(n)).tolist()} for n in lengths]


def _grads(model: Any) -> torch.Tensor:
    import torch

    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def _loss_grads(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    from padless.loss import model_loss, step_num_items

    model.zero_grad(set_to_none=True)
    model_loss(model, batch, step_num_items([batch], all_ranks=False)).backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return grads


def _check_backend(
    model: Any,
    backend: str,
    features: list[dict[str, list[int]]],
    padded_grads: torch.Tensor,
    max_length: int | None,
    tol: Tolerance,
) -> BackendResult:
    import torch

    from padless.attention.backend import register_padless_attention
    from padless.attention.select import resolve_backend
    from padless.batching.collate import PackingCollator, batch_to

    device = next(model.parameters()).device
    try:
        resolve_backend(backend, device=device, dtype=model.dtype, config=model.config)
    except ValueError as exc:
        return BackendResult(backend, "refused", detail=str(exc))
    if backend == "padless":
        register_padless_attention()
    try:
        model.set_attn_implementation(backend)
    except (ImportError, ValueError) as exc:
        return BackendResult(backend, "unavailable", detail=str(exc).splitlines()[0])

    collator = PackingCollator.for_model(model, max_length=max_length, pad_to_max_length=max_length is not None)
    batch = batch_to(collator(features), device)
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        worst, scale = 0.0, 0.0
        for i, feature in enumerate(features):
            ((_, row, offset, _),) = batch.placements.of_feature(i)  # overlong="error": one piece each
            ids = torch.tensor([feature["input_ids"]], device=device)
            alone = model(input_ids=ids, use_cache=False).logits[0]
            got = packed[row, offset : offset + ids.shape[1]]
            worst = max(worst, (alone.float() - got.float()).abs().max().item())
            scale = max(scale, alone.float().abs().max().item())
    logit_tol = tol.logits_atol + tol.logits_rtol * scale
    grads = _loss_grads(model, batch)
    rel = ((grads - padded_grads).norm() / padded_grads.norm()).item()
    ok = worst <= logit_tol and rel <= tol.grad_rtol
    return BackendResult(backend, "pass" if ok else "fail", worst, logit_tol, rel, tol.grad_rtol)


def verify_isolation(
    model: Any,
    sequences: Sequence[Sequence[int]] | None = None,
    *,
    backends: Sequence[str] = DEFAULT_BACKENDS,
    max_length: int | None = 32,
    seed: int = 0,
    tolerance: Tolerance | None = None,
) -> VerifyReport:
    """Check every backend in ``backends`` on ``model`` (its device and dtype are used as they are).

    ``sequences``: token-id lists (default: random ids with lengths :data:`DEFAULT_LENGTHS`, which
    include a 1-token document). ``max_length``: packed row length, raised to the longest sequence
(``None``: one row for all); a row longer than the model's positions raises ``ValueError``. A model
whose forward takes no ``position_ids`` gets every backend refused, with the reason.
    The model's attention implementation is restored afterwards.
    """
    from padless.batching.collate import PaddingCollator, batch_to

    if sequences is None:
        features = _random_sequences(DEFAULT_LENGTHS, model.config.vocab_size, seed)
    else:
        features = [{"input_ids": [int(t) for t in s]} for s in sequences]
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1, or None for one row holding every sequence")
    if not features or min(len(f["input_ids"]) for f in features) < 1:
        raise ValueError("sequences must be non-empty token-id lists")
    if max_length is not None:
        max_length = max(max_length, max(len(f["input_ids"]) for f in features))
    row = max_length if max_length is not None else sum(len(f["input_ids"]) for f in features)
    positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if positions is not None and row > positions:
        raise ValueError(f"packed rows of {row} tokens exceed the model's {positions} positions; "
                         "use shorter sequences or a smaller max_length")
    dtype = _dtype_name(model.dtype)
    tol = tolerance or TOLERANCES.get(dtype)
    if tol is None:
        raise ValueError(f"no tolerance for dtype {dtype}; pass tolerance=Tolerance(...)")
    device = next(model.parameters()).device
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    lengths = [len(f["input_ids"]) for f in features]
    refusal = _model_refusal(model)
    if refusal is not None:  # padless' own reason, before any backend (or transformers) is asked
        return VerifyReport(name, dtype, str(device), lengths, max_length,
                            [BackendResult(b, "refused", detail=refusal) for b in backends])
    original = model.config._attn_implementation
    was_training = model.training
    model.eval()  # dropout off: both sides must compute the same function
    try:
        model.set_attn_implementation("sdpa" if original not in ("sdpa", "eager") else original)
        padded = batch_to(PaddingCollator()(features), device)
        padded_grads = _loss_grads(model, padded)
        results = [_check_backend(model, b, features, padded_grads, max_length, tol) for b in backends]
    finally:
        model.set_attn_implementation(original)
        model.train(was_training)
    return VerifyReport(name, dtype, str(device), lengths, max_length, results)


def _model_refusal(model: Any) -> str | None:
    """Why padless packs for no backend of this model (its forward takes no ``position_ids``), or None."""
    import inspect

    if "position_ids" not in inspect.signature(model.forward).parameters:
        return (f"{type(model).__name__}.forward takes no position_ids, so packed documents would be given "
                "positions that run on across document boundaries; padless refuses to pack for it")
    return None
