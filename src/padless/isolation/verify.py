"""Isolation and equivalence checks for packed training, for any causal LM and attention backend.

For each backend, :func:`verify_isolation` runs every sequence alone (no padding, no mask), all of
them packed into rows, and all of them right-padded into one batch, and measures against the runs
alone:

1. logits: the largest absolute difference over each document's tokens (packed and padded);
2. gradients: ``||g - g_alone|| / ||g_alone||`` of the token-normalised loss (packed and padded).

Padding is exact in mathematics but not in floating point, so its differences are the noise of this
model, backend and dtype, measured in the same run. Packed rows pass when their differences stay
within :data:`NOISE_FACTOR` times that noise, or under the dtype's absolute floor
(:data:`TOLERANCES`) (the judgment of :mod:`padless.isolation.compare`); a leaked token moves logits
by their own size, far above both. A failure names the documents, their tokens over the limit and
the packed and padded differences side by side. The same is checked for shared-prompt rows
(:class:`padless.RolloutCollator`: completions read their prompt's keys; the trained quantity is
the completions' summed log-probs).

``autocast=torch.bfloat16`` runs the forwards under ``torch.autocast`` over the model's own
(float32) weights, as ``Trainer(bf16=True)`` trains; the floor is then the autocast dtype's. A
float64 model is the oracle: its noise is ~1e-14, so any systematic difference shows.

A backend that padless refuses for this model and device (say FlexAttention on a CPU) is reported
as refused, with the reason; a backend that is not installed as unavailable. Only a backend that
runs and differs fails. Use it in your own tests: ``assert padless.verify_isolation(model).passed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from padless.devices import dtype_name
from padless.isolation.compare import (
    NOISE_FACTOR,
    TOLERANCES,  # noqa: F401  (padless.TOLERANCES is read from here)
    Document,
    Judgment,
    LogitCheck,
    Tolerance,
    compare_documents,
    compute_dtype,
    judge,
    relative_difference,
    tolerance_for,
)

if TYPE_CHECKING:
    import torch


DEFAULT_BACKENDS = ("sdpa", "eager", "padless", "flash_attention_2", "flex_attention")
DEFAULT_LENGTHS = (1, 7, 13, 5, 24, 3, 9, 2)
ROW_SLACK = 8
"""With the default lengths, rows hold at least the longest sequence plus this many tokens, so that
the longest shares its row with short documents."""
SHARED_PROMPT_GROUPS = ((5, (3, 1)), (1, (4, 2, 6)), (9, (2, 2)))
"""(prompt length, completion lengths) of the groups the shared-prompt check packs."""


def default_lengths(model: Any) -> tuple[int, ...]:
    """:data:`DEFAULT_LENGTHS`, plus one sequence longer than the model's shortest sliding window
    when none of them is, so that a packed mask that dropped the window shows as a difference."""
    from padless.attention.rules import attention_rules

    windows = attention_rules(model).active_windows(None)
    if windows and max(DEFAULT_LENGTHS) <= windows[0]:
        return (*DEFAULT_LENGTHS, windows[0] + 4)
    return DEFAULT_LENGTHS


Status = Literal["pass", "fail", "refused", "unavailable"]


@dataclass(frozen=True)
class BackendResult:
    """The verdict for one attention backend (one layout: plain rows, or ``+shared_prompt``)."""

    backend: str
    """The backend's name, ``+shared_prompt`` for the shared-prompt rows."""
    status: Status
    """``pass``, ``fail``, ``refused`` (by padless' exactness rule) or ``unavailable`` (not installed)."""
    max_logit_diff: float | None = None
    """Largest |packed - alone| logit over every document's tokens."""
    logit_tolerance: float | None = None
    """The limit it was held to: ``max(factor x logit_noise, dtype floor)``."""
    grad_rel_diff: float | None = None
    """``||g_packed - g_alone|| / ||g_alone||``."""
    grad_tolerance: float | None = None
    """The limit it was held to: ``max(factor x grad_noise, dtype floor)``."""
    detail: str = ""
    """Why refused or unavailable."""
    logit_noise: float | None = None
    """Padding's own largest |padded - alone| logit, same documents, same run."""
    grad_noise: float | None = None
    """Padding's own ``||g_padded - g_alone|| / ||g_alone||``."""
    evidence: list[str] = field(default_factory=list)
    """On failure: each document over the limit, its tokens, packed vs padded differences; the gradients."""


@dataclass(frozen=True)
class VerifyReport:
    """Every backend's result plus what was checked."""

    model: str
    """The model's name (or class)."""
    dtype: str
    """What the forwards computed in: a dtype name, or ``autocast-<dtype>`` over the weights' dtype."""
    device: str
    """Where they ran."""
    lengths: list[int]
    """The lengths of the plain documents."""
    max_length: int | None
    """Packed row length (None: one row for all)."""
    results: list[BackendResult] = field(default_factory=list)
    """One per backend for plain rows, then one per backend for shared-prompt rows."""
    factor: float = NOISE_FACTOR
    """How many times padding's noise packed rows may differ."""

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


def random_sequences(lengths: Sequence[int], vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    """Features of random token ids, one per length (the verifier's default documents), from ``seed``."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab_size, int(n)).tolist()} for n in lengths]


_Context = Callable[[], AbstractContextManager[Any]]


def _flat_grads(model: Any) -> torch.Tensor:
    import torch

    return torch.cat([p.grad.detach().flatten() for p in model.parameters() if p.grad is not None])


def _forward_backward(model: Any, batches: Sequence[Any], num_items: Any, compute: _Context) -> tuple[list[Any], torch.Tensor]:
    """The logits of each of ``batches`` and the parameter gradients of their token-normalised loss,
    summed (one optimiser step of those micro-batches), from the same forwards."""
    from padless.batching.batch import forward_inputs
    from padless.objectives.loss import causal_lm_loss

    model.zero_grad(set_to_none=True)
    logits = []
    for batch in batches:
        with compute():
            # no cache, as in training (RWKV in eval mode writes its state in place, breaking backward)
            out = model(**{"use_cache": False, **forward_inputs(batch)}).logits
            loss = causal_lm_loss(out, batch["labels"], num_items)
        loss.backward()
        logits.append(out.detach())
    grads = _flat_grads(model)
    model.zero_grad(set_to_none=True)
    return logits, grads


def _switch_backend(model: Any, backend: str, name: str, *, max_length: int | None, layout: str,
                    dtype: torch.dtype) -> BackendResult | None:  # fmt: skip
    """Switch ``model`` to ``backend`` if the one rule (:func:`padless.check_exact`) accepts it for
    this layout; else the report row saying why not (refused, or not installed here)."""
    from padless.attention.backend import register_padless_attention
    from padless.attention.select import check_exact

    try:
        check_exact(model, backend, device=next(model.parameters()).device, dtype=dtype,
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


def _result(name: str, logits: LogitCheck, grads: Judgment) -> BackendResult:
    """The report row of one layout from its two judgments, with the evidence of a failure."""
    evidence = [e.describe() for e in logits.evidence]
    if not grads.passed:
        evidence.append(f"gradients: packed {grads.measured:.3g} vs padded {grads.noise:.3g} "
                        f"(relative to each document alone; limit {grads.limit:.3g})")  # fmt: skip
    lj = logits.judgment
    return BackendResult(name, "pass" if lj.passed and grads.passed else "fail", lj.measured, lj.limit,
                         grads.measured, grads.limit, logit_noise=lj.noise, grad_noise=grads.noise,
                         evidence=evidence)  # fmt: skip


def _check_backend(
    model: Any,
    backend: str,
    features: list[dict[str, list[int]]],
    max_length: int | None,
    tol: Tolerance,
    factor: float,
    compute: _Context,
    autocast: torch.dtype | None,
) -> BackendResult:
    from padless.batching.batch import batch_to
    from padless.batching.collate import PackingCollator, PaddingCollator
    from padless.objectives.loss import step_num_items

    device = next(model.parameters()).device
    dtype = compute_dtype(model) if autocast is None else autocast
    skipped = _switch_backend(model, backend, backend, max_length=max_length, layout="documents", dtype=dtype)
    if skipped is not None:
        return skipped
    collator = PackingCollator.for_model(model, dtype=dtype, max_length=max_length, pad_to_max_length=max_length is not None)
    batch = batch_to(collator(features), device)
    docs = []
    for i, feature in enumerate(features):
        ((_, row, offset, n),) = batch.placements.of_feature(i)  # overlong="error": one piece each
        docs.append(Document(i, tuple(feature["input_ids"]), row, tuple(range(offset, offset + n))))
    width = int(batch["input_ids"].shape[1])  # padding as wide as the packed rows: kernels of the same shapes
    padded = batch_to(PaddingCollator(pad_to_multiple_of=width)(features), device)
    num_items = step_num_items([padded], all_ranks=False)
    alone = [batch_to(PaddingCollator()([f]), device) for f in features]
    alone_logits, g_alone = _forward_backward(model, alone, num_items, compute)
    (padded_logits,), g_padded = _forward_backward(model, [padded], num_items, compute)
    (packed,), g_packed = _forward_backward(model, [batch], num_items, compute)
    with compute():
        logits = compare_documents(model, packed, docs, tolerance=tol, factor=factor, alone=[a[0] for a in alone_logits],
                                   padded=padded_logits)  # fmt: skip
    grads = judge(relative_difference(g_packed, g_alone), relative_difference(g_padded, g_alone), tol.grad_rtol, factor)
    return _result(backend, logits, grads)


def _logprob_sum(logits: torch.Tensor, picks: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """Sum of ``log p(target)`` over ``picks`` of ``(row, predicting columns, targets)`` of ``logits
    [R, L, V]``, in float32 or wider (a float64 model keeps float64)."""
    import torch

    wide = torch.promote_types(logits.dtype, torch.float32)
    total = logits.new_zeros((), dtype=wide)
    for row, columns, targets in picks:
        rows = logits[row, torch.tensor(list(columns), device=logits.device)].to(wide).log_softmax(-1)
        total = total + rows.gather(1, torch.tensor(list(targets), device=logits.device)[:, None]).sum()
    return total


def _check_shared_prompt(model: Any, backend: str, tol: Tolerance, factor: float, seed: int, compute: _Context,
                         autocast: torch.dtype | None) -> BackendResult:  # fmt: skip
    """Shared-prompt rows (:class:`padless.RolloutCollator`): every ``prompt + completion`` run alone
    has the logits of its prompt and completion in the packed row, and the summed completion
    log-probs have the same parameter gradients packed as alone (padded: the noise)."""
    import torch

    from padless.batching.batch import batch_to, forward_inputs
    from padless.batching.preference import RolloutCollator
    from padless.isolation.compare import alone_logits, padded_logits

    name = f"{backend}+shared_prompt"
    dtype = compute_dtype(model) if autocast is None else autocast
    skipped = _switch_backend(model, backend, name, max_length=None, layout="shared_prompt", dtype=dtype)
    if skipped is not None:
        return skipped
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(0, model.config.vocab_size, n).tolist()  # noqa: E731
    groups = [{"prompt_ids": draw(p), "completion_ids": [draw(c) for c in cs]} for p, cs in SHARED_PROMPT_GROUPS]
    batch = batch_to(RolloutCollator.for_model(model, dtype=dtype)(groups), next(model.parameters()).device)
    pl = batch.placements
    flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
    docs, packed_picks, alone_picks = [], [], []
    for f, (prompt, comp) in enumerate(flat):
        j = int(np.flatnonzero(pl.feature == f)[0])
        r, o, n, prev = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j]), int(pl.prev_offset[j])
        docs.append(Document(f, (*prompt, *comp), r, (*range(prev + 1 - len(prompt), prev + 1), *range(o, o + n))))
        packed_picks.append((r, [prev, *range(o, o + n - 1)], comp))
        alone_picks.append((f, list(range(len(prompt) - 1, len(prompt) + len(comp) - 1)), comp))
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(total: torch.Tensor) -> torch.Tensor:
        return torch.cat([g.flatten() for g in torch.autograd.grad(total, params)])

    with compute():  # each forward once: its logits are compared, its log-probs differentiated
        packed = model(**forward_inputs(batch)).logits
        padded = padded_logits(model, docs, int(batch["input_ids"].shape[1]))
        alone = [alone_logits(model, d.input_ids) for d in docs]
        sums = (_logprob_sum(packed, packed_picks), _logprob_sum(padded, alone_picks),
                sum(_logprob_sum(a[None], [(0, cols, t)]) for a, (_, cols, t) in zip(alone, alone_picks)))  # fmt: skip
    g_packed, g_padded, g_alone = (grads(total) for total in sums)
    with compute():
        logits = compare_documents(model, packed, docs, tolerance=tol, factor=factor, alone=alone, padded=padded)
    verdict = judge(relative_difference(g_packed, g_alone), relative_difference(g_padded, g_alone), tol.grad_rtol, factor)
    return _result(name, logits, verdict)


def verify_isolation(
    model: Any,
    sequences: Sequence[Sequence[int]] | None = None,
    *,
    backends: Sequence[str] = DEFAULT_BACKENDS,
    max_length: int | None = 32,
    seed: int = 0,
    tolerance: Tolerance | None = None,
    autocast: torch.dtype | None = None,
    factor: float = NOISE_FACTOR,
) -> VerifyReport:
    """Check every backend in ``backends`` on ``model`` (its device and dtype are used as they are).

    ``sequences``: token-id lists (default: random ids with lengths :func:`default_lengths`, which
    include a 1-token document and one longer than the model's sliding window, if it has one).
    ``max_length``: packed row length (``None``: one row for all); raised to the longest sequence
    (with the default lengths, plus :data:`ROW_SLACK`).
    ``tolerance``: the absolute floor (default :data:`TOLERANCES` of the compute dtype);
    ``factor``: how many times padding's own noise packed rows may differ (see the module docstring).
    ``autocast``: run every forward under ``torch.autocast`` with this dtype (fp32 master weights).
    A row longer than the model's positions raises ``ValueError``. A model whose forward takes no
    ``position_ids`` gets every backend refused, with the reason.
    The model's attention implementation and mode are restored afterwards.
    """
    import torch

    if sequences is None:
        features = random_sequences(default_lengths(model), model.config.vocab_size, seed)
    else:
        features = [{"input_ids": [int(t) for t in s]} for s in sequences]
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1, or None for one row holding every sequence")
    if not features or min(len(f["input_ids"]) for f in features) < 1:
        raise ValueError("sequences must be non-empty token-id lists")
    if factor < 1:
        raise ValueError(f"factor={factor} must be >= 1: packed rows cannot be held below padding's own noise")
    if max_length is not None:
        slack = ROW_SLACK if sequences is None else 0
        max_length = max(max_length, max(len(f["input_ids"]) for f in features) + slack)
    row = max_length if max_length is not None else sum(len(f["input_ids"]) for f in features)
    positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if positions is not None and row > positions:
        raise ValueError(f"packed rows of {row} tokens exceed the model's {positions} positions; "
                         "use shorter sequences or a smaller max_length")
    device = next(model.parameters()).device
    if autocast is not None:
        if autocast not in (torch.bfloat16, torch.float16):
            raise ValueError(f"autocast={autocast} must be torch.bfloat16 or torch.float16")
        dtype = f"autocast-{dtype_name(autocast)}"
        compute: _Context = lambda: torch.autocast(device.type, dtype=autocast)  # noqa: E731
    else:
        dtype, compute = dtype_name(model.dtype), nullcontext
    tol = tolerance_for(autocast or model.dtype, tolerance)
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    lengths = [len(f["input_ids"]) for f in features]
    refusal = _model_refusal(model)
    if refusal is not None:  # padless' own reason, before any backend (or transformers) is asked
        return VerifyReport(name, dtype, str(device), lengths, max_length,
                            [BackendResult(b, "refused", detail=refusal) for b in backends], factor)  # fmt: skip
    original = model.config._attn_implementation
    was_training = model.training
    model.eval()  # dropout off: both sides must compute the same function
    try:
        results = [_check_backend(model, b, features, max_length, tol, factor, compute, autocast) for b in backends]
        results += [_check_shared_prompt(model, b, tol, factor, seed, compute, autocast) for b in backends]
    finally:
        model.set_attn_implementation(original)
        model.train(was_training)
    return VerifyReport(name, dtype, str(device), lengths, max_length, results, factor)


def _model_refusal(model: Any) -> str | None:
    """Why padless packs for no backend of this model (its forward takes no ``position_ids``), or None."""
    import inspect

    from padless.attention.adapters import base_model_of

    from padless.attention.select import attention_free

    if attention_free(model):  # Mamba, RWKV, xLSTM with patched mixers: position_ids through **kwargs
        return None
    model = base_model_of(model)  # a PEFT wrapper's forward takes **kwargs and passes them on
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return (f"{type(model).__name__}.forward takes no position_ids, so packed documents would be given "
                "positions that run on across document boundaries; padless refuses to pack for it")
    return None
