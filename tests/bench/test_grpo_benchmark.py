"""benchmarks/grpo.py on the tiny Llama: the layouts agree before timing and every layout's line is printed,
for both length sets, full fine-tuning and LoRA; a tolerance the layouts cannot meet stops it before timing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "grpo.py"
TINY = [
    "--model",
    "tiny-llama",
    "--threads",
    "1",
    "--groups",
    "2",
    "--group-size",
    "3",
    "--max-prompt",
    "48",
    "--max-completion",
    "16",
]
CONFIGS = [
    "agentic-rag, full fine-tuning",
    "agentic-rag, LoRA r=4",
    "long-tail, full fine-tuning",
    "long-tail, LoRA r=4",
]


def _run(*flags: str) -> subprocess.CompletedProcess:
    pytest.importorskip("peft")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, *flags], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_every_layout_is_checked_then_timed():
    done = _run("--steps", "1", "--lora", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for label in CONFIGS:
        check = re.search(rf"^check before timing \({re.escape(label)}\): (.*)$", out, flags=re.M)
        assert check and check.group(1).endswith("tolerance 1e-04 relative)") and "-> ok" in check.group(1), out
        for name in ("packed", "shared"):
            d = re.search(rf"{name} vs trl: max \|d logp\| (\S+) ", check.group(1))
            assert d and float(d.group(1)) < 1e-4, check.group(1)
        table = out.split(f"\n{label}: 1 timed steps", 1)[1]
        assert "[fewer than 3 timed steps: too few to trust]" in table.splitlines()[0]
        for name in ("trl", "packed", "shared"):
            assert re.search(rf"^  {name} +\d+\.\d+ +\d+ +\d+\.\d+x +\d+ ", table, flags=re.M), table
        assert re.search(r"^  trl .* 1\.00x +\d+ +\d+\.\d+ +1\.00x +1\.00 +\d+\.\d+ +1\.00x$", table, flags=re.M), table
    summary = out.split("speed-up over trl in real tokens/s (of the FLOP ideal; in CPU time):\n", 1)[1]
    assert all(label in summary for label in CONFIGS), summary
    assert re.search(r"^machine: .*\d+ cores.*load average [\d.]+ [\d.]+ [\d.]+$", out, flags=re.M), out


def test_a_tolerance_the_layouts_miss_stops_before_timing():
    done = _run("--steps", "1", "--lengths", "agentic-rag", "--finetune", "full", "--tolerance", "0")
    assert done.returncode != 0
    assert "-> FAILED" in done.stdout and "not timing them" in done.stderr, done.stdout + done.stderr
    assert "s/step" not in done.stdout
