"""benchmarks/vlm.py on the tiny Qwen2-VL: every strategy is checked against padding before timing, timed, and
written to the results JSON with figures that follow from the same records (same real tokens, bucketing
never feeds more positions than padding, per-document attention never costs more than the 4D mask)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "vlm.py"
TINY = ["--size", "tiny", "--records", "12", "--records-per-step", "4", "--batch-size", "2", "--threads", "1"]
STRATEGIES = ["padding", "bucketing", "packing", "packing-sdpa"]


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, *flags], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.slow
def test_every_strategy_is_checked_timed_and_written(tmp_path):
    out = tmp_path / "results.json"
    done = _run("--max-length", "256", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "-> ok (loss tolerance 1e-05)" in done.stdout, done.stdout
    result = json.loads(out.read_text())
    assert result["timed_steps"] == 2 and list(result["strategies"]) == STRATEGIES
    assert len(result["real_text_tokens_per_step"]) == 2 and all(n > 0 for n in result["vision_patches_per_step"])
    text, patches = result["real_text_tokens_per_step"], result["vision_patches_per_step"]
    runs = result["strategies"]
    padding = runs["padding"]
    assert padding["speedup_vs_padding"] == 1.0 and padding["flop_ideal"] == 1.0
    for name in STRATEGIES:
        r = runs[name]
        assert len(r["step_times_s"]) == 2 and len(r["losses"]) == 3
        assert abs(r["loss_first_step"] - padding["loss_first_step"]) <= 1e-5 * abs(padding["loss_first_step"])
        real = [(a + b) / t for a, b, t in zip(text, patches, r["step_times_s"])]
        assert r["real_tokens_per_s"] == pytest.approx(statistics.median(real))
        assert 0 <= r["padding_fraction"] < 1 and r["median_step_s"] > 0
    # 4 records per step in micro-batches of 2: sorted pairs never pad more than the same records in any order
    assert runs["bucketing"]["text_positions_fed"] <= padding["text_positions_fed"]
    # the same rows: per-document blocks (padless cu_seq_lens) never cost more than one causal block per row
    assert runs["packing"]["text_positions_fed"] == runs["packing-sdpa"]["text_positions_fed"]
    assert runs["packing"]["flop_ideal"] >= runs["packing-sdpa"]["flop_ideal"]
    assert result["max_loss_difference_relative"] < 1e-3
    assert f"| packing | {runs['packing']['median_step_s']:.2f} |" in done.stdout


def test_rows_shorter_than_a_record_are_refused_naming_the_flag(tmp_path):
    done = _run("--max-length", "16", "--out", str(tmp_path / "r.json"))
    assert done.returncode != 0 and "--max-length 16 is shorter than the longest record" in done.stderr
    assert not (tmp_path / "r.json").exists()
