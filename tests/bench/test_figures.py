"""What the benchmark's figures claim and when they must not be believed (padless.bench.figures and
the report's wording): medians of per-step rates, the strongest baseline that ran, the warnings of
too few timed steps, of a speedup inside the spread and of an MFU or fraction of the ideal over
100%. All on synthetic step times: no training runs here."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from conftest import make_results
from padless.bench.figures import MIN_TIMED_STEPS, OVER_100, summarize
from padless.bench.report import format_summary_table, headline, render_html, summary_rows
from padless.bench.results import BenchResults, StrategyRun, load_results, save_results

BENCH = Path(__file__).parents[2] / "src" / "padless" / "bench"


def _run(times, real=100, padded=None, flops=None):
    """A strategy that trains ``real`` tokens per step (``padded`` fed) in the given step times."""
    n = len(times)
    padded = real if padded is None else padded
    return StrategyRun(
        step_time_s=tuple(times),
        loss=(1.0,) * n,
        real_tokens=(real,) * n,
        padded_tokens=(padded,) * n,
        sequences=(4,) * n,
        peak_memory_bytes=None,
        memory_method="vmhwm",
        eval_loss_start=2.0,
        eval_loss_end=1.5,
        trained_tokens=(real // 2,) * n,
        model_flops=(flops or 1e6 * real,) * n,
        executed_flops=(flops or 1e6 * padded,) * n,
    )


def _results(runs, warmup_steps=2, peak=1e12, mode="same-examples"):
    """make_results' config and machine around the given strategies."""
    base = make_results()
    steps = len(next(iter(runs.values())).step_time_s)
    config = dataclasses.replace(base.config, strategies=tuple(runs), steps=steps, warmup_steps=warmup_steps, mode=mode)
    status = dataclasses.replace(base.status, strategies_done=tuple(runs))
    return dataclasses.replace(base, config=config, strategies=runs, status=status, peak_flops_per_s=peak)


# padding at 1.0 s a step with jitter; packing 1.25x faster on every step (same examples per step)
PAD_TIMES = [2.0, 1.5, 1.00, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.00]
PACK_TIMES = [t / 1.25 for t in PAD_TIMES]


def test_one_slow_step_does_not_flip_the_headline():
    slow = list(PACK_TIMES)
    slow[5] *= 10  # a busy machine for one step
    runs = {"padding": _run(PAD_TIMES, padded=180), "packing": _run(slow)}
    totals = sum(PAD_TIMES[2:]) / sum(slow[2:])  # what a ratio of totals would report: packing "slower"
    assert totals < 1
    s = summarize(runs, warmup_steps=2)
    assert s.speedup_over_strongest == pytest.approx(1.25, rel=0.03) and s.strongest_baseline == "padding"
    assert s.paired_over_strongest.faster == 7 and s.paired_over_strongest.steps == 8
    assert not any("within the spread" in w for w in s.warnings)  # 7 of 8 steps faster: a measured difference
    text = format_summary_table(_results(runs))
    assert text.splitlines()[0].startswith("packing: ×1.2")


def test_six_steps_with_five_warm_up_warn_in_the_console_html_and_json(tmp_path):
    runs = {"padding": _run(PAD_TIMES[:6], padded=180), "packing": _run(PACK_TIMES[:6])}
    results = _results(runs, warmup_steps=5)
    assert results.figures()["packing"].measured_steps == 1 < MIN_TIMED_STEPS
    table = format_summary_table(results)
    assert "WARNING: too few timed steps for a speedup: padding 1, packing 1" in table
    assert '<p class="banner">WARNING: too few timed steps' in render_html(results, {})
    saved = save_results(results, tmp_path / "results.json")
    data = json.loads(saved.read_text())
    assert any(w.startswith("too few timed steps") for w in data["summary"]["warnings"])
    # redrawn from the json alone, the warning is still there
    assert "WARNING: too few timed steps" in format_summary_table(load_results(saved))
    assert any("too few" in w for w in BenchResults.from_json(saved.read_text()).summary().warnings)


def test_a_bench_of_six_steps_warns_before_it_runs():
    from padless.bench.config import RunConfig
    from padless.cli.bench import _before_the_run

    lines = _before_the_run(RunConfig(steps=6, strategies=("padding", "packing")))
    assert lines[1] == "tokenizer: gpt2 (vocab 50,257; the model's, gpt2-2layer)"
    assert lines[2].startswith("WARNING: 1 timed step(s) per strategy (--steps 6, --warmup-steps 5)")
    assert len(_before_the_run(RunConfig(steps=10, strategies=("padding", "packing")))) == 2


def test_an_mfu_over_100_percent_is_never_printed_as_a_figure():
    runs = {"padding": _run(PAD_TIMES, padded=180, flops=2e12), "packing": _run(PACK_TIMES, flops=2e12)}
    results = _results(runs, peak=1e12)  # 2 TFLOP in ~0.8 s on a 1 TFLOP/s machine: impossible
    assert results.figures()["packing"].mfu > 2
    rows = {r[0]: r for r in summary_rows(results)}
    for name in runs:  # the MFU column
        assert rows[name][8] == OVER_100.format(what="peak")
    table = format_summary_table(results)
    page = render_html(results, {})
    for text in (table, page):
        assert "250.0%" not in text and "200.0%" not in text
        assert "WARNING: MFU over 100%: padding (200%), packing (250%)" in text


def test_a_fraction_of_the_ideal_over_100_percent_is_flagged_not_printed():
    # padding feeds 110 tokens for 100 real (ideal x1.10), yet packing is x1.25 faster: a timing problem
    runs = {"padding": _run(PAD_TIMES, padded=110), "packing": _run(PACK_TIMES)}
    results = _results(runs)
    s = results.summary()
    assert s.ideal_speedup == pytest.approx(1.1) and s.fraction_of_ideal["packing"] > 1
    rows = {r[0]: r for r in summary_rows(results)}
    assert rows["packing"][-1] == OVER_100.format(what="ideal") and rows["padding"][-1] == "90.9%"
    table = format_summary_table(results)
    assert "113.6%" not in table and "WARNING: speedup over the ideal ×1.10" in table
    assert set(re.findall(r"ideal ×([\d.]+)", table)) == {"1.10"}  # one ideal, no second one from FLOPs
    assert "FLOPs (executed / needed)" not in table


@pytest.mark.parametrize("names, expected", [
    (("padding", "packing"), "packing: ×1.25 real tokens/s over padding (the only baseline run)."),
    (("padding", "bucketing", "packing"),
     "packing: ×1.25 real tokens/s over padding, the fastest of 2 baselines run (padding, bucketing)."),
    (("padding", "flattening", "packing"),
     "packing: ×1.19 real tokens/s over flattening, the fastest of 2 baselines run (padding, flattening); "
     "×1.25 over padding."),
])  # fmt: skip
def test_the_headline_names_the_strongest_baseline_that_ran(names, expected):
    times = {"padding": PAD_TIMES, "bucketing": [t * 1.1 for t in PAD_TIMES], "packing": PACK_TIMES,
             "flattening": [t / 1.05 for t in PAD_TIMES]}  # fmt: skip
    results = _results({n: _run(times[n], padded=180) for n in names})
    line = headline(results)
    assert line.startswith(expected)
    assert "strongest baseline" not in line
    # in-process runs (no allocator recorded) say so
    assert line.endswith(
        "Same examples per step, same LM-head work; the strategies run one after another in one process."
    )


def test_a_speedup_inside_the_spread_warns():
    # packing as fast as padding give or take the jitter: faster in half the steps
    jitter = [1.0, 1.0, 1.05, 0.95, 1.04, 0.96, 1.03, 0.97, 1.02, 0.98]
    runs = {"padding": _run(PAD_TIMES, padded=180), "packing": _run([a * b for a, b in zip(PAD_TIMES, jitter)])}
    s = summarize(runs, warmup_steps=2)
    noisy = [w for w in s.warnings if "within the spread" in w]
    assert len(noisy) == 1 and "packing over padding" in noisy[0] and "faster in 4 of 8 steps" in noisy[0]


def test_a_speedup_inside_the_spread_is_no_headline():
    """Within the noise the headline says the run cannot rank them (no bold figure); clear of it, a figure."""
    jitter = [1.0, 1.0, 1.05, 0.95, 1.04, 0.96, 1.03, 0.97, 1.02, 0.98]
    noisy = _results(
        {"padding": _run(PAD_TIMES, padded=180), "packing": _run([a * b for a, b in zip(PAD_TIMES, jitter)])}
    )
    clear = _results({"padding": _run(PAD_TIMES, padded=180), "packing": _run(PACK_TIMES)})
    assert headline(noisy).startswith("too noisy to rank packing against padding: packing over padding")
    assert headline(clear).startswith("packing: ×")
    assert '<p class="headline">' not in render_html(noisy, {}) and '<p class="headline">' in render_html(clear, {})


def test_token_budget_mode_compares_the_spreads_of_the_two_strategies():
    """Different examples per step: no step-by-step pairing; the per-step tokens/s ranges must not overlap."""
    apart = {"padding": _run(PAD_TIMES, padded=180), "packing": _run(PACK_TIMES)}
    close = {"padding": _run(PAD_TIMES, padded=180), "packing": _run([t / 1.01 for t in reversed(PAD_TIMES)])}
    assert summarize(apart, 2, same_examples=False).paired_over_strongest is None
    assert not any("within the spread" in w for w in summarize(apart, 2, same_examples=False).warnings)
    assert any("real tokens/s IQR" in w for w in summarize(close, 2, same_examples=False).warnings)


def test_the_help_of_bench_shows_every_default():
    from padless.cli import build_parser

    parser = build_parser(["bench"])
    bench = parser._subparsers._group_actions[0].choices["bench"]
    for action in bench._actions:
        if action.option_strings and action.option_strings[0] != "-h":
            assert "default" in (action.help or ""), action.option_strings
    assert "--tokenizer" in bench.format_help() and "(default: 120)" in bench.format_help()


# --- the module graph -----------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """padless.bench modules a file imports anywhere, ``if TYPE_CHECKING:`` blocks included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("padless.bench."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("padless.bench."))
    return out


def test_no_bench_module_imports_another_that_imports_it_back():
    """Stricter than tests/test_structure.py: a type-only import counts too, so figures (the derived
    figures) cannot lean on results (the file that holds them) again."""
    graph = {p.stem: _imports(p) - {p.stem} for p in BENCH.glob("*.py") if p.stem != "__init__"}
    assert graph["results"] >= {"figures"} and graph["figures"] == set()

    def reach(start: str, seen: set[str]) -> set[str]:
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen

    cycles = sorted(name for name in graph if name in reach(name, set()))
    assert cycles == [], f"bench modules on an import cycle: {cycles}"


def test_coinciding_loss_curves_draw_as_one_line_naming_them_all():
    from padless.bench.plots import loss_curves

    other = dataclasses.replace(_run(PAD_TIMES), loss=(1.0,) * 9 + (0.9,))
    results = _results({"padding": _run(PAD_TIMES, padded=180), "packing": _run(PACK_TIMES), "bucketing": other})
    assert [names for names, _, _ in loss_curves(results, "step")] == [["padding", "packing"], ["bucketing"]]
    assert len(loss_curves(results, "time")) == 3  # the same losses, reached at different times
