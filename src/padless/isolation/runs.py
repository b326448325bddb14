"""The verifier's runs: documents alone, right-padded and packed on one backend, and the judgment of
their logits and gradients (:mod:`padless.isolation.compare`) as a
:class:`~padless.isolation.report.BackendResult`.

:func:`padless.isolation.verify.verify_isolation` decides what to run (its docstring's table) and
calls :func:`check_backend` (plain rows) and :func:`check_shared_prompt` (shared-prompt rows,
:class:`padless.RolloutCollator`) once per backend, sharing a :class:`Run`. Under ``check="sampled"``
the documents run alone once, on the first backend that runs (``Run.alone``), and the gradients
compared are those of :func:`sampled_parameters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from padless.isolation.compare import (
    Document,
    DocumentDiff,
    Judgment,
    LogitCheck,
    Tolerance,
    document_diff,
    judge,
    relative_difference,
)
from padless.isolation.report import BackendResult

if TYPE_CHECKING:  # torch is imported where used: `padless verify` refuses bad flags before torch loads
    import torch

PADDED_TOKENS = 8192
"""Padded rows run in micro-batches of at most this many tokens (their gradients add up)."""
SHARED_PROMPT_GROUPS = ((5, (3, 1)), (1, (4, 2, 6)), (9, (2, 2)))
"""(prompt length, completion lengths) of the groups the shared-prompt check packs."""


def random_sequences(lengths: Sequence[int], vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    """Features of random token ids, one per length (the verifier's default documents), from ``seed``."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab_size, int(n)).tolist()} for n in lengths]


Context = Callable[[], AbstractContextManager[Any]]


def sampled_parameters(model: Any) -> tuple[list[Any], str]:
    """The parameters whose gradients the sampled check compares, and their description: the last
    block of the model's longest ``ModuleList`` (its decoder layers) and every parameter after it
    except the embeddings (the final norm), among the trainable ones. A leak in any layer reaches
    them through the forward; a label or loss leak changes them directly; and their backward runs
    the attention backend's backward once. Every trainable parameter when there is no such block
    (or none of it trains)."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return trainable, "every trainable parameter"
    name, blocks = max(lists, key=lambda nm: len(nm[1]))
    last = f"{name}.{len(blocks) - 1}"
    embeddings = {
        id(m.weight)
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None and getattr(m, "weight", None) is not None
    }
    chosen, modules, after = [], [last], False
    ids = {id(p) for p in trainable}
    for pname, p in model.named_parameters():
        inside = pname.startswith(last + ".")
        if inside or (after and id(p) not in embeddings):
            if id(p) in ids:
                chosen.append(p)
                if not inside:
                    modules.append(pname.rsplit(".", 1)[0])
        after = after or inside
    if not chosen:
        return trainable, "every trainable parameter"
    return chosen, ", ".join(dict.fromkeys(modules))


@contextmanager
def _gradients_of(model: Any, params: Sequence[Any]) -> Iterator[None]:
    """Within: only ``params`` require gradients (the backward stops where none is needed)."""
    keep = {id(p) for p in params}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _flat_grads(params: Sequence[Any]) -> torch.Tensor:
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten() for p in params])


@dataclass
class Run:
    """What every check of one :func:`verify_isolation` call shares."""

    tol: Tolerance
    factor: float
    compute: Context
    dtype: torch.dtype
    """The compute dtype (the rule and the collators are asked for it)."""
    check: str
    params: list[Any]
    """Whose gradients the plain rows compare."""
    padded: tuple[int, ...]
    """The documents also run right-padded."""
    max_length: int | None
    strategy: str
    """The collator's planner (next-fit for the default documents)."""
    verdicts: dict[str, str | None]
    """Result name -> why the rule refuses it (None: exact)."""
    alone: _Alone | None = None
    """sampled: the documents alone, run once on the first backend that ran."""


@dataclass(frozen=True)
class _Alone:
    """The documents run alone: logits, and the gradients of all and of the padded ones."""

    backend: str
    logits: list[Any]
    """``[n, V]`` per document."""
    grads: Any
    """Of every document's loss."""
    padded_grads: Any
    """Of the padded documents' losses only (their noise reference)."""


def _step(model: Any, batch: Any, num_items: Any, compute: Context) -> Any:
    """Forward and backward of one micro-batch's token-normalised loss; its logits."""
    from padless.batching.batch import forward_inputs
    from padless.objectives.loss import causal_lm_loss

    with compute():
        # no cache, as in training (RWKV in eval mode writes its state in place, breaking backward)
        out = model(**{"use_cache": False, **forward_inputs(batch)}).logits
        loss = causal_lm_loss(out, batch["labels"], num_items)
    loss.backward()
    return out.detach()


def _alone(model: Any, backend: str, features: list[dict[str, list[int]]], num_items: Any, run: Run) -> _Alone:
    """Each document alone (the padded ones first, so their gradients are read on the way)."""
    from padless.batching.batch import batch_to
    from padless.batching.collate import PaddingCollator

    device = next(model.parameters()).device
    order = [*run.padded, *(i for i in range(len(features)) if i not in run.padded)]
    logits: list[Any] = [None] * len(features)
    model.zero_grad(set_to_none=True)
    padded_grads = _flat_grads(run.params) if not run.padded else None
    for k, i in enumerate(order):
        logits[i] = _step(model, batch_to(PaddingCollator()([features[i]]), device), num_items, run.compute)[0]
        if k == len(run.padded) - 1:
            padded_grads = _flat_grads(run.params).clone()
    grads = _flat_grads(run.params)
    model.zero_grad(set_to_none=True)
    return _Alone(backend, logits, grads, padded_grads)


def _padded(model: Any, features: list[dict[str, list[int]]], width: int, num_items: Any, run: Run) -> tuple[Any, Any]:
    """``[P, width, V]`` logits of the padded documents (row ``k`` = ``run.padded[k]``), right-padded to
    the packed rows' width (kernels of the same shapes), in micro-batches of :data:`PADDED_TOKENS`; their gradients."""
    import torch

    from padless.batching.batch import batch_to
    from padless.batching.collate import PaddingCollator

    device = next(model.parameters()).device
    chosen = [features[i] for i in run.padded]
    per_batch = max(1, PADDED_TOKENS // width)
    model.zero_grad(set_to_none=True)
    logits = []
    for s in range(0, len(chosen), per_batch):
        batch = batch_to(PaddingCollator(pad_to_multiple_of=width)(chosen[s : s + per_batch]), device)
        logits.append(_step(model, batch, num_items, run.compute))
    grads = _flat_grads(run.params)
    model.zero_grad(set_to_none=True)
    return torch.cat(logits), grads


def _switch_backend(model: Any, backend: str, name: str, run: Run) -> BackendResult | None:
    """Switch ``model`` to ``backend`` if the rule accepted it for this layout (``run.verdicts``);
    else the report row saying why not (refused, or not installed here)."""
    from padless.attention.select import use_backend

    reason = run.verdicts[name]
    if reason is not None:
        return BackendResult(name, "refused", detail=reason)
    use_backend(backend)  # registers padless attention where it is the backend chosen
    try:
        model.set_attn_implementation(backend)
    except (ImportError, ValueError) as exc:
        return BackendResult(name, "unavailable", detail=str(exc).splitlines()[0])
    return None


def backend_verdicts(
    model: Any, backends: Sequence[str], max_length: int | None, dtype: torch.dtype
) -> dict[str, str | None]:
    """The rule (:func:`padless.check_exact`), asked once per backend and layout: result name -> why
    it refuses (None: exact). Shared-prompt rows are judged without a row bound, as they are built."""
    from padless.attention.facts import model_facts as read_facts
    from padless.attention.select import decide

    facts = read_facts(model, next(model.parameters()).device, dtype)
    out: dict[str, str | None] = {}
    for layout, suffix, rows in (("documents", "", max_length), ("shared_prompt", "+shared_prompt", None)):
        for b in backends:
            try:
                out[b + suffix] = decide(facts, b, max_length=rows, layout=layout).message  # type: ignore[arg-type]
            except ValueError as exc:  # a backend the rule does not know
                out[b + suffix] = str(exc)
    return out


def _result(name: str, logits: LogitCheck, grads: Judgment) -> BackendResult:
    """The report row of one layout from its two judgments, with the evidence of a failure."""
    evidence = [e.describe() for e in logits.evidence]
    if not grads.passed:
        evidence.append(
            f"gradients: packed {grads.measured:.3g} vs padded {grads.noise:.3g} "
            f"(relative to each document alone; limit {grads.limit:.3g})"
        )
    lj = logits.judgment
    return BackendResult(
        name,
        "pass" if lj.passed and grads.passed else "fail",
        lj.measured,
        lj.limit,
        grads.measured,
        grads.limit,
        logit_noise=lj.noise,
        grad_noise=grads.noise,
        evidence=evidence,
    )


def check_backend(model: Any, backend: str, features: list[dict[str, list[int]]], run: Run) -> BackendResult:
    """Plain rows on ``backend``: every document alone, the padded ones, all of them packed."""
    from padless.batching.batch import batch_to
    from padless.batching.collate import PackingCollator
    from padless.objectives.loss import step_num_items

    skipped = _switch_backend(model, backend, backend, run)
    if skipped is not None:
        return skipped
    device = next(model.parameters()).device
    collator = PackingCollator.for_model(
        model,
        dtype=run.dtype,
        max_length=run.max_length,
        strategy=run.strategy,
        pad_to_max_length=run.max_length is not None,
    )
    batch = batch_to(collator(features), device)
    docs = []
    for i, feature in enumerate(features):
        ((_, row, offset, n),) = batch.placements.of_feature(i)  # overlong="error": one piece each
        docs.append(Document(i, tuple(feature["input_ids"]), row, tuple(range(offset, offset + n))))
    width = int(batch["input_ids"].shape[1])  # padding as wide as the packed rows: kernels of the same shapes
    num_items = step_num_items([batch], all_ranks=False)
    with _gradients_of(model, run.params):
        alone = run.alone if run.alone is not None else _alone(model, backend, features, num_items, run)
        if run.check == "sampled":
            run.alone = alone
        padded, g_padded = _padded(model, features, width, num_items, run)
        model.zero_grad(set_to_none=True)
        packed = _step(model, batch, num_items, run.compute)
        g_packed = _flat_grads(run.params)
        model.zero_grad(set_to_none=True)
    logits = _logit_check(docs, alone.logits, packed, padded, run)
    grads = judge(
        relative_difference(g_packed, alone.grads),
        relative_difference(g_padded, alone.padded_grads),
        run.tol.grad_rtol,
        run.factor,
    )
    return _result(backend, logits, grads)


def _logit_check(docs: Sequence[Document], alone: Sequence[Any], packed: Any, padded: Any, run: Run) -> LogitCheck:
    """Every document packed against itself alone; padding's noise from the padded ones (row ``k`` of
    ``padded`` is document ``run.padded[k]``); judged by :func:`padless.isolation.compare.judge`."""
    import torch

    with torch.no_grad():
        checked = tuple(document_diff(d, a, packed) for d, a in zip(docs, alone))
        noisy: list[DocumentDiff | None] = [None] * len(docs)
        for k, i in enumerate(run.padded):
            d = docs[i]
            noisy[i] = document_diff(
                Document(d.index, d.input_ids, k, tuple(range(len(d.input_ids)))), alone[i], padded
            )
    scale = max(d.scale for d in checked)
    noise = max(n.max_diff for n in noisy if n is not None)
    verdict = judge(max(d.max_diff for d in checked), noise, run.tol.logit_floor(scale), run.factor)
    return LogitCheck(checked, tuple(noisy), verdict)


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


def shared_prompt_groups(vocab_size: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(0, vocab_size, n).tolist()  # noqa: E731
    return [{"prompt_ids": draw(p), "completion_ids": [draw(c) for c in cs]} for p, cs in SHARED_PROMPT_GROUPS]


def check_shared_prompt(model: Any, backend: str, groups: list[dict[str, Any]], run: Run) -> BackendResult:
    """Shared-prompt rows (:class:`padless.RolloutCollator`): every ``prompt + completion`` run alone
    has the logits of its prompt and completion in the packed row, and the summed completion
    log-probs have the same parameter gradients (``run.params``) packed as alone (padded: the noise)."""
    import torch

    from padless.batching.batch import batch_to, forward_inputs
    from padless.batching.preference import RolloutCollator
    from padless.isolation.compare import alone_logits, compare_documents, padded_logits

    name = f"{backend}+shared_prompt"
    skipped = _switch_backend(model, backend, name, run)
    if skipped is not None:
        return skipped
    batch = batch_to(RolloutCollator.for_model(model, dtype=run.dtype)(groups), next(model.parameters()).device)
    pl = batch.placements
    flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
    docs, packed_picks, alone_picks = [], [], []
    for f, (prompt, comp) in enumerate(flat):
        j = int(np.flatnonzero(pl.feature == f)[0])
        r, o, n, prev = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j]), int(pl.prev_offset[j])
        docs.append(Document(f, (*prompt, *comp), r, (*range(prev + 1 - len(prompt), prev + 1), *range(o, o + n))))
        packed_picks.append((r, [prev, *range(o, o + n - 1)], comp))
        alone_picks.append((f, list(range(len(prompt) - 1, len(prompt) + len(comp) - 1)), comp))
    params = run.params

    def grads(total: torch.Tensor) -> torch.Tensor:
        got = torch.autograd.grad(total, params, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, got)])

    # each forward once: its logits are compared, its log-probs differentiated
    with _gradients_of(model, params), run.compute():
        packed = model(**forward_inputs(batch)).logits
        padded = padded_logits(model, docs, int(batch["input_ids"].shape[1]))
        alone = [alone_logits(model, d.input_ids) for d in docs]
        sums = (
            _logprob_sum(packed, packed_picks),
            _logprob_sum(padded, alone_picks),
            sum(_logprob_sum(a[None], [(0, cols, t)]) for a, (_, cols, t) in zip(alone, alone_picks)),
        )
        g_packed, g_padded, g_alone = (grads(total) for total in sums)
    with run.compute():
        logits = compare_documents(
            model, packed, docs, tolerance=run.tol, factor=run.factor, alone=alone, padded=padded
        )
    verdict = judge(
        relative_difference(g_packed, g_alone), relative_difference(g_padded, g_alone), run.tol.grad_rtol, run.factor
    )
    return _result(name, logits, verdict)
