"""Figures derived from the per-step measurements of a ``results.json``: step-time and throughput
medians with their spread, padding fraction, FLOP rates and MFU per strategy (:class:`StrategyFigures`),
and the comparisons across strategies (:class:`Summary`: speedups over padding and over the strongest
baseline run, the ideal speedup, eval-loss deltas, and the warnings a reader must see before a figure).

Every figure is computed here from the raw per-step arrays (any object with the fields of
:class:`MeasuredSteps`, e.g. a :class:`padless.bench.results.StrategyRun`), never passed in, so a figure
in the report can always be recomputed from the measured data. This module imports nothing of padless:
``results`` builds on it, not the other way round.

Rates are medians of per-step rates: step ``i`` of a strategy ran ``real_tokens[i]`` in
``step_time_s[i]``; its real tokens/s is the median of those ratios over the timed steps (the warm-up
left out), so one slow step (a busy machine, a compile, a page-fault storm) moves it by one rank, not by
its length. The spread is the interquartile range (25th-75th percentile) of the same per-step values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

BASELINE = "padding"
"""The strategy every speedup is measured against."""
PADLESS = "packing"
"""The strategy that is padless itself (compared with the strongest of the others)."""
SYS_TIME_WARNING = 0.2
"""A strategy whose kernel (sys) time exceeds this fraction of its CPU time is flagged in the report."""
MIN_TIMED_STEPS = 5
"""Fewer timed steps (after the warm-up) than this per strategy: the figures carry a warning."""
OVER_100 = "n/a (over 100%: {what} or timing wrong)"
"""How an MFU or a fraction of the ideal above 100% is shown instead of the figure (``what``: peak, ideal)."""


class MeasuredSteps(Protocol):
    """What the figures read from one strategy's measurements (:class:`padless.bench.results.StrategyRun`)."""

    step_time_s: Sequence[float]
    real_tokens: Sequence[int]
    padded_tokens: Sequence[int]
    sequences: Sequence[int]
    eval_loss_start: float | None
    eval_loss_end: float | None
    trained_tokens: Sequence[int]
    model_flops: Sequence[float]
    executed_flops: Sequence[float]
    cpu_user_s: float | None
    cpu_sys_s: float | None
    compiled: Any
    step_compile_s: Sequence[float]


@dataclass(frozen=True)
class StrategyFigures:
    """Figures derived from one strategy's steps; timing figures leave out the warm-up steps."""

    steps_done: int
    """Optimiser steps recorded."""
    measured_steps: int
    """Steps after the warm-up (the timed steps), the ones the timing figures use."""
    step_time_median_s: float | None
    """Median step time over the timed steps; ``None`` when there are none."""
    step_time_p90_s: float | None
    """90th percentile step time (linear interpolation) over the timed steps."""
    real_tokens_per_s: float | None
    """Median over the timed steps of each step's non-padding tokens / its time."""
    padded_tokens_per_s: float | None
    """Median over the timed steps of each step's tokens fed (padding included) / its time."""
    sequences_per_s: float | None
    """Median over the timed steps of each step's sequences / its time."""
    padding_fraction: float | None
    """Padding tokens / all tokens fed, over every step recorded."""
    eval_loss_delta: float | None
    """``eval_loss_end - eval_loss_start`` (negative: the model learned)."""
    model_flops_per_s: float | None = None
    """Median over the timed steps of each step's model FLOPs (needed work) / its time."""
    mfu: float | None = None
    """Model FLOPs utilisation: ``model_flops_per_s`` over the machine's measured peak. Above 1.0 the
    peak or the timing is wrong: the report shows it as n/a with a warning."""
    flops_per_real_token: float | None = None
    """Model FLOPs per real token, over every step recorded."""
    flops_per_trained_token: float | None = None
    """Model FLOPs per trained token, over every step recorded."""
    executed_over_model_flops: float | None = None
    """FLOPs executed / FLOPs needed, over every step (1.0: no work spent on padding)."""
    cpu_sys_fraction: float | None = None
    """Kernel time / CPU time (user + sys) of the training phase."""
    compile_steps: int | None = None
    """Steps (warm-up included) during which torch compiled something; ``None``: not compiled."""
    steady_real_tokens_per_s: float | None = None
    """Compiled runs: the median real tokens/s of the timed steps during which nothing compiled (the
    steady state; compile time reported apart, in ``compiled.compile_s``)."""
    step_time_p25_s: float | None = None
    """25th percentile step time over the timed steps (with ``step_time_p75_s``: the spread)."""
    step_time_p75_s: float | None = None
    """75th percentile step time over the timed steps."""
    real_tokens_per_s_p25: float | None = None
    """25th percentile of the timed steps' real tokens/s (with ``real_tokens_per_s_p75``: the spread)."""
    real_tokens_per_s_p75: float | None = None
    """75th percentile of the timed steps' real tokens/s."""


@dataclass(frozen=True)
class PairedSteps:
    """One strategy against another step by step, in ``same-examples`` mode (step ``i`` trains the same
    examples under both, so its two times compare the batching alone)."""

    steps: int
    """Timed steps both strategies ran."""
    faster: int
    """Of them, the steps the first strategy took less time for."""
    ratio_p25: float
    """25th percentile of the per-step speedup (the other's step time / this one's)."""
    ratio_median: float
    """Median per-step speedup."""
    ratio_p75: float
    """75th percentile of the per-step speedup."""
    ratio_min: float | None = None
    """Smallest per-step speedup."""
    ratio_max: float | None = None
    """Largest per-step speedup."""


@dataclass(frozen=True)
class Summary:
    """Comparisons across strategies, derived from their figures."""

    baseline: str
    """The strategy speedups are measured against (``padding``)."""
    speedup: dict[str, float | None]
    """Each strategy's real tokens/s (median of per-step rates) over the baseline's; ``None`` if
    either is missing."""
    ideal_speedup: float | None
    """The baseline's tokens fed / real tokens: the speedup if padding tokens cost nothing and every
    cost scaled with the tokens fed (it counts the LM head, which runs on trained tokens only, so it
    is a bound, reached when the body dominates)."""
    eval_loss_delta: dict[str, float | None]
    """Each strategy's ``eval_loss_end - eval_loss_start``."""
    eval_loss_end_vs_baseline: dict[str, float | None]
    """Each strategy's final eval loss minus the baseline's (near 0: same learning)."""
    strongest_baseline: str | None = None
    """The fastest strategy run other than packing (by real tokens/s)."""
    speedup_over_strongest: float | None = None
    """Packing's real tokens/s over the strongest baseline's: the headline figure."""
    fraction_of_ideal: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Each strategy's speedup over the baseline divided by ``ideal_speedup``; above 1.0 the ideal
    or the timing is wrong (shown as n/a with a warning)."""
    baselines_run: tuple[str, ...] = ()
    """The strategies other than packing that have timed steps, in the order they ran."""
    paired_over_strongest: PairedSteps | None = None
    """Packing against the strongest baseline step by step (``same-examples`` mode only)."""
    headline_noise: str | None = None
    """Why packing's speedup over the strongest baseline cannot rank them (its spread holds ×1.00),
    or ``None`` when it stands clear of the spread: the headline is printed only then."""
    warnings: tuple[str, ...] = ()
    """What makes a figure unreliable (too few timed steps, a speedup within the spread, an MFU or a
    fraction of the ideal over 100%, kernel time): shown above the table and in report.html."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default); ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _timed_rates(
    run: MeasuredSteps, values: Sequence[float], warmup_steps: int, steps: Sequence[int] | None = None
) -> list[float]:
    """``values[i] / step_time_s[i]`` for the timed steps (``steps``: those indices only); a step
    timed at 0 s (a coarse clock) has no rate and is left out."""
    picked = range(warmup_steps, len(run.step_time_s)) if steps is None else steps
    return [values[i] / run.step_time_s[i] for i in picked if run.step_time_s[i] > 0]


def _median(values: Sequence[float]) -> float | None:
    return percentile(values, 50) if values else None


def strategy_figures(run: MeasuredSteps, warmup_steps: int, peak_flops_per_s: float | None = None) -> StrategyFigures:
    """Medians and interquartile ranges of the step times and per-step rates over the steps after
    ``warmup_steps``; padding fraction over all steps. MFU needs the measured ``peak_flops_per_s``."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    times = list(run.step_time_s[warmup_steps:])
    real = _timed_rates(run, run.real_tokens, warmup_steps)
    padded_all = sum(run.padded_tokens)
    delta = None
    if run.eval_loss_start is not None and run.eval_loss_end is not None:
        delta = run.eval_loss_end - run.eval_loss_start
    return StrategyFigures(
        steps_done=len(run.step_time_s),
        measured_steps=len(times),
        step_time_median_s=_median(times),
        step_time_p90_s=percentile(times, 90) if times else None,
        real_tokens_per_s=_median(real),
        padded_tokens_per_s=_median(_timed_rates(run, run.padded_tokens, warmup_steps)),
        sequences_per_s=_median(_timed_rates(run, run.sequences, warmup_steps)),
        padding_fraction=1 - sum(run.real_tokens) / padded_all if padded_all > 0 else None,
        eval_loss_delta=delta,
        step_time_p25_s=percentile(times, 25) if times else None,
        step_time_p75_s=percentile(times, 75) if times else None,
        real_tokens_per_s_p25=percentile(real, 25) if real else None,
        real_tokens_per_s_p75=percentile(real, 75) if real else None,
        **_flop_figures(run, warmup_steps, peak_flops_per_s),
        **_compile_figures(run, warmup_steps),
    )


def _compile_figures(run: MeasuredSteps, warmup_steps: int) -> dict[str, Any]:
    if run.compiled is None or len(run.step_compile_s) != len(run.step_time_s):
        return {}
    quiet = [i for i in range(warmup_steps, len(run.step_time_s)) if run.step_compile_s[i] == 0.0]
    return {
        "compile_steps": sum(1 for s in run.step_compile_s if s > 0.0),
        "steady_real_tokens_per_s": _median(_timed_rates(run, run.real_tokens, warmup_steps, quiet)),
    }


def _flop_figures(run: MeasuredSteps, warmup_steps: int, peak: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if run.cpu_user_s is not None and run.cpu_sys_s is not None:
        out["cpu_sys_fraction"] = _ratio(run.cpu_sys_s, run.cpu_user_s + run.cpu_sys_s)
    if len(run.model_flops) != len(run.step_time_s):  # an older file: no FLOP counts
        return out
    rate = _median(_timed_rates(run, run.model_flops, warmup_steps))
    out.update(
        model_flops_per_s=rate,
        mfu=rate / peak if rate is not None and peak else None,
        flops_per_real_token=_ratio(sum(run.model_flops), sum(run.real_tokens)),
        flops_per_trained_token=_ratio(sum(run.model_flops), sum(run.trained_tokens)),
        executed_over_model_flops=_ratio(sum(run.executed_flops), sum(run.model_flops)),
    )
    return out


def paired_steps(run: MeasuredSteps, other: MeasuredSteps, warmup_steps: int) -> PairedSteps | None:
    """``run`` against ``other`` over the timed steps both recorded (same examples per step): how many
    steps ``run`` was faster in, and the quartiles of ``other``'s step time / ``run``'s. ``None``
    without a common timed step."""
    pairs = [(a, b) for a, b in zip(run.step_time_s[warmup_steps:], other.step_time_s[warmup_steps:]) if a > 0]
    if not pairs:
        return None
    ratios = [b / a for a, b in pairs]
    return PairedSteps(
        steps=len(pairs),
        faster=sum(1 for a, b in pairs if a < b),
        ratio_p25=percentile(ratios, 25),
        ratio_median=percentile(ratios, 50),
        ratio_p75=percentile(ratios, 75),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
    )


def _within_noise(
    name: str,
    other: str,
    runs: dict[str, MeasuredSteps],
    figs: dict[str, StrategyFigures],
    warmup_steps: int,
    paired: bool,
) -> str | None:
    """How ``name``'s speedup over ``other`` sits inside the spread, or ``None`` if it stands clear.
    Same examples per step (``paired``): the per-step speedup's interquartile range holds x1.00 (one
    strategy is faster in fewer than three steps in four). Otherwise the two strategies' per-step
    real tokens/s interquartile ranges overlap."""
    if paired:
        p = paired_steps(runs[name], runs[other], warmup_steps)
        if p is None or not p.ratio_p25 <= 1.0 <= p.ratio_p75:
            return None
        return (
            f"{name} over {other}: per-step speedup ×{p.ratio_p25:.2f}-×{p.ratio_p75:.2f} (IQR), "
            f"faster in {p.faster} of {p.steps} steps"
        )
    a, b = figs[name], figs[other]
    lo_a, hi_a = a.real_tokens_per_s_p25, a.real_tokens_per_s_p75
    lo_b, hi_b = b.real_tokens_per_s_p25, b.real_tokens_per_s_p75
    if lo_a is None or hi_a is None or lo_b is None or hi_b is None or hi_a < lo_b or hi_b < lo_a:
        return None
    return f"{name} over {other}: real tokens/s IQR {lo_a:,.0f}-{hi_a:,.0f} against {lo_b:,.0f}-{hi_b:,.0f}"


def _warnings(
    runs: dict[str, MeasuredSteps],
    figs: dict[str, StrategyFigures],
    warmup_steps: int,
    paired: bool,
    baseline: str,
    speedup: dict[str, float | None],
    ideal: float | None,
    strongest: str | None,
    fraction: dict[str, float | None],
    peak: float | None,
) -> list[str]:
    out: list[str] = []
    few = {n: f.measured_steps for n, f in figs.items() if f.measured_steps < MIN_TIMED_STEPS}
    if few:
        counts = ", ".join(f"{n} {k}" for n, k in few.items())
        out.append(
            f"too few timed steps for a speedup: {counts} (fewer than {MIN_TIMED_STEPS} after the "
            f"{warmup_steps} warm-up step(s)); run more steps, at least warmup_steps + {MIN_TIMED_STEPS}"
        )
    over = {n: x for n, x in fraction.items() if x is not None and x > 1.0}
    if over and ideal is not None:
        listed = ", ".join(f"{n} ×{speedup[n]:.2f} ({100 * x:.0f}%)" for n, x in over.items())
        out.append(
            f"speedup over the ideal ×{ideal:.2f} ({baseline}'s tokens fed / real tokens), which removing "
            f"padding cannot beat: {listed}; the timing or the ideal is wrong, so 'of ideal' shows n/a"
        )
    mfu = {n: f.mfu for n, f in figs.items() if f.mfu is not None and f.mfu > 1.0}
    if mfu:
        listed = ", ".join(f"{n} ({100 * x:.0f}%)" for n, x in mfu.items())
        out.append(
            f"MFU over 100%: {listed}; the measured peak ({peak or 0:.3g} FLOP/s), the FLOP count or the "
            "step timing is wrong, so MFU shows n/a"
        )
    pairs = [(n, baseline) for n in figs if n != baseline and baseline in figs]
    if strongest is not None and PADLESS in figs and strongest != baseline:
        pairs.insert(0, (PADLESS, strongest))
    noisy = [line for a, b in pairs if (line := _within_noise(a, b, runs, figs, warmup_steps, paired))]
    if noisy:
        out.append("speedup within the spread of the step times, not a measured difference: " + "; ".join(noisy))
    heavy = [n for n, f in figs.items() if (f.cpu_sys_fraction or 0) > SYS_TIME_WARNING]
    if heavy:
        out.append(
            f"kernel (sys) time above {SYS_TIME_WARNING:.0%} of CPU time for {', '.join(heavy)}: the run "
            "spent its time in page faults or the allocator, not in training"
        )
    return out


def summarize(
    strategies: dict[str, MeasuredSteps],
    warmup_steps: int,
    baseline: str = BASELINE,
    *,
    peak_flops_per_s: float | None = None,
    same_examples: bool = True,
) -> Summary:
    """Speedup of each strategy over ``baseline`` (ratio of the median per-step real tokens/s), the
    strongest baseline run and packing's speedup over it, the ideal speedup (the baseline's tokens
    fed / real tokens), eval-loss deltas and the warnings. ``same_examples``: step ``i`` trained the
    same examples under every strategy, so strategies are compared step by step. Figures needing
    the baseline are ``None`` when it is absent or has no timed steps."""
    figs = {n: strategy_figures(r, warmup_steps, peak_flops_per_s) for n, r in strategies.items()}
    base = figs.get(baseline)
    base_tps = base.real_tokens_per_s if base else None
    ideal = None
    if baseline in strategies:
        ideal = _ratio(sum(strategies[baseline].padded_tokens), sum(strategies[baseline].real_tokens))
    base_end = strategies[baseline].eval_loss_end if baseline in strategies else None
    speedup: dict[str, float | None] = {}
    vs_base: dict[str, float | None] = {}
    for name, f in figs.items():
        ok = f.real_tokens_per_s is not None and base_tps is not None
        speedup[name] = f.real_tokens_per_s / base_tps if ok else None
        end = strategies[name].eval_loss_end
        vs_base[name] = end - base_end if end is not None and base_end is not None else None
    others = {n: f.real_tokens_per_s for n, f in figs.items() if n != PADLESS and f.real_tokens_per_s is not None}
    strongest = max(others, key=lambda n: others[n]) if others else None
    ours = figs[PADLESS].real_tokens_per_s if PADLESS in figs else None
    fraction = {n: s / ideal if s is not None and ideal else None for n, s in speedup.items()}
    paired = None
    if same_examples and strongest is not None and ours is not None:
        paired = paired_steps(strategies[PADLESS], strategies[strongest], warmup_steps)
    return Summary(
        baseline=baseline,
        speedup=speedup,
        ideal_speedup=ideal,
        eval_loss_delta={n: f.eval_loss_delta for n, f in figs.items()},
        eval_loss_end_vs_baseline=vs_base,
        strongest_baseline=strongest,
        speedup_over_strongest=ours / others[strongest] if ours is not None and strongest is not None else None,
        fraction_of_ideal=fraction,
        baselines_run=tuple(others),
        paired_over_strongest=paired,
        headline_noise=(
            _within_noise(PADLESS, strongest, strategies, figs, warmup_steps, same_examples)
            if strongest is not None and ours is not None
            else None
        ),
        warnings=tuple(
            _warnings(
                strategies,
                figs,
                warmup_steps,
                same_examples,
                baseline,
                speedup,
                ideal,
                strongest if ours is not None else None,
                fraction,
                peak_flops_per_s,
            )
        ),
    )
