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
ROW_SLACK = 8
"""With the default lengths, rows hold at least the longest sequence plus this many tokens, so that
the longest shares its row with short documents."""


def default_lengths(model: Any) -> tuple[int, ...]:
    """:data:`DEFAULT_LENGTHS`, plus one sequence longer than the model's shortest sliding window
    when none of them is, so that a packed mask that dropped the window shows as a difference."""
    from padless.attention.rules import attention_rules

    windows = attention_rules(model).active_windows(None)
    if windows and max(DEFAULT_LENGTHS) <= windows[0]:
        return (*DEFAULT_LENGTHS, windows[0] + 4)
    return DEFAULT_LENGTHS


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


def random_sequences(lengths: Sequence[int], vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    """Features of random token ids, one per length (the verifier's default documents), from ``seed``."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab_size, int(n)).tolist()} for n in lengths]


def _grads(model: Any) -> torch.Tensor:
    import torch

    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def _loss_grads(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    from padless.objectives.loss import model_loss, step_num_items

    model.zero_grad(set_to_none=True)
    model_loss(model, batch, step_num_items([batch], all_ranks=False)).backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return grads


def _switch_backend(model: Any, backend: str, name: str, *, max_length: int | None, layout: str) -> BackendResult | None:
    """Switch ``model`` to ``backend`` if the one rule (:func:`padless.check_exact`) accepts it for
    this layout; else the report row saying why not (refused, or not installed here)."""
    from padless.attention.backend import register_padless_attention
    from padless.attention.select import check_exact

    try:
        check_exact(model, backend, device=next(model.parameters()).device, dtype=model.dtype,
                    max_length=max_length, layout=layout)  # type: ignore[arg-type]  # fmt: skip
    except ValueError as exc:
        return BackendResult(name, "refused", detail=str(exc))
    if backend == "padless":
        register_padless_attention()
    try:
        model.set_attn_implementation(backend)
    except (ImportError, ValueError) as exc:
        return BackendResult(name, "unavailable", detail=str(exc).splitlines()[0])
    return None


def _check_backend(
    model: Any,
    backend: str,
    features: list[dict[str, list[int]]],
    padded_grads: torch.Tensor,
    max_length: int | None,
    tol: Tolerance,
) -> BackendResult:
    import torch

    from padless.batching.collate import PackingCollator
    from padless.batching.batch import batch_to

    device = next(model.parameters()).device
    skipped = _switch_backend(model, backend, backend, max_length=max_length, layout="documents")
    if skipped is not None:
        return skipped

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


SHARED_PROMPT_GROUPS = ((5, (3, 1)), (1, (4, 2, 6)), (9, (2, 2)))
"""(prompt length, completion lengths) of the groups the shared-prompt check packs."""


def _completion_logprobs(model: Any, batch: Any) -> torch.Tensor:
    """Sum of every completion's log-probs, read through the placements (first token from prev_offset)."""
    import torch

    logp = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float().log_softmax(-1)
    pl, total = batch.placements, logp.new_zeros(())
    for r, o, n, prev in zip(pl.row.tolist(), pl.offset.tolist(), pl.length.tolist(), pl.prev_offset.tolist()):
        src = torch.tensor([prev, *range(o, o + n - 1)], device=logp.device)
        total = total + logp[r, src].gather(1, batch["labels"][r, o : o + n][:, None]).sum()
    return total


def _check_shared_prompt(model: Any, backend: str, tol: Tolerance, seed: int) -> BackendResult:
    """Shared-prompt rows (:class:`padless.RolloutCollator`): every ``prompt + completion`` run alone
    has the logits of its prompt and completion in the packed row, and the summed completion
    log-probs have the same parameter gradients packed as alone."""
    import torch

    from padless.batching.batch import batch_to
    from padless.batching.preference import RolloutCollator

    name = f"{backend}+shared_prompt"
    device = next(model.parameters()).device
    skipped = _switch_backend(model, backend, name, max_length=None, layout="shared_prompt")
    if skipped is not None:
        return skipped
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(0, model.config.vocab_size, n).tolist()  # noqa: E731
    groups = [{"prompt_ids": draw(p), "completion_ids": [draw(c) for c in cs]} for p, cs in SHARED_PROMPT_GROUPS]
    batch = batch_to(RolloutCollator.for_model(model)(groups), device)
    pl = batch.placements
    worst, scale = 0.0, 0.0
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
        for f, (prompt, comp) in enumerate(flat):
            j = int(np.flatnonzero(pl.feature == f)[0])
            r, o, n, prev = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j]), int(pl.prev_offset[j])
            alone = model(input_ids=torch.tensor([prompt + comp], device=device), use_cache=False).logits[0]
            got = packed[r, [*range(prev + 1 - len(prompt), prev + 1), *range(o, o + n)]]
            worst = max(worst, (alone.float() - got.float()).abs().max().item())
            scale = max(scale, alone.float().abs().max().item())
    params = [p for p in model.parameters() if p.requires_grad]
    g_packed = torch.cat([g.flatten() for g in torch.autograd.grad(_completion_logprobs(model, batch), params)])
    alone_sum = sum(
        model(input_ids=torch.tensor([prompt + comp], device=device), use_cache=False).logits[0, len(prompt) - 1 : -1]
        .float().log_softmax(-1).gather(1, torch.tensor(comp, device=device)[:, None]).sum()
        for prompt, comp in flat
    )  # fmt: skip
    g_alone = torch.cat([g.flatten() for g in torch.autograd.grad(alone_sum, params)])
    rel = ((g_packed - g_alone).norm() / g_alone.norm()).item()
    logit_tol = tol.logits_atol + tol.logits_rtol * scale
    ok = worst <= logit_tol and rel <= tol.grad_rtol
    return BackendResult(name, "pass" if ok else "fail", worst, logit_tol, rel, tol.grad_rtol)


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

    ``sequences``: token-id lists (default: random ids with lengths :func:`default_lengths`, which
    include a 1-token document and one longer than the model's sliding window, if it has one).
    ``max_length``: packed row length (``None``: one row for all); raised to the longest sequence
    (with the default lengths, plus :data:`ROW_SLACK`).
    A row longer than the model's positions raises ``ValueError``. A model whose forward takes no
    ``position_ids`` gets every backend refused, with the reason.
    The model's attention implementation is restored afterwards.
    """
    from padless.batching.collate import PaddingCollator
    from padless.batching.batch import batch_to

    if sequences is None:
        features = random_sequences(default_lengths(model), model.config.vocab_size, seed)
    else:
        features = [{"input_ids": [int(t) for t in s]} for s in sequences]
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1, or None for one row holding every sequence")
    if not features or min(len(f["input_ids"]) for f in features) < 1:
        raise ValueError("sequences must be non-empty token-id lists")
    if max_length is not None:
        slack = ROW_SLACK if sequences is None else 0
        max_length = max(max_length, max(len(f["input_ids"]) for f in features) + slack)
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
        results += [_check_shared_prompt(model, b, tol, seed) for b in backends]
    finally:
        model.set_attn_implementation(original)
        model.train(was_training)
    return VerifyReport(name, dtype, str(device), lengths, max_length, results)


def _model_refusal(model: Any) -> str | None:
    """Why padless packs for no backend of this model (its forward takes no ``position_ids``), or None."""
    import inspect

    from padless.attention.adapters import base_model_of

    model = base_model_of(model)  # a PEFT wrapper's forward takes **kwargs and passes them on
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return (f"{type(model).__name__}.forward takes no position_ids, so packed documents would be given "
                "positions that run on across document boundaries; padless refuses to pack for it")
    return None
