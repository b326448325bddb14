"""Figures derived from the per-step measurements of a ``results.json``: median and p90 step time,
tokens per second, padding fraction, FLOP rates and MFU per strategy (:class:`StrategyFigures`), and
the comparisons across strategies (:class:`Summary`: speedups over padding and over the strongest
baseline, the ideal speedup, eval-loss deltas).

Every figure is computed here from the raw arrays of a :class:`padless.bench.results.StrategyRun`,
never passed in, so a figure in the report can always be recomputed from the measured data.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from padless.bench.results import StrategyRun

BASELINE = "padding"
"""The strategy every speedup is measured against."""
PADLESS = "packing"
"""The strategy that is padless itself (compared with the strongest of the others)."""
SYS_TIME_WARNING = 0.2
"""A strategy whose kernel (sys) time exceeds this fraction of its CPU time is flagged in the report."""



@dataclass(frozen=True)
class StrategyFigures:
    """Figures derived from a :class:`StrategyRun`; timing figures leave out the warm-up steps."""

    steps_done: int
    """Optimiser steps recorded."""
    measured_steps: int
    """Steps after the warm-up, the ones the timing figures use."""
    step_time_median_s: float | None
    """Median step time over measured steps; ``None`` when there are none."""
    step_time_p90_s: float | None
    """90th percentile step time (linear interpolation) over measured steps."""
    real_tokens_per_s: float | None
    """Non-padding tokens over the measured steps divided by their total time."""
    padded_tokens_per_s: float | None
    """All tokens fed (padding included) over the measured steps divided by their total time."""
    sequences_per_s: float | None
    """Sequences over the measured steps divided by their total time."""
    padding_fraction: float | None
    """Padding tokens / all tokens fed, over every step recorded."""
    eval_loss_delta: float | None
    """``eval_loss_end - eval_loss_start`` (negative: the model learned)."""
    model_flops_per_s: float | None = None
    """Model FLOPs (needed work) over the measured steps divided by their total time."""
    mfu: float | None = None
    """Model FLOPs utilisation: ``model_flops_per_s`` over the machine's measured peak."""
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
    """Compiled runs: real tokens/s over the measured steps during which nothing compiled (the
    steady state; compile time reported apart, in ``compiled.compile_s``). ``real_tokens_per_s``
    keeps every measured step, compilations included."""


@dataclass(frozen=True)
class Summary:
    """Comparisons across strategies, derived from their figures."""

    baseline: str
    """The strategy speedups are measured against (``padding``)."""
    speedup: dict[str, float | None]
    """Real tokens/s of each strategy over the baseline's; ``None`` if either is missing."""
    ideal_speedup: float | None
    """Padded tokens / real tokens of the baseline: the speedup if no padding were computed."""
    eval_loss_delta: dict[str, float | None]
    """Each strategy's ``eval_loss_end - eval_loss_start``."""
    eval_loss_end_vs_baseline: dict[str, float | None]
    """Each strategy's final eval loss minus the baseline's (near 0: same learning)."""
    strongest_baseline: str | None = None
    """The fastest strategy other than packing (real tokens/s)."""
    speedup_over_strongest: float | None = None
    """Packing's real tokens/s over the strongest baseline's: the headline figure."""
    ideal_speedup_flops: float | None = None
    """The baseline's executed FLOPs / the FLOPs its steps needed: the speedup if padded work were free."""
    fraction_of_ideal: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Each strategy's speedup over the baseline divided by ``ideal_speedup_flops``."""




def percentile(values: typing.Sequence[float], q: float) -> float:
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


def strategy_figures(run: StrategyRun, warmup_steps: int, peak_flops_per_s: float | None = None) -> StrategyFigures:
    """Median/p90 step time and rates over the steps after ``warmup_steps``; padding fraction over
    all steps. Rates are totals over totals (not a mean of per-step rates), so a slow step weighs
    what it cost. MFU needs the measured ``peak_flops_per_s``."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    times = list(run.step_time_s[warmup_steps:])
    total_time = sum(times)
    padded_all = sum(run.padded_tokens)
    delta = None
    if run.eval_loss_start is not None and run.eval_loss_end is not None:
        delta = run.eval_loss_end - run.eval_loss_start
    return StrategyFigures(
        steps_done=len(run.step_time_s),
        measured_steps=len(times),
        step_time_median_s=percentile(times, 50) if times else None,
        step_time_p90_s=percentile(times, 90) if times else None,
        real_tokens_per_s=_ratio(sum(run.real_tokens[warmup_steps:]), total_time),
        padded_tokens_per_s=_ratio(sum(run.padded_tokens[warmup_steps:]), total_time),
        sequences_per_s=_ratio(sum(run.sequences[warmup_steps:]), total_time),
        padding_fraction=1 - sum(run.real_tokens) / padded_all if padded_all > 0 else None,
        eval_loss_delta=delta,
        **_flop_figures(run, warmup_steps, total_time, peak_flops_per_s),
        **_compile_figures(run, warmup_steps),
    )


def _compile_figures(run: StrategyRun, warmup_steps: int) -> dict[str, Any]:
    if run.compiled is None or len(run.step_compile_s) != len(run.step_time_s):
        return {}
    quiet = [i for i in range(warmup_steps, len(run.step_time_s)) if run.step_compile_s[i] == 0.0]
    return {
        "compile_steps": sum(1 for s in run.step_compile_s if s > 0.0),
        "steady_real_tokens_per_s": _ratio(sum(run.real_tokens[i] for i in quiet),
                                           sum(run.step_time_s[i] for i in quiet)),
    }


def _flop_figures(run: StrategyRun, warmup_steps: int, total_time: float, peak: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if run.cpu_user_s is not None and run.cpu_sys_s is not None:
        out["cpu_sys_fraction"] = _ratio(run.cpu_sys_s, run.cpu_user_s + run.cpu_sys_s)
    if len(run.model_flops) != len(run.step_time_s):  # an older file: no FLOP counts
        return out
    rate = _ratio(sum(run.model_flops[warmup_steps:]), total_time)
    out.update(
        model_flops_per_s=rate,
        mfu=rate / peak if rate is not None and peak else None,
        flops_per_real_token=_ratio(sum(run.model_flops), sum(run.real_tokens)),
        flops_per_trained_token=_ratio(sum(run.model_flops), sum(run.trained_tokens)),
        executed_over_model_flops=_ratio(sum(run.executed_flops), sum(run.model_flops)),
    )
    return out


def summarize(strategies: dict[str, StrategyRun], warmup_steps: int, baseline: str = BASELINE) -> Summary:
    """Speedup of each strategy over ``baseline`` (real tokens/s ratio), the ideal speedup (the
    baseline's padded / real tokens) and eval-loss deltas. Figures needing the baseline are
    ``None`` when it is absent or has no measured steps."""
    figs = {n: strategy_figures(r, warmup_steps) for n, r in strategies.items()}
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
    ideal_flops = None
    if baseline in strategies and len(strategies[baseline].executed_flops) == len(strategies[baseline].step_time_s):
        ideal_flops = _ratio(sum(strategies[baseline].executed_flops), sum(strategies[baseline].model_flops))
    return Summary(
        baseline=baseline,
        speedup=speedup,
        ideal_speedup=ideal,
        eval_loss_delta={n: f.eval_loss_delta for n, f in figs.items()},
        eval_loss_end_vs_baseline=vs_base,
        strongest_baseline=strongest,
        speedup_over_strongest=ours / others[strongest] if ours is not None and strongest is not None else None,
        ideal_speedup_flops=ideal_flops,
        fraction_of_ideal={n: s / ideal_flops if s is not None and ideal_flops else None for n, s in speedup.items()},
    )
