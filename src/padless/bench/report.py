"""The benchmark report, drawn from a ``results.json`` alone: PNG plots, ``report.html``, a terminal
table, and the ``padless report RESULTS.json [--out DIR]`` command that redraws them.

Plots (matplotlib, drawn on ``Figure`` objects with the Agg canvas, so no pyplot state and no
display are involved):

    throughput.png     real tokens/s per strategy with its spread, speedup over padding, the ideal marked
    loss_vs_step.png   training loss per optimiser step, all strategies
    loss_vs_tokens.png training loss against real tokens trained so far, all strategies
    loss_vs_time.png   training loss against training wall-clock time: the same curve, reached sooner
    lengths.png        corpus length histogram, padding fraction of each strategy annotated
    step_times.png     step-time distribution per strategy (warm-up excluded)

``report.html`` is one self-contained page: inline CSS, the plots embedded as base64 data URIs.
"""

from __future__ import annotations

import base64
import html
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from padless._optional import require
from padless.bench.figures import MIN_TIMED_STEPS, OVER_100, SYS_TIME_WARNING, StrategyFigures
from padless.bench.results import BenchResults, load_results

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


def _si(x: float) -> str:
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
        label = f"{_si(real)} real/s" + (f"\n×{speed:.2f}" if speed is not None else "")
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
            f"{len(summary.warnings)} warning(s): see report.html",
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
    ax.yaxis.set_major_formatter(lambda v, _: _si(v))
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
            continue
        series = {"step": [1] * len(run.loss), "tokens": run.real_tokens, "time": run.step_time_s}[x]
        xs = list(itertools.accumulate(series))
        marker = "." if len(xs) < 40 else None
        ax.plot(xs, run.loss, label=name, color=colors[name], linewidth=1.4, marker=marker)
    if x == "step":
        ax.set_xlabel("optimiser step")
    elif x == "time":
        ax.set_xlabel("training time so far (s, sum of step times)")
    else:
        ax.set_xlabel("real (non-padding) tokens trained so far")
        ax.xaxis.set_major_formatter(lambda v, _: _si(v))
    ax.set_ylabel("training loss (nats / token)")
    ax.legend(title="strategy")
    if not any(run.loss for run in results.strategies.values()):
        _note_empty(ax, "no steps recorded")
    fig.savefig(path)
    return path


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
    lines = [f"{n}: {_pct(f.padding_fraction)}" for n, f in results.figures().items()]
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


# --- tables -------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


SUMMARY_COLUMNS = (
    "strategy",
    "steps",
    "timed",
    "median step (IQR)",
    "real tok/s (IQR)",
    "padded tok/s",
    "padding",
    "seq/s",
    "MFU",
    "sys/CPU",
    "peak memory",
    "eval loss start -> end",
    "speedup",
    "of ideal",
)


COMPILE_COLUMNS = ("steady tok/s", "compiled")
"""Columns added when the run compiled its layers (``--compile``)."""


def summary_columns(results: BenchResults) -> tuple[str, ...]:
    """:data:`SUMMARY_COLUMNS`, plus :data:`COMPILE_COLUMNS` for a compiled run."""
    return SUMMARY_COLUMNS + (COMPILE_COLUMNS if _compiled(results) else ())


def _compiled(results: BenchResults) -> bool:
    return any(run.compiled is not None for run in results.strategies.values())


def summary_rows(results: BenchResults) -> list[tuple[str, ...]]:
    """One row of :data:`SUMMARY_COLUMNS` per strategy, as display strings (and
    :data:`COMPILE_COLUMNS` for a compiled run)."""
    extra = _compiled(results)
    figs, summary = results.figures(), results.summary()
    rows = []
    for name, run in results.strategies.items():
        f: StrategyFigures = figs[name]
        steps = f"{f.steps_done}/{results.config.steps}"
        evals = f"{_num(run.eval_loss_start)} -> {_num(run.eval_loss_end)}"
        rows.append(
            (
                name,
                steps,
                str(f.measured_steps) + (" !" if f.measured_steps < MIN_TIMED_STEPS else ""),
                _num(f.step_time_median_s, "{:.3f} s") + _spread(f.step_time_p25_s, f.step_time_p75_s, "{:.3f}"),
                _num(f.real_tokens_per_s, "{:,.0f}")
                + _spread(f.real_tokens_per_s_p25, f.real_tokens_per_s_p75, "{:,.0f}"),
                _num(f.padded_tokens_per_s, "{:,.0f}"),
                _pct(f.padding_fraction),
                _num(f.sequences_per_s, "{:.2f}"),
                _fraction(f.mfu, "peak"),
                _pct(f.cpu_sys_fraction) + (" !" if (f.cpu_sys_fraction or 0) > SYS_TIME_WARNING else ""),
                _bytes(run.peak_memory_bytes),
                evals,
                _num(summary.speedup.get(name), "×{:.2f}"),
                _fraction(summary.fraction_of_ideal.get(name), "ideal"),
            )
            + (_compile_cells(f, run) if extra else ())
        )
    return rows


def _spread(lo: float | None, hi: float | None, fmt: str) -> str:
    """`` (lo-hi)``, the interquartile range beside a median; nothing when unmeasured."""
    return "" if lo is None or hi is None else f" ({fmt.format(lo)}-{fmt.format(hi)})"


def _fraction(x: float | None, what: str) -> str:
    """A fraction that cannot exceed 1 (MFU, of ideal) as a percentage; above 1 a measurement is
    wrong, so it is shown as :data:`OVER_100`, never as a figure."""
    if x is not None and x > 1.0:
        return OVER_100.format(what=what)
    return _pct(x) if x is None or x >= 0.001 else f"{100 * x:.2f}%"


def _compile_cells(f: StrategyFigures, run: Any) -> tuple[str, str]:
    """steady tok/s and ``frames (recompiles), seconds`` of a compiled strategy (n/a if eager)."""
    c = run.compiled
    if c is None:
        return "n/a", "eager"
    return (
        _num(f.steady_real_tokens_per_s, "{:,.0f}"),
        f"{c.mode}: {c.frames} frames ({c.recompiles} recompiles), {c.compile_s:.1f} s",
    )


MEMORY_METHOD_NOTES = {
    "accelerator-max-allocated": "accelerator memory allocated by tensors, peak per strategy",
    "vmhwm": "process peak RSS (kernel high-water mark, reset per strategy)",
    "statm-sampler": "process RSS sampled every few ms, peak per strategy",
    "ru_maxrss": "process peak RSS over the whole run (not reset per strategy)",
}


def _how_measured(results: BenchResults) -> str:
    """How the strategies were timed against each other, for the headline."""
    cfg = results.config
    same = "same examples per step" if cfg.mode == "same-examples" else "same token budget per step"
    lm_head = ", same LM-head work" if not cfg.full_logits else ""
    isolated = all(run.allocator for run in results.strategies.values())
    if isolated and cfg.world_size == 1:
        how = (
            "each strategy in its own process, the processes stepped in turn (step i of every strategy, then step i+1)"
        )
    else:
        how = "the strategies run one after another in one process"
    return f"{same.capitalize()}{lm_head}; {how}."


def headline(results: BenchResults) -> str | None:
    """``packing: ×1.08 real tokens/s over bucketing, the fastest of 3 baselines run (padding, bucketing,
    flattening); ×1.41 over padding. ...``: the strongest baseline that ran, by the same median
    measure, and how it was measured; ``None`` without packing or any other strategy measured. When
    the speedup lies within the spread of the step times (``Summary.headline_noise``) it says the run
    was too noisy to rank them instead of giving a figure."""
    s = results.summary()
    if s.speedup_over_strongest is None or s.strongest_baseline is None:
        return None
    strongest = s.strongest_baseline
    if s.headline_noise is not None:
        return (
            f"too noisy to rank packing against {strongest}: {s.headline_noise} (the spread holds ×1.00; "
            f"medians ×{s.speedup_over_strongest:.2f}). {_how_measured(results)}"
        )
    if len(s.baselines_run) == 1:
        who = f"{strongest} (the only baseline run)"
    else:
        who = f"{strongest}, the fastest of {len(s.baselines_run)} baselines run ({', '.join(s.baselines_run)})"
    over_base = s.speedup.get("packing")
    also = f"; ×{over_base:.2f} over {s.baseline}" if strongest != s.baseline and over_base is not None else ""
    return f"packing: ×{s.speedup_over_strongest:.2f} real tokens/s over {who}{also}. {_how_measured(results)}"


def paired_line(results: BenchResults) -> str | None:
    """Packing against the strongest baseline step by step (same-examples mode), or ``None``."""
    s = results.summary()
    p = s.paired_over_strongest
    if p is None:
        return None
    spread = f"×{p.ratio_p25:.2f}-×{p.ratio_p75:.2f} IQR"
    if p.ratio_min is not None and p.ratio_max is not None:
        spread = f"min ×{p.ratio_min:.2f}, {spread}, median ×{p.ratio_median:.2f}, max ×{p.ratio_max:.2f}"
    return (
        f"packing's step was faster than {s.strongest_baseline}'s in {p.faster} of {p.steps} timed steps "
        f"(the same examples in both; per-step speedup {spread})"
    )


def warning_lines(results: BenchResults) -> list[str]:
    """``WARNING: ...`` for every warning of the summary, and for an interrupted run."""
    status = results.status
    lines = [f"WARNING: {w}" for w in results.summary().warnings]
    if status.state != "complete":
        lines.insert(
            0,
            f"INTERRUPTED during {status.interrupted_strategy!s} after {status.interrupted_at_step} "
            f"step(s); strategies finished: {', '.join(status.strategies_done) or 'none'}",
        )
    return lines


def _notes(results: BenchResults) -> list[str]:
    """Lines under the table: what each figure is (stated once), MFU's peak, the processes, memory."""
    summary, cfg = results.summary(), results.config
    ideal = summary.ideal_speedup
    notes = [
        f"real tok/s: the median over the timed steps ({cfg.warmup_steps} warm-up step(s) left out) of each step's "
        "real (non-padding) tokens / its time, so one slow step cannot move it; (IQR): the 25th-75th percentile "
        "of the same per-step values; padded tok/s, seq/s and MFU are medians the same way",
        f"speedup: real tok/s over {summary.baseline}'s; ideal "
        + (
            f"×{ideal:.2f}: {summary.baseline}'s tokens fed / its real tokens, the speedup if padding cost nothing "
            "and every cost scaled with the tokens fed (a bound: the LM head runs on trained tokens only); "
            "of ideal: speedup / ideal"
            if ideal is not None
            else f"n/a ({summary.baseline} not run)"
        ),
    ]
    if results.peak_flops_per_s:
        notes.append(
            f"MFU: model FLOPs/s (padless/bench/flops.py) over the measured peak "
            f"{_si(results.peak_flops_per_s)}FLOP/s (GEMM {results.peak_gemm})"
        )
    if _compiled(results):
        notes.append(
            "compiled: decoder layers under torch.compile (padless.compile_layers); 'real tok/s' is the "
            "median over every timed step, those that compiled included; 'steady tok/s' leaves out every "
            "step that compiled; 'compiled' gives dynamo frames compiled (of them recompiles) and seconds "
            "spent compiling"
        )
    allocators = sorted({run.allocator for run in results.strategies.values() if run.allocator})
    if allocators:
        notes.append(
            "each strategy in its own process, the processes stepped in turn (one step at a time, so load "
            "on the machine falls on all alike); allocator: " + ", ".join(allocators)
        )
    methods = sorted({run.memory_method for run in results.strategies.values()})
    if methods:
        notes.append("peak memory: " + "; ".join(MEMORY_METHOD_NOTES.get(m, m) for m in methods))
    return notes


def text_table(rows: Sequence[Sequence[str]], left_columns: int = 1) -> list[str]:
    """Rows of cells (the first is the header) as aligned plain-text lines, a dashed rule under the
    header; the first ``left_columns`` columns left-aligned, the rest right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i < left_columns else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_summary_table(results: BenchResults) -> str:
    """The summary for the terminal: the headline (and packing's step-by-step comparison), the
    warnings, the table, then what the figures are."""
    lines = text_table([summary_columns(results), *summary_rows(results)])
    top = [line for line in (headline(results), paired_line(results)) if line] + warning_lines(results)
    return "\n".join([*top, *([""] if top else []), *lines, "", *_notes(results)])


# --- html ---------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; } th { background: #f3f3f3; }
table.summary td { text-align: right; } table.summary td:first-child, table.kv th { text-align: left; }
.headline { font-size: 1.25em; font-weight: 600; margin: 0.8em 0; }
.banner { background: #fde2e2; border: 1px solid #d33; padding: 0.6em 1em; }
.note { color: #555; font-size: 0.9em; } img { max-width: 100%; display: block; margin: 0.8em 0; }
"""


def _kv_table(obj: dict[str, Any]) -> str:
    cells = ""
    for key, value in obj.items():
        text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        cells += f"<tr><th>{html.escape(str(key))}</th><td>{html.escape(text)}</td></tr>"
    return f'<table class="kv">{cells}</table>'


def render_html(results: BenchResults, images: dict[str, bytes]) -> str:
    """The report page: status, summary table, plots (PNG bytes embedded as data URIs), config and
    environment. Every value from the results file is HTML-escaped."""
    import dataclasses

    esc = html.escape
    columns = "".join(f"<th>{esc(c)}</th>" for c in summary_columns(results))
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in summary_rows(results))
    head, paired = headline(results), paired_line(results)
    noisy = results.summary().headline_noise is not None  # no figure to stand out: a plain line
    banner = f'<p class="{"banner" if noisy else "headline"}">{esc(head)}</p>' if head else ""
    banner += f"<p>{esc(paired)}.</p>" if paired else ""
    banner += "".join(f'<p class="banner">{esc(n)}</p>' for n in warning_lines(results))
    other = ". ".join(esc(n) for n in _notes(results))
    imgs = "".join(
        f'<img alt="{esc(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        for name, png in images.items()
    )
    cfg = results.config
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>padless bench: {esc(cfg.model)}</title>
<style>{_CSS}</style></head><body>
<h1>padless bench: {esc(cfg.model)} on {esc(cfg.data)}
({esc(cfg.mode)}, {esc(results.environment.device_name)})</h1>
{banner}
<h2>Summary</h2>
<table class="summary"><thead><tr>{columns}</tr></thead><tbody>{body}</tbody></table>
<p class="note">{other}. Padding is the fraction of fed tokens that were padding. Measured side by
side in one run on the machine below.</p>
<h2>Plots</h2>
{imgs}
<h2>Configuration</h2>
{_kv_table(dataclasses.asdict(cfg))}
<h2>Environment</h2>
{_kv_table(dataclasses.asdict(results.environment))}
<p class="note">padless {esc(results.padless_version)}, results schema {results.schema_version},
status {esc(results.status.state)}.</p>
</body></html>
"""


# --- entry points -------------------------------------------------------------------------------


def write_report(results: BenchResults | str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Draw every plot of :data:`PLOTS` as ``<name>.png`` and ``report.html`` into ``out_dir``, from
    a results object or the path of a results.json. Returns ``{plot name or "html": path}``."""
    if not isinstance(results, BenchResults):
        results = load_results(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: draw(results, out / f"{name}.png") for name, draw in PLOTS.items()}
    html_path = out / "report.html"
    page = render_html(results, {name: p.read_bytes() for name, p in paths.items()})
    html_path.write_text(page, encoding="utf-8")
    return {**paths, "html": html_path}
