"""The benchmark report, drawn from a ``results.json`` alone: PNG plots, ``report.html``, a terminal
table, and the ``padless report RESULTS.json [--out DIR]`` command that redraws them.

Plots (matplotlib, drawn on ``Figure`` objects with the Agg canvas, so no pyplot state and no
display are involved):

    throughput.png     real tokens/s per strategy, speedup over padding, the ideal speedup marked
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
from padless.bench.figures import SYS_TIME_WARNING, StrategyFigures
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
    """Real and padded tokens/s per strategy; bar labels give the speedup over padding; a dashed
    line marks padding's real tokens/s times the ideal speedup (no compute spent on padding)."""
    figs, summary = results.figures(), results.summary()
    names = list(results.strategies)
    colors = _colors(names)
    fig, ax = _figure(f"Throughput by strategy ({results.config.model}, {results.environment.device})")
    ax.grid(axis="x", visible=False)
    for i, name in enumerate(names):
        real, padded = figs[name].real_tokens_per_s, figs[name].padded_tokens_per_s
        if real is None or padded is None:
            _note_missing(ax, i)
            continue
        # stacked: real tokens/s solid, the padding fed on top of it hatched (their sum: tokens fed/s)
        ax.bar(i, real, width=0.6, color=colors[name])
        ax.bar(i, padded - real, bottom=real, width=0.6, color="none", edgecolor=colors[name], hatch="//",
               linewidth=1, label="padding tokens fed / s" if not ax.get_legend_handles_labels()[0] else None)
        speed = summary.speedup.get(name)
        label = f"{_si(real)} real/s" + (f"\n×{speed:.2f}" if speed is not None else "")
        ax.annotate(label, (i, padded), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85))
    base = figs.get(summary.baseline)
    if summary.ideal_speedup is not None and base is not None and base.real_tokens_per_s is not None:
        ideal = base.real_tokens_per_s * summary.ideal_speedup
        ax.axhline(ideal, color="k", linestyle="--", linewidth=1,
                   label=f"ideal: {summary.baseline} × {summary.ideal_speedup:.2f} (padded / real tokens)")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xlabel("strategy (solid: real tokens/s, label: speedup over padding)")
    ax.set_ylabel("tokens per second")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.yaxis.set_major_formatter(lambda v, _: _si(v))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize="small")
    fig.savefig(path)
    return path


LossAxis = Literal["step", "tokens", "time"]
_LOSS_TITLES = {"step": "Training loss per optimiser step", "tokens": "Training loss against real tokens trained",
                "time": "Training loss against training time"}


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
    ax.axvline(results.config.max_length, color="k", linestyle="--", linewidth=1,
               label=f"max_length = {results.config.max_length}")
    lines = [f"{n}: {_pct(f.padding_fraction)}" for n, f in results.figures().items()]
    ax.text(0.98, 0.95, "padding fraction\n" + "\n".join(lines), transform=ax.transAxes, ha="right", va="top",
            family="monospace", fontsize="small", bbox=dict(boxstyle="round", facecolor="white", alpha=0.9))
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
        box = ax.boxplot([d or [float("nan")] for d in data], tick_labels=names, showfliers=False,
                         patch_artist=True, widths=0.5, medianprops=dict(color="k"))
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


SUMMARY_COLUMNS = ("strategy", "steps", "median step", "p90 step", "real tok/s", "padded tok/s", "padding",
                   "seq/s", "MFU", "sys/CPU", "peak memory", "eval loss start -> end", "speedup", "of ideal")


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
        rows.append((
            name,
            steps,
            _num(f.step_time_median_s, "{:.3f} s"),
            _num(f.step_time_p90_s, "{:.3f} s"),
            _num(f.real_tokens_per_s, "{:,.0f}"),
            _num(f.padded_tokens_per_s, "{:,.0f}"),
            _pct(f.padding_fraction),
            _num(f.sequences_per_s, "{:.2f}"),
            _pct(f.mfu) if f.mfu is None or f.mfu >= 0.001 else f"{100 * f.mfu:.2f}%",
            _pct(f.cpu_sys_fraction) + (" !" if (f.cpu_sys_fraction or 0) > SYS_TIME_WARNING else ""),
            _bytes(run.peak_memory_bytes),
            evals,
            _num(summary.speedup.get(name), "×{:.2f}"),
            _pct(summary.fraction_of_ideal.get(name)),
        ) + (_compile_cells(f, run) if extra else ()))
    return rows


def _compile_cells(f: StrategyFigures, run: Any) -> tuple[str, str]:
    """steady tok/s and ``frames (recompiles), seconds`` of a compiled strategy (n/a if eager)."""
    c = run.compiled
    if c is None:
        return "n/a", "eager"
    return (_num(f.steady_real_tokens_per_s, "{:,.0f}"),
            f"{c.mode}: {c.frames} frames ({c.recompiles} recompiles), {c.compile_s:.1f} s")


MEMORY_METHOD_NOTES = {
    "accelerator-max-allocated": "accelerator memory allocated by tensors, peak per strategy",
    "vmhwm": "process peak RSS (kernel high-water mark, reset per strategy)",
    "statm-sampler": "process RSS sampled every few ms, peak per strategy",
    "ru_maxrss": "process peak RSS over the whole run (not reset per strategy)",
}


def headline(results: BenchResults) -> str | None:
    """``packing: ×1.85 real tokens/s over bucketing, the strongest baseline`` (``None`` without
    packing or any other strategy measured)."""
    summary = results.summary()
    if summary.speedup_over_strongest is None:
        return None
    isolated = all(run.allocator for run in results.strategies.values())
    return (f"packing: ×{summary.speedup_over_strongest:.2f} real tokens/s over {summary.strongest_baseline}, "
            f"the strongest baseline (same examples, same LM-head work"
            f"{', each strategy in its own process' if isolated else ''})")


def _notes(results: BenchResults) -> list[str]:
    """Lines under the table: speedups, MFU's peak, CPU time, memory method, allocator, interruption."""
    summary, status, figs = results.summary(), results.status, results.figures()
    notes = [line for line in [headline(results)] if line]
    notes.append(f"speedup: real tokens/s over {summary.baseline}; ideal speedup (padded / real tokens of "
                 f"{summary.baseline}): {_num(summary.ideal_speedup, '×{:.2f}')}; from FLOPs (executed / needed): "
                 f"{_num(summary.ideal_speedup_flops, '×{:.2f}')}, 'of ideal' is each speedup over it")
    if results.peak_flops_per_s:
        notes.append(f"MFU: model FLOPs/s (padless/bench/flops.py) over the measured peak "
                     f"{_si(results.peak_flops_per_s)}FLOP/s (GEMM {results.peak_gemm})")
    heavy = [n for n, f in figs.items() if (f.cpu_sys_fraction or 0) > SYS_TIME_WARNING]
    if heavy:
        notes.append(f"WARNING: kernel (sys) time above {SYS_TIME_WARNING:.0%} of CPU time for {', '.join(heavy)}: "
                     "the run spent its time in page faults or the allocator, not in training")
    if _compiled(results):
        notes.append("compiled: decoder layers under torch.compile (padless.compile_layers); 'real tok/s' includes "
                     "the steps after the warm-up that compiled, 'steady tok/s' leaves out every step that compiled; "
                     "'compiled' gives dynamo frames compiled (of them recompiles) and seconds spent compiling")
    allocators = sorted({run.allocator for run in results.strategies.values() if run.allocator})
    if allocators:
        notes.append("each strategy in its own process; allocator: " + ", ".join(allocators))
    methods = sorted({run.memory_method for run in results.strategies.values()})
    if methods:
        notes.append("peak memory: " + "; ".join(MEMORY_METHOD_NOTES.get(m, m) for m in methods))
    if status.state != "complete":
        notes.append(f"INTERRUPTED during {status.interrupted_strategy!s} after {status.interrupted_at_step} "
                     f"step(s); strategies finished: {', '.join(status.strategies_done) or 'none'}")
    return notes


def text_table(rows: Sequence[Sequence[str]], left_columns: int = 1) -> list[str]:
    """Rows of cells (the first is the header) as aligned plain-text lines, a dashed rule under the
    header; the first ``left_columns`` columns left-aligned, the rest right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < left_columns else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_summary_table(results: BenchResults) -> str:
    """The summary as a plain-text table (for the terminal), followed by the notes."""
    lines = text_table([summary_columns(results), *summary_rows(results)])
    head = headline(results)
    notes = [n for n in _notes(results) if n != head]
    return "\n".join([*([head, ""] if head else []), *lines, "", *notes])


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
    notes = _notes(results)
    head = headline(results)
    alarm = ("INTERRUPTED", "WARNING")
    banner = "".join(f'<p class="banner">{esc(n)}</p>' for n in notes if n.startswith(alarm))
    banner += f'<p class="headline">{esc(head)}</p>' if head else ""
    other = ". ".join(esc(n) for n in notes if not n.startswith(alarm) and n != head)
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
<p class="note">{other}. Timing figures leave out {cfg.warmup_steps} warm-up step(s); padding is the
fraction of fed tokens that were padding. Measured side by side in one run on the machine below.</p>
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


def write_report(
    results: BenchResults | str | os.PathLike[str], out_dir: str | os.PathLike[str]
) -> dict[str, Path]:
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
