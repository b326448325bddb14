"""Two ranks under ``torchrun --nproc-per-node 2`` (gloo, CPU): the packed first optimiser step of
``PackedTrainer``, padless' ``SFTTrainer`` and examples/accelerate_loop.py equals the padded step of one
process over the same examples (fp32). The ranks run in the launch test_fsdp.py shares with this file
(its ``main``, parts ``ddp`` and ``example``); the steps live in tests/integrations_support.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_fsdp import part, printed, shared_launch  # noqa: E402
from test_transformers import assert_same_step  # noqa: E402

import integrations_support as support  # noqa: E402

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's results of the shared ``torchrun`` launch."""
    return shared_launch(tmp_path_factory)


def _one_step_over_both_ranks(ranks, key, want):
    """DDP leaves the same averaged gradient on both ranks; the ranks' losses average to the step's."""
    got = part(ranks, "ddp", key)
    assert [(g["rank"], g["world"]) for g in got] == [(0, 2), (1, 2)]
    assert got[0]["num_items"] == got[1]["num_items"]  # the count is all-reduced over the ranks
    for g in got:
        assert_same_step({**g, "loss": sum(x["loss"] for x in got) / 2}, want)


def test_packed_trainer_on_two_ranks_equals_one_padded_process(ranks, tmp_path):
    padded = support.first_step("trainer-padded", "sdpa", str(tmp_path))
    _one_step_over_both_ranks(ranks, "ddp-trainer", padded)


def test_padless_sft_trainer_on_two_ranks_equals_one_padded_process(ranks, tmp_path):
    support.offline_hub()
    padded = support.first_step("sft-padded", "sdpa", str(tmp_path))
    _one_step_over_both_ranks(ranks, "ddp-sft", padded)


def test_accelerate_example_on_two_ranks_equals_one_padded_process(ranks):
    """Step 1 of the example: 2 micro-batches x 1 row on each of 2 ranks; the reference pads exactly the
    examples of those 4 rows into one batch."""
    want = support.padded_accelerate_step(world_size=2, micro_batches=2)
    got = part(ranks, "ddp", "ddp-accelerate")
    assert want["examples"] < want["of"] or want["all_rows"]
    assert got[0]["loss"] == got[1]["loss"]  # reduced over the ranks
    for g in got:
        assert_same_step(g, want)
    assert math.isfinite(got[0]["loss"])


def test_accelerate_example_script_runs_on_two_processes(ranks):
    """The example's own ``main`` (argument parsing, Accelerator, data, 2 steps) on both ranks; the main
    process prints its summary."""
    lines = [line for line in printed(ranks, "example").splitlines() if line.startswith("accelerate:")]
    assert lines == ["accelerate: 2 optimiser steps on 2 process(es)"]
