"""The benchmark's plots, drawn from a ``results.json`` alone (matplotlib, on ``Figure`` objects with the
Agg canvas, so no pyplot state and no display are involved); :mod:`padless.bench.report` embeds them.

    throughput.png     real tokens/s per strategy with its spread, speedup over padding, the ideal marked
    loss_vs_step.png   training loss per optimiser step, all strategies (curves that coincide: one line,
                       its legend naming them all)
    loss_vs_tokens.png training loss against real tokens trained so far, all strategies
    loss_vs_time.png   training loss against training wall-clock time: the same curve, reached sooner
    lengths.png        corpus length histogram, padding fraction of each strategy annotated
    step_times.png     step-time distribution per strategy (warm-up excluded)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from padless._optional import require
from padless.bench.results import BenchResults

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Fixed colours for the known strategies, so every plot and every report agrees.
STRATEGY_COLORS = {
    "padding": "#7f7f7f",
    "bucketing": "#ff7f0e",
    "packing": "#1f77b4",
    "flattening": "#2ca02c",
}
_EXTRA_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _colors(names: list[str]) -> dict[str, str]:
    extra = itertools.cycle(_EXTRA_COLORS)
    return {n: STRATEGY_COLORS.get(n) or next(extra) for n in names}


def si_prefix(x: float) -> str:
    """12_345 -> '12.3k', 999.99 -> '1k'."""
    x = float(f"{x:.3g}")  # round first, so 999.99 does not print as 1e+03
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:g}{suffix}"
    return f"{x:g}"


def _figure(title: str) -> tuple[Figure, Axes]:
    Figure = require("matplotlib.figure", "the benchmark plots").Figure

    fig = Figure(figsize=(7.5, 4.5), dpi=110, layout="constrained")
    ax = fig.subplots()
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def _note_empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#a00")


def _note_missing(ax: Axes, x: float) -> None:
    """Mark category ``x`` as having no data (y in axes units, so it sits at the bottom)."""
    ax.text(x, 0.05, "no measured\nsteps", transform=ax.get_xaxis_transform(), ha="center", color="#a00")


# --- plots --------------------------------------------------------------------------------------


def plot_throughput(results: BenchResults, path: Path) -> Path:
    """Real and padded tokens/s per strategy (medians of per-step rates), the interquartile range of
    the per-step real tokens/s as an error bar; bar labels give the speedup over padding; a dashed
    line marks padding's real tokens/s times the ideal speedup (no compute spent on padding)."""
    figs, summary = results.figures(), results.summary()
    names = list(results.strategies)
    colors = _colors(names)
    fig, ax = _figure(f"Throughput by strategy ({results.config.model}, {results.environment.device})")
    ax.grid(axis="x", visible=False)
    hatched = spread = False  # each legend entry once
    for i, name in enumerate(names):
        real, padded = figs[name].real_tokens_per_s, figs[name].padded_tokens_per_s
        if real is None or padded is None:
            _note_missing(ax, i)
            continue
        # stacked: real tokens/s solid, the padding fed on top of it hatched (their sum: tokens fed/s)
        ax.bar(i, real, width=0.6, color=colors[name])
        ax.bar(
            i,
            padded - real,
            bottom=real,
            width=0.6,
            color="none",
            edgecolor=colors[name],
            hatch="//",
            linewidth=1,
            label="padding tokens fed / s" if padded > real and not hatched else None,
        )
        hatched = hatched or padded > real
        lo, hi = figs[name].real_tokens_per_s_p25, figs[name].real_tokens_per_s_p75
        if lo is not None and hi is not None:
            ax.errorbar(
                i,
                real,
                yerr=[[max(0.0, real - lo)], [max(0.0, hi - real)]],
                fmt="none",
                ecolor="k",
                capsize=4,
                linewidth=1,
                label=None if spread else "IQR of per-step real tokens/s",
            )
            spread = True
        speed = summary.speedup.get(name)
        label = f"{si_prefix(real)} real/s" + (f"\n×{speed:.2f}" if speed is not None else "")
        ax.annotate(
            label,
            (i, max(padded, hi or 0.0)),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85),
        )
    base = figs.get(summary.baseline)
    if summary.ideal_speedup is not None and base is not None and base.real_tokens_per_s is not None:
        ideal = base.real_tokens_per_s * summary.ideal_speedup
        ax.axhline(
            ideal,
            color="k",
            linestyle="--",
            linewidth=1,
            label=f"ideal: {summary.baseline} × {summary.ideal_speedup:.2f} (its tokens fed / real tokens)",
        )
    if summary.warnings:
        ax.text(
            0.99,
            0.98,
            f"{len(summary.warnings)} warning(s): read them above the table",
            transform=ax.transAxes,
            ha="right",
            va="top",
            color="#a00",
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xlabel("strategy (solid: real tokens/s, label: speedup over padding)")
    ax.set_ylabel("tokens per second")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.45)  # headroom for the legend above the labels
    ax.yaxis.set_major_formatter(lambda v, _: si_prefix(v))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize="small")
    fig.savefig(path)
    return path


LossAxis = Literal["step", "tokens", "time"]
_LOSS_TITLES = {
    "step": "Training loss per optimiser step",
    "tokens": "Training loss against real tokens trained",
    "time": "Training loss against training time",
}


def _coincide(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two curves' values agree to within what a plot can show (relative 1e-4)."""
    return len(a) == len(b) and all(abs(u - v) <= 1e-4 * max(abs(u), abs(v), 1e-12) for u, v in zip(a, b))


def loss_curves(results: BenchResults, x: LossAxis) -> list[tuple[list[str], list[float], list[float]]]:
    """The distinct loss curves of the strategies that ran steps, as ``(names, xs, loss)``: strategies
    whose curves coincide (same examples per step: the same losses, step by step) share one entry, so
    the plot draws one line and its legend names them all."""
    drawn: list[tuple[list[str], list[float], list[float]]] = []
    for name, run in results.strategies.items():
        if not run.loss:
            continue
        series = {"step": [1] * len(run.loss), "tokens": run.real_tokens, "time": run.step_time_s}[x]
        xs = [float(v) for v in itertools.accumulate(series)]
        same = next((d for d in drawn if _coincide(d[1], xs) and _coincide(d[2], run.loss)), None)
        if same is not None:
            same[0].append(name)
        else:
            drawn.append(([name], xs, list(run.loss)))
    return drawn


def plot_loss(results: BenchResults, path: Path, x: LossAxis) -> Path:
    """Training loss of every strategy on one chart, against the optimiser step (``x="step"``), the
    real tokens trained so far (``x="tokens"``) or the training wall-clock time so far (``x="time"``:
    the sum of step times, evaluation left out)."""
    if x not in _LOSS_TITLES:
        raise ValueError(f"x must be 'step', 'tokens' or 'time', got {x!r}")
    title = _LOSS_TITLES[x]
    fig, ax = _figure(title)
    colors = _colors(list(results.strategies))
    for name, run in results.strategies.items():
        if not run.loss:
            ax.plot([], [], label=f"{name} (no steps)", color=colors[name])
    for names, xs, loss in loss_curves(results, x):
        marker = "." if len(xs) < 40 else None
        label = names[0] if len(names) == 1 else " = ".join(names) + " (the same curve)"
        ax.plot(xs, loss, label=label, color=colors[names[0]], linewidth=1.4, marker=marker)
    if x == "step":
        ax.set_xlabel("optimiser step")
    elif x == "time":
        ax.set_xlabel("training time so far (s, sum of step times)")
    else:
        ax.set_xlabel("real (non-padding) tokens trained so far")
        ax.xaxis.set_major_formatter(lambda v, _: si_prefix(v))
    ax.set_ylabel("training loss (nats / token)")
    ax.legend(title="strategy")
    if not any(run.loss for run in results.strategies.values()):
        _note_empty(ax, "no steps recorded")
    fig.savefig(path)
    return path


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def plot_lengths(results: BenchResults, path: Path) -> Path:
    """Histogram of the corpus token lengths, ``max_length`` marked, padding fraction per strategy."""
    lengths = results.lengths
    fig, ax = _figure("Corpus token lengths")
    if lengths:
        mean = sum(lengths) / len(lengths)
        ax.hist(lengths, bins=min(60, max(5, len(set(lengths)))), color="#4c72b0", alpha=0.85)
        ax.set_title(f"Corpus token lengths (n = {len(lengths):,}, mean {mean:.1f}, max {max(lengths)})")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.45)  # headroom for the legend and the padding box
    else:
        _note_empty(ax, "no lengths recorded")
    ax.axvline(
        results.config.max_length,
        color="k",
        linestyle="--",
        linewidth=1,
        label=f"max_length = {results.config.max_length}",
    )
    lines = [f"{n}: {_percent(f.padding_fraction)}" for n, f in results.figures().items()]
    ax.text(
        0.98,
        0.95,
        "padding fraction\n" + "\n".join(lines),
        transform=ax.transAxes,
        ha="right",
        va="top",
        family="monospace",
        fontsize="small",
        bbox=dict(boxstyle="round", facecolor="white", alpha=0.9),
    )
    ax.set_xlabel("example length (tokens)")
    ax.set_ylabel("examples")
    ax.set_xlim(0, max([results.config.max_length, *lengths]) * 1.03)
    ax.legend(loc="upper left")
    fig.savefig(path)
    return path


def plot_step_times(results: BenchResults, path: Path) -> Path:
    """Box plot of step times per strategy over the steps after the warm-up, every step as a dot."""
    warm = results.config.warmup_steps
    fig, ax = _figure(f"Step time per optimiser step ({warm} warm-up step{'s' * (warm != 1)} excluded)")
    names = list(results.strategies)
    colors = _colors(names)
    data = [list(results.strategies[n].step_time_s[warm:]) for n in names]
    if any(data):
        box = ax.boxplot(
            [d or [float("nan")] for d in data],
            tick_labels=names,
            showfliers=False,
            patch_artist=True,
            widths=0.5,
            medianprops=dict(color="k"),
        )
        for patch, name in zip(box["boxes"], names):
            patch.set(facecolor=colors[name], alpha=0.35)
        for i, d in enumerate(data, start=1):
            offsets = [((k * 0.618) % 1 - 0.5) * 0.3 for k in range(len(d))]  # deterministic jitter
            ax.scatter([i + o for o in offsets], d, s=10, color=colors[names[i - 1]], zorder=3)
            if not d:
                _note_missing(ax, i)
    else:
        _note_empty(ax, "no steps after the warm-up")
    ax.set_xlabel("strategy")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(bottom=0)
    fig.savefig(path)
    return path


PLOTS = {
    "throughput": plot_throughput,
    "loss_vs_step": lambda r, p: plot_loss(r, p, "step"),
    "loss_vs_tokens": lambda r, p: plot_loss(r, p, "tokens"),
    "loss_vs_time": lambda r, p: plot_loss(r, p, "time"),
    "lengths": plot_lengths,
    "step_times": plot_step_times,
}
"""Plot name (file ``<name>.png``) -> function(results, path)."""
