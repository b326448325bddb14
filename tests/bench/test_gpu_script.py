"""benchmarks/gpu.sh's bookkeeping, without a GPU: every step's status is recorded, a failing step
does not stop the next, the exit status counts the failures, and a spent time budget skips steps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
STEPS = ["env", "setup", "parity", "verify", "autocast", "mixers", "bench", "fsdp"]

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and coreutils timeout"
)


def _run(tmp_path, **env):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=tmp_path,
    )
    return done, json.loads((out / "status.json").read_text())


def test_every_step_runs_and_is_recorded_after_failures(tmp_path):
    done, status = _run(tmp_path, PYTHON="/bin/false")  # an interpreter that fails every step
    assert [s["step"] for s in status["steps"]] == STEPS
    by_name = {s["step"]: s for s in status["steps"]}
    failed = [n for n in STEPS if by_name[n]["status"] == "fail"]
    assert failed == STEPS[:-1]  # each ran, in turn, after the one before had failed
    assert by_name["fsdp"]["status"] == "skipped" and "--distributed" in by_name["fsdp"]["reason"]
    assert done.returncode == len(failed)
    assert all((tmp_path / "out" / f"{n}.log").is_file() for n in failed)


def test_a_spent_budget_skips_the_remaining_steps(tmp_path):
    done, status = _run(tmp_path, BUDGET="0")
    assert done.returncode == 0
    assert {s["status"] for s in status["steps"]} == {"skipped"}
    assert all("budget" in s["reason"] for s in status["steps"] if s["step"] != "fsdp")


def test_help_and_bad_arguments():
    assert "--cpu-dry-run" in subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True).stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--gpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --gpu" in bad.stderr
