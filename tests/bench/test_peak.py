"""The machine's peak (padless.bench.peak): batches of back-to-back GEMMs, timed with CUDA events on
CUDA (events mocked here) and between syncs elsewhere."""

from __future__ import annotations

import pytest
import torch

from padless.bench.flops import ModelShape
from padless.bench.peak import gemm_shapes, gemm_timer, measure_peak_flops


def test_batches_grow_until_launch_overhead_vanishes_and_the_fastest_per_gemm_counts():
    calls = []

    def timer(work, repeats):  # 1 ms of fixed overhead per batch, then 0.1 ms per GEMM
        work()
        calls.append(repeats)
        return 1e-3 + 1e-4 * repeats

    rate, where = measure_peak_flops([(8, 4, 2)], "cpu", torch.float32, min_time_s=0.5, timer=timer)
    assert calls[0] == 1  # the warm-up
    assert calls[1:4] == [1, 2, 4] and max(calls) >= 512  # doubled while a batch is under 0.05 s
    per_gemm = (1e-3 + 1e-4 * max(calls)) / max(calls)
    assert rate == pytest.approx(2 * 8 * 4 * 2 / per_gemm)
    assert where == "8 x 4 x 2 float32"


def test_cuda_batches_are_timed_by_events_without_a_host_sync_per_gemm(monkeypatch):
    events = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = len(events)
            events.append("record")

        def synchronize(self):
            events.append("sync")

        def elapsed_time(self, end):
            return 2.5  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a host sync inside the batch"))
    took = gemm_timer(torch.device("cuda", 0))(lambda: events.append("gemm"), 3)
    assert took == pytest.approx(2.5e-3)
    assert events == ["record", "gemm", "gemm", "gemm", "record", "sync"]


def test_a_real_cpu_peak_is_positive_and_names_the_fastest_shape():
    shapes = gemm_shapes(ModelShape(1, 32, 2, 16, 16, 64, 100, False), rows=16)
    assert shapes == [(16, 32, 32), (16, 32, 64), (16, 64, 32), (16, 32, 100)]
    rate, where = measure_peak_flops(shapes, "cpu", torch.float32, min_time_s=0.01)
    assert rate > 0 and where.endswith("float32") and where.split(" x ")[0] == "16"
