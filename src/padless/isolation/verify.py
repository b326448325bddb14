"""Isolation and equivalence checks for packed training, for any causal LM and attention backend.

For each backend, :func:`verify_isolation` runs documents alone (no padding, no mask), packed into
rows of ``max_length`` tokens, and right-padded, and measures against the runs alone:

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

How much is run (:data:`Check`), for rows of ``L`` tokens (default :data:`DEFAULT_MAX_LENGTH`, capped
at the model's positions)::

                    sampled (default)                      thorough
    documents       1 row of L (seeded lengths)            2 rows of L (seeded lengths)
    logits          every document                         every document
    padded (noise)  the longest document, padded to L      every document, padded to L
    alone           once, on the first backend that runs   on each backend
    gradients       the last block + the layers after it   every trainable parameter
    shared prompt   3 prompts, 7 completions in one row; gradients as above

What costs is a forward (and backward) over rows of ``L`` tokens, and a backward through every layer
(docs/verify.md has timings). The sampled check still fails a contaminated row: every document's
logits are compared (a leak moves them by their own size), and a label or loss leak changes the
last block's gradients too (tests/isolation/test_verify.py).

``autocast=torch.bfloat16`` runs the forwards under ``torch.autocast`` over the model's own
(float32) weights, as ``Trainer(bf16=True)`` trains; the floor is then the autocast dtype's. A
float64 model is the oracle: its noise is ~1e-14, so any systematic difference shows.

A backend that padless refuses for this model and device (say FlexAttention on a CPU) is reported
as refused, with the reason; a backend that is not installed as unavailable. Only a backend that
runs and differs fails. Use it in your own tests: ``assert padless.verify_isolation(model).passed``.

This module decides what to check; :mod:`padless.isolation.runs` runs it on each backend and
:mod:`padless.isolation.report` holds what comes back (their public names are importable from here too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from padless.devices import compute_dtype, dtype_name
from padless.isolation.compare import (
    NOISE_FACTOR,
    TOLERANCES,  # noqa: F401  (its public home: padless.isolation.verify.TOLERANCES)
    Tolerance,
    tolerance_for,
)
from padless.isolation.report import (  # noqa: F401 (re-exported: the report's public names)
    CONTEXT_KEYS,
    BackendResult,
    Coverage,
    ModelSummary,
    Status,
    VerifyReport,
    context_length,
    legend,
    model_summary,
)
from padless.isolation.runs import (  # noqa: F401 (re-exported: the runs' public names)
    PADDED_TOKENS,
    SHARED_PROMPT_GROUPS,
    Context,
    Run,
    backend_verdicts,
    check_backend,
    check_shared_prompt,
    random_sequences,
    sampled_parameters,
    shared_prompt_groups,
)

if TYPE_CHECKING:  # torch is imported where used: `padless verify` refuses bad flags before torch loads
    import torch


DEFAULT_BACKENDS = ("sdpa", "eager", "padless", "flash_attention_2", "flex_attention")
DEFAULT_MAX_LENGTH = 2048
"""Packed row length when none is given (capped at the model's positions: :attr:`ModelSummary.context`)."""
DEFAULT_LENGTHS = (1, 7, 13, 5, 24, 3, 9, 2)
"""The documents of one row holding every document (``max_length=None``)."""

Check = Literal["sampled", "thorough"]
"""How much :func:`verify_isolation` runs (the table in the module docstring)."""
CHECKS: tuple[str, ...] = get_args(Check)
ROWS: dict[str, int] = {"sampled": 1, "thorough": 2}
"""Rows of default documents per check."""
DOCUMENTS_PER_ROW = 6
"""Default documents in a row (fewer when the row is too short)."""
Progress = Callable[[str], None]
"""Receives one line per stage as :func:`verify_isolation` goes (``print``, a logger, ...)."""


def default_lengths(
    model: Any, max_length: int | None = None, check: Check = "sampled", seed: int = 0
) -> tuple[int, ...]:
    """The lengths of the default documents: for rows of ``max_length`` tokens,
    :func:`sample_lengths` (``ROWS[check]`` rows); for one row of everything (``None``),
    :data:`DEFAULT_LENGTHS`. Either way one document is longer than the model's shortest sliding
    window shorter than the row (when it fits), so that a packed mask that dropped the window shows
    as a difference."""
    from padless.attention.facts import model_facts as read_facts

    windows = read_facts(model).rules.active_windows(max_length)
    window = windows[0] if windows else None
    if max_length is not None:
        return sample_lengths(max_length, ROWS[check], seed=seed, window=window)
    if window is not None and max(DEFAULT_LENGTHS) <= window:
        return (*DEFAULT_LENGTHS, window + 4)
    return DEFAULT_LENGTHS


def sample_lengths(max_length: int, rows: int = 1, *, seed: int = 0, window: int | None = None) -> tuple[int, ...]:
    """Seeded document lengths for ``rows`` rows of ``max_length`` tokens, in the order that next-fit
    packs them (each row's documents, row after row), chosen to meet at boundaries::

        rows=1   [1 | a | b ....... | c | d .. | e | pad]    a 1-token document first, a padded tail
        rows=2   [1 | a | b ....... | c | d .. | e ..... ]   the first row full to its last token
                 [f ...... | g | h ........ | pad ...... ]   the last row ~3/4 full, then padding

    Lengths come from uniform cuts of each row (:data:`DOCUMENTS_PER_ROW` documents), so short and
    long documents sit side by side. With ``window`` (a sliding window shorter than the row) and no
    document longer than it, the last row holds one of ``window + 4`` tokens (at most the row).
    """
    if max_length < 1 or rows < 1:
        raise ValueError(f"max_length={max_length} and rows={rows} must be >= 1")
    rng = np.random.default_rng(seed)

    def cut(total: int, parts: int) -> list[int]:
        parts = max(1, min(parts, total))
        points = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False)) if parts > 1 else []
        return np.diff([0, *points, total]).astype(int).tolist()

    last_fill = max(1, (3 * max_length) // 4) if rows > 1 else max(1, max_length - max(1, max_length // 16))
    fills = [max_length] * (rows - 1) + [last_fill]
    out = []
    for r, fill in enumerate(fills):
        if r == 0 and fill > 1:  # a 1-token document opens the first row: no target, position 0 only
            out.append([1, *cut(fill - 1, DOCUMENTS_PER_ROW - 1)])
        else:
            out.append(cut(fill, DOCUMENTS_PER_ROW))
    if window is not None and window < max_length and max(max(r) for r in out) <= window:
        lead = [1] if rows == 1 and window + 1 < max_length else []  # keep the 1-token document when it fits
        n = min(window + 4, max_length - len(lead))
        fill = max(fills[-1], len(lead) + n)
        out[-1] = [
            *lead,
            n,
            *(cut(fill - len(lead) - n, DOCUMENTS_PER_ROW - 1 - len(lead)) if fill > len(lead) + n else []),
        ]
    return tuple(n for row in out for n in row)


def verify_isolation(
    model: Any,
    sequences: Sequence[Sequence[int]] | None = None,
    *,
    backends: Sequence[str] = DEFAULT_BACKENDS,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    check: Check = "sampled",
    seed: int = 0,
    tolerance: Tolerance | None = None,
    autocast: torch.dtype | None = None,
    factor: float = NOISE_FACTOR,
    progress: Progress | None = None,
) -> VerifyReport:
    """Check every backend in ``backends`` on ``model`` (its device and dtype are used as they are).

    ``max_length``: packed row length, capped at the model's positions (:func:`context_length`);
    ``None``: one row holding every sequence. ``check``: ``"sampled"`` or ``"thorough"`` (the table
    in the module docstring). ``sequences``: token-id lists (default: random ids with lengths
    :func:`default_lengths`: for rows of ``max_length``, seeded lengths that fill them, with a
    1-token document and one longer than the model's sliding window if it has one); rows are raised
    to the longest sequence given. ``tolerance``: the absolute floor (default :data:`TOLERANCES` of the
    compute dtype); ``factor``: how many times padding's own noise packed rows may differ (see the
    module docstring). ``autocast``: run every forward under ``torch.autocast`` with this dtype (fp32
    master weights). ``progress``: called with one line per stage as it goes (the model, the rule's
    verdicts, what is sampled, then each check as it starts and ends).
    A row longer than the model's positions raises ``ValueError``. A model whose forward takes no
    ``position_ids`` gets every backend refused, with the reason.
    The model's attention implementation, mode and ``requires_grad`` flags are restored afterwards.
    """
    import torch

    say = progress or (lambda line: None)
    if check not in CHECKS:
        raise ValueError(f"check={check!r} must be one of {', '.join(CHECKS)}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1, or None for one row holding every sequence")
    if factor < 1:
        raise ValueError(f"factor={factor} must be >= 1: packed rows cannot be held below padding's own noise")
    if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast={autocast} must be torch.bfloat16 or torch.float16")
    facts = model_summary(model)
    requested = max_length
    if max_length is not None and facts.context is not None:
        max_length = min(max_length, facts.context)
    if sequences is None:
        features = random_sequences(default_lengths(model, max_length, check, seed), model.config.vocab_size, seed)
    else:
        features = [{"input_ids": [int(t) for t in s]} for s in sequences]
    if not features or min(len(f["input_ids"]) for f in features) < 1:
        raise ValueError("sequences must be non-empty token-id lists")
    lengths = [len(f["input_ids"]) for f in features]
    if max_length is not None:
        max_length = max(max_length, max(lengths))
    row = max_length if max_length is not None else sum(lengths)
    if facts.context is not None and row > facts.context:
        raise ValueError(
            f"packed rows of {row} tokens exceed the model's {facts.context} positions; "
            "use shorter sequences or a smaller max_length"
        )
    device = next(model.parameters()).device
    if autocast is not None:
        dtype = f"autocast-{dtype_name(autocast)}"
        compute: Context = lambda: torch.autocast(device.type, dtype=autocast)  # noqa: E731
    else:
        dtype, compute = dtype_name(model.dtype), nullcontext
    tol = tolerance_for(autocast or model.dtype, tolerance)
    if check == "sampled":
        params, scope = sampled_parameters(model)
        padded: tuple[int, ...] = (int(np.argmax(lengths)),)
    else:
        params, scope = [p for p in model.parameters() if p.requires_grad], "every trainable parameter"
        padded = tuple(range(len(features)))
    # next-fit keeps the default documents' order, so each row holds what sample_lengths drew for it;
    # given sequences are planned as training plans them
    strategy = "next_fit" if sequences is None else "best_fit_decreasing"
    coverage = Coverage(
        check,
        lengths,
        _rows(lengths, max_length, strategy),
        max_length,
        requested,
        list(padded),
        None,
        sum(p.numel() for p in params),
        scope,
        seed,
    )

    def report(results: list[BackendResult], alone_on: str | None = None) -> VerifyReport:
        return VerifyReport(
            facts.name,
            dtype,
            str(device),
            lengths,
            max_length,
            results,
            factor,
            facts,
            replace(coverage, alone_on=alone_on),
            tol,
        )

    say(f"{facts.describe()}; {dtype} on {device}")
    refusal = _model_refusal(model)
    if refusal is not None:  # padless' own reason, before any backend (or transformers) is asked
        say(f"rule: refuses every backend: {refusal}")
        return report([BackendResult(b, "refused", detail=refusal) for b in backends])
    target = compute_dtype(model) if autocast is None else autocast
    run = Run(
        tol,
        factor,
        compute,
        target,
        check,
        params,
        padded,
        max_length,
        strategy,
        backend_verdicts(model, backends, max_length, target),
    )
    for line in (*_rule_lines(model, backends, run.verdicts, max_length), *coverage.describe(), legend(factor, tol)):
        say(line)
    groups = shared_prompt_groups(model.config.vocab_size, seed)
    names = [*backends, *(f"{b}+shared_prompt" for b in backends)]
    original = model.config._attn_implementation
    was_training = model.training
    model.eval()  # dropout off: both sides must compute the same function
    results = []
    try:
        for k, name in enumerate(names, 1):
            backend, _, layout = name.partition("+")
            what = (
                f"{len(features)} documents in {_rows_text(coverage.rows, max_length)}"
                if not layout
                else f"{len(groups)} prompts, {sum(len(g['completion_ids']) for g in groups)} completions in one row"
            )
            if run.verdicts[name] is not None:
                say(f"[{k}/{len(names)}] {name}: refused by the rule (reason in the table)")
            else:
                say(f"[{k}/{len(names)}] {name}: packed vs alone vs padded, {what} ...")
            start = time.perf_counter()
            result = (
                check_shared_prompt(model, backend, groups, run)
                if layout
                else check_backend(model, backend, features, run)
            )
            if result.status in ("pass", "fail"):
                result = replace(result, seconds=round(time.perf_counter() - start, 2))
                say(f"[{k}/{len(names)}] {name}: {result.status} in {result.seconds:.1f} s")
            elif run.verdicts[name] is None:
                say(f"[{k}/{len(names)}] {name}: {result.status} ({result.detail})")
            results.append(result)
    finally:
        model.set_attn_implementation(original)
        model.train(was_training)
    return report(results, run.alone.backend if run.alone is not None else None)


def _rows(lengths: Sequence[int], max_length: int | None, strategy: str) -> int:
    """Rows the collator's planner packs ``lengths`` into (1 without a row bound)."""
    from padless.planning.plan import plan_packs

    return 1 if max_length is None else plan_packs(lengths, max_length, strategy=strategy).num_rows  # type: ignore[arg-type]


def _rows_text(rows: int, max_length: int | None) -> str:
    return f"{rows} row{'s' if rows != 1 else ''} of {max_length}" if max_length is not None else "one row"


def _rule_lines(
    model: Any, backends: Sequence[str], verdicts: dict[str, str | None], max_length: int | None
) -> list[str]:
    """One line per layout: the backends the rule accepts (with what their rows carry) and refuses."""
    from padless.attention.select import BACKENDS, model_inputs

    lines = []
    for layout, suffix, rows in (("documents", "", max_length), ("shared prompt", "+shared_prompt", None)):
        exact = [f"{b} ({model_inputs(model, b)})" for b in backends if b in BACKENDS and verdicts[b + suffix] is None]
        refused = [b for b in backends if verdicts[b + suffix] is not None]
        where = f"rows of {rows}" if rows is not None else "one row"
        lines.append(
            f"rule (padless.check_exact), {layout} layout, {where}: exact on {', '.join(exact) or 'no backend'}"
            + (f"; refuses {', '.join(refused)}" if refused else "")
        )
    return lines


def _model_refusal(model: Any) -> str | None:
    """Why padless packs for no backend of this model (its forward takes no ``position_ids``), or None."""
    from padless.attention.facts import model_facts as read_facts

    facts = read_facts(model)  # of the model a PEFT wrapper wraps (its forward takes **kwargs)
    if facts.attention_free:  # Mamba, RWKV, xLSTM with patched mixers: position_ids through **kwargs
        return None
    if facts.rules.takes_position_ids is False:
        return (
            f"{facts.base_class}.forward takes no position_ids, so packed documents would be given "
            "positions that run on across document boundaries; padless refuses to pack for it"
        )
    return None
