"""The benchmark report, drawn from a ``results.json`` alone: ``report.html``, the terminal table, and
the ``padless report RESULTS.json [--out DIR]`` command that redraws them with the plots
(:mod:`padless.bench.plots`).

``report.html`` is one self-contained page: inline CSS, the plots embedded as base64 data URIs.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from padless.bench.figures import MIN_TIMED_STEPS, OVER_100, SYS_TIME_WARNING, StrategyFigures
from padless.bench.results import BenchResults, load_results

if TYPE_CHECKING:
    pass

# Fixed colours for the known strategies, so every plot and every report agrees.
from padless.bench.plots import PLOTS, si_prefix

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


COLUMN_TERMS = {
    "MFU": "model FLOPs utilisation: the FLOPs the model needs per second over the machine's measured peak",
    "sys/CPU": "kernel (system) CPU time as a share of all CPU time of the strategy's training phase; "
    "high means page faults or the allocator, not training",
    "of ideal": "the speedup over padding divided by the ideal one (padding's tokens fed / its real tokens)",
}
"""The terms of the table explained where they appear: a tooltip on the column in report.html and a
``term: meaning`` line under the table."""

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
            f"{si_prefix(results.peak_flops_per_s)}FLOP/s (GEMM {results.peak_gemm})"
        )
    notes.append(f"sys/CPU: {COLUMN_TERMS['sys/CPU']}")
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
    columns = "".join(
        f'<th title="{esc(COLUMN_TERMS[c])}">{esc(c)} ⓘ</th>' if c in COLUMN_TERMS else f"<th>{esc(c)}</th>"
        for c in summary_columns(results)
    )
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in summary_rows(results))
    head, paired = headline(results), paired_line(results)
    noisy = results.summary().headline_noise is not None  # no figure to stand out: a plain line
    banner = f'<p class="{"banner" if noisy else "headline"}">{esc(head)}</p>' if head else ""
    banner += f"<p>{esc(paired)}.</p>" if paired else ""
    banner += "".join(f'<p class="banner">{esc(n)}</p>' for n in warning_lines(results))
    terms = "".join(f"<li><b>{esc(t)}</b>: {esc(m)}</li>" for t, m in COLUMN_TERMS.items())
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
<ul class="note">{terms}</ul>
<p class="note">{other}. Padding is the fraction of fed tokens that were padding. Measured in one
run on the machine below.</p>
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
