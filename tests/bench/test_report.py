"""results.json schema (round trip, validation, derived figures) and the report drawn from it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import make_results
from padless.bench.figures import percentile, strategy_figures, summarize
from padless.bench.report import PLOTS, format_summary_table, write_report
from padless.bench.results import (
    BenchResults,
    StrategyRun,
    load_results,
    save_results,
    validate,
)
from padless.cli import main as cli_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_json_round_trip_is_lossless():
    results = make_results()
    again = BenchResults.from_json(results.to_json())
    assert again == results
    assert again.to_json() == results.to_json()


def test_complete_results_validate_clean_and_hold_derived_sections():
    data = json.loads(make_results().to_json())
    assert validate(data) == []
    assert set(data) == {
        "config",
        "environment",
        "strategies",
        "lengths",
        "summary",
        "status",
        "padless_version",
        "schema_version",
        "peak_flops_per_s",
        "peak_gemm",
    }
    assert set(data["strategies"]["packing"]["figures"]) >= {
        "step_time_median_s",
        "step_time_p90_s",
        "real_tokens_per_s",
        "padding_fraction",
    }
    assert data["summary"]["speedup"]["padding"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "path, expected",
    [
        (("config", "mode"), "config.mode: missing"),
        (("environment", "torch"), "environment.torch: missing"),
        (("strategies", "packing", "loss"), "strategies.packing.loss: missing"),
        (("strategies", "packing", "figures"), "strategies.packing.figures: missing"),
        (("summary",), "summary: missing"),
        (("status", "state"), "status.state: missing"),
        (("lengths",), "lengths: missing"),
        (("padless_version",), "padless_version: missing"),
    ],
)
def test_validate_names_a_missing_field(path, expected):
    data = json.loads(make_results().to_json())
    node = data
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    assert expected in validate(data)
    with pytest.raises(ValueError, match=expected.split(":")[0].replace(".", r"\.")):
        BenchResults.from_dict(data)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("config", "mode"), "fast", "config.mode: expected 'same-examples' or 'token-budget'"),
        (("config", "steps"), "6", "config.steps: expected int"),
        (("config", "steps"), True, "config.steps: expected int"),
        (("strategies", "padding", "loss", 2), "x", "strategies.padding.loss[2]: expected number"),
        (("strategies", "padding", "real_tokens", 0), 1.5, "strategies.padding.real_tokens[0]: expected int"),
        (("strategies", "padding", "eval_loss_end"), "4", "strategies.padding.eval_loss_end: expected number or null"),
        (("lengths",), {"a": 1}, "lengths: expected a list"),
    ],
)
def test_validate_names_an_ill_typed_field(path, value, expected):
    data = json.loads(make_results().to_json())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    problems = validate(data)
    assert any(p.startswith(expected) for p in problems), problems


def test_validate_catches_uneven_arrays_and_incomplete_complete_runs():
    data = json.loads(make_results().to_json())
    data["strategies"]["packing"]["loss"].pop()
    assert any("per-step arrays differ" in p for p in validate(data))
    data = json.loads(make_results().to_json())
    del data["strategies"]["bucketing"]
    assert "strategies.bucketing: missing, but status is complete" in validate(data)


def test_validate_refuses_a_newer_schema():
    data = json.loads(make_results().to_json())
    data["schema_version"] += 1
    assert validate(data) == [f"schema_version: {data['schema_version']} is newer than this padless reads (1)"]


def test_validate_of_non_object():
    assert validate([1, 2]) == ["results: expected an object, got list"]


def test_figures_are_derived_from_steps_with_warmup_left_out():
    run = StrategyRun(
        step_time_s=(9.0, 1.0, 2.0, 3.0, 4.0),
        loss=(1.0,) * 5,
        real_tokens=(999, 10, 20, 30, 40),
        padded_tokens=(1000, 20, 40, 60, 80),
        sequences=(9, 1, 1, 1, 1),
        peak_memory_bytes=None,
        memory_method="vmhwm",
        eval_loss_start=3.0,
        eval_loss_end=2.5,
    )
    f = strategy_figures(run, warmup_steps=1)
    assert (f.steps_done, f.measured_steps) == (5, 4)
    assert f.step_time_median_s == pytest.approx(2.5)
    assert f.step_time_p90_s == pytest.approx(3.7)
    # medians of the per-step rates 10/1, 20/2, 30/3, 40/4 (real) and 1/1, 1/2, 1/3, 1/4 (sequences)
    assert f.real_tokens_per_s == pytest.approx(10) and (f.real_tokens_per_s_p25, f.real_tokens_per_s_p75) == (10, 10)
    assert f.padded_tokens_per_s == pytest.approx(20)
    assert f.sequences_per_s == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert (f.step_time_p25_s, f.step_time_p75_s) == (pytest.approx(1.75), pytest.approx(3.25))
    assert f.padding_fraction == pytest.approx(1 - 1099 / 1200)  # over all steps, warm-up included
    assert f.eval_loss_delta == pytest.approx(-0.5)
    empty = strategy_figures(
        dataclasses.replace(run, step_time_s=(9.0,), loss=(1.0,), real_tokens=(1,), padded_tokens=(2,), sequences=(1,)),
        warmup_steps=3,
    )
    assert empty.step_time_median_s is None and empty.real_tokens_per_s is None
    assert empty.padding_fraction == pytest.approx(0.5)


def test_summary_speedups_and_ideal():
    results = make_results()
    s = summarize(results.strategies, warmup_steps=1)
    pad, pack = results.strategies["padding"], results.strategies["packing"]
    assert s.ideal_speedup == pytest.approx(sum(pad.padded_tokens) / sum(pad.real_tokens))
    tps = {
        n: float(np.median(np.array(r.real_tokens[1:]) / np.array(r.step_time_s[1:])))
        for n, r in results.strategies.items()
    }
    assert s.speedup["packing"] == pytest.approx(tps["packing"] / tps["padding"])
    assert s.eval_loss_end_vs_baseline["packing"] == pytest.approx(pack.eval_loss_end - pad.eval_loss_end)
    no_base = summarize({"packing": pack}, warmup_steps=1)
    assert no_base.speedup == {"packing": None} and no_base.ideal_speedup is None


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_load_results_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="no such results file"):
        load_results(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"config": ')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        load_results(bad)
    bad.write_text("[1]")
    with pytest.raises(ValueError, match="top level is a list"):
        load_results(bad)


# --- report -------------------------------------------------------------------------------------


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000, f"{path.name} is suspiciously small ({len(data)} bytes)"


def test_write_report_draws_every_plot_and_a_self_contained_page(tmp_path):
    results = make_results()
    paths = write_report(results, tmp_path)
    assert set(paths) == {*PLOTS, "html"}
    for name in PLOTS:
        _assert_png(paths[name])
    page = paths["html"].read_text()
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    assert "http://" not in page and "https://" not in page  # no external resources
    assert "<link" not in page and "<script" not in page
    assert '<table class="summary">' in page and "<td>packing</td>" in page
    assert "Test CPU &lt;x86&gt;" in page  # values are escaped
    assert "INTERRUPTED" not in page


def test_summary_table_lists_every_strategy():
    table = format_summary_table(make_results())
    lines = table.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("strategy ")) :]  # after the headline
    assert [line.split()[0] for line in lines[2:5]] == ["padding", "bucketing", "packing"]
    assert "ideal ×" in table and table.count("ideal ×") == 1  # one ideal, defined once


def test_interrupted_results_still_render(tmp_path):
    results = make_results(("padding", "packing"), interrupted_at=0)
    assert results.strategies["packing"].step_time_s == ()
    saved = save_results(results, tmp_path / "results.json")
    assert validate(json.loads(saved.read_text())) == []
    paths = write_report(saved, tmp_path / "report")
    for name in PLOTS:
        assert paths[name].read_bytes()[:8] == PNG_MAGIC
    page = paths["html"].read_text()
    assert "INTERRUPTED during packing after 0 step(s)" in page
    assert "n/a" in format_summary_table(results)


def test_cli_redraws_from_saved_json(tmp_path, capsys):
    results = make_results(("padding", "packing", "flattening"))
    saved = save_results(results, tmp_path / "run" / "results.json")
    assert cli_main(["report", str(saved), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "flattening" in out and "report.html" in out
    for name in PLOTS:
        _assert_png(tmp_path / "out" / f"{name}.png")
    assert cli_main(["report", str(saved)]) == 0  # default: beside the json
    assert (saved.parent / "report.html").is_file()


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such results file"), ("{", "not valid JSON"), ('{"config": {}}', "not a valid padless results file")],
)
def test_cli_bad_json_exits_2_with_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("padless report: error: ") and message in err


def test_a_file_without_a_later_defaulted_field_still_loads(tmp_path):
    """Fields added to the schema with a default (here config.world_size) may be absent from files
    written before them: the committed README run must stay readable."""
    import json
    from pathlib import Path

    from padless.bench.results import load_results, validate

    data = json.loads((Path(__file__).parents[2] / "docs" / "bench" / "results.json").read_text())
    data["config"].pop("world_size", None)
    assert validate(data) == []
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert load_results(path).config.world_size == 1
    del data["config"]["steps"]  # a field without a default is still required
    assert "config.steps: missing" in validate(data)


def test_flop_figures_mfu_and_the_ideal_from_flops():
    results = make_results(("padding", "bucketing", "packing", "flattening"))
    figs, s = results.figures(), results.summary()
    pad, pack = results.strategies["padding"], results.strategies["packing"]
    rate = float(np.median(np.array(pack.model_flops[1:]) / np.array(pack.step_time_s[1:])))
    assert figs["packing"].model_flops_per_s == pytest.approx(rate)
    assert figs["packing"].mfu == pytest.approx(rate / 1e9)
    assert figs["packing"].flops_per_real_token == pytest.approx(1e6)
    assert figs["packing"].flops_per_trained_token == pytest.approx(sum(pack.model_flops) / sum(pack.trained_tokens))
    assert figs["padding"].cpu_sys_fraction == pytest.approx(0.5 / 10.5)
    assert s.ideal_speedup == pytest.approx(sum(pad.padded_tokens) / sum(pad.real_tokens))
    assert s.fraction_of_ideal["packing"] == pytest.approx(s.speedup["packing"] / s.ideal_speedup)
    assert not hasattr(s, "ideal_speedup_flops")  # one ideal: the FLOP one left out the costs padding pays
    tps = {n: f.real_tokens_per_s for n, f in figs.items()}
    strongest = max((n for n in tps if n != "packing"), key=tps.get)
    assert s.strongest_baseline == strongest
    assert s.speedup_over_strongest == pytest.approx(tps["packing"] / tps[strongest])


def test_report_leads_with_the_speedup_over_the_strongest_baseline_and_shows_mfu(tmp_path):
    results = make_results(("padding", "bucketing", "packing", "flattening"))
    s = results.summary()
    table = format_summary_table(results)
    first = table.splitlines()[0]
    assert first.startswith(f"packing: ×{s.speedup_over_strongest:.2f} real tokens/s over {s.strongest_baseline}")
    header = next(line for line in table.splitlines() if line.startswith("strategy "))
    assert "MFU" in header and "measured peak 1GFLOP/s" in table
    assert "allocator: glibc-tuned" in table and "WARNING: kernel" not in table
    page = write_report(results, tmp_path)["html"].read_text()
    assert '<p class="headline">packing: ×' in page


def test_a_run_heavy_in_sys_time_says_so():
    results = make_results(sys_s=5.0)  # 5 s of 15 s CPU in the kernel
    table = format_summary_table(results)
    assert "WARNING: kernel (sys) time above 20% of CPU time for padding" in table
    assert "33.3% !" in table


def test_old_results_without_flop_counts_load_with_empty_flop_figures():
    data = json.loads(make_results().to_json())
    for run in data["strategies"].values():
        for key in (
            "trained_tokens",
            "model_flops",
            "executed_flops",
            "cpu_user_s",
            "cpu_sys_s",
            "max_rss_bytes",
            "allocator",
        ):
            del run[key]
        for key in ("mfu", "model_flops_per_s", "cpu_sys_fraction"):
            del run["figures"][key]
    for key in ("peak_flops_per_s", "peak_gemm"):
        del data[key]
    for key in ("strongest_baseline", "fraction_of_ideal"):
        del data["summary"][key]
    assert validate(data) == []
    results = BenchResults.from_dict(data)
    assert results.figures()["packing"].mfu is None and results.summary().ideal_speedup is not None
    assert "MFU" in format_summary_table(results)


def test_validate_catches_a_partial_flop_array():
    data = json.loads(make_results().to_json())
    data["strategies"]["packing"]["model_flops"].pop()
    assert any("per-step arrays differ" in p for p in validate(data))
