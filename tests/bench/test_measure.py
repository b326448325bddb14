"""Measuring primitives (padless.bench.timing, .memory) and the recording (padless.bench.measure): step
timer, peak memory per phase, per-step recorder, environment snapshot."""

from __future__ import annotations

import json
import time
from datetime import datetime

import numpy as np
import pytest

from padless.bench.config import RunConfig
from padless.bench.measure import StrategyRecorder, environment_snapshot
from padless.bench.memory import CPU_MEMORY_METHODS, PeakMemory, cpu_method_works
from padless.bench.results import BenchResults, RunStatus, validate
from padless.bench.timing import StepTimer, synchronizer

MiB = 2**20


class FakeClock:
    """A clock that advances by the given amounts, one per call."""

    def __init__(self, *ticks):
        self.now, self.ticks = 0.0, list(ticks)

    def __call__(self):
        self.now += self.ticks.pop(0)
        return self.now


def test_step_timer_times_each_step_between_syncs():
    events = []
    clock = FakeClock(0.0, 0.5, 10.0, 0.25, 1.0, 2.0)
    timer = StepTimer(sync=lambda: events.append("sync"), clock=clock)
    for _ in range(3):
        with timer.step():
            events.append("work")
    assert timer.times_s == [0.5, 0.25, 2.0]
    assert events == ["sync", "work", "sync"] * 3
    assert timer.measured(1) == [0.25, 2.0]
    assert timer.measured(5) == []


def test_step_timer_drops_an_interrupted_step():
    timer = StepTimer(clock=FakeClock(0.0, 1.0, 0.0))
    with timer.step():
        pass
    with pytest.raises(KeyboardInterrupt), timer.step():
        raise KeyboardInterrupt
    assert timer.times_s == [1.0]


def test_step_timer_rejects_negative_warmup():
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        StepTimer().measured(-1)


def test_cpu_synchronizer_is_a_no_op():
    sync = synchronizer("cpu")
    assert sync() is None
    assert synchronizer("cpu") is sync  # one shared no-op, nothing device-specific


def _working_cpu_methods():
    return [m for m in CPU_MEMORY_METHODS if cpu_method_works(m)]


def test_memory_method_is_chosen_and_validated():
    assert PeakMemory("cpu").method == _working_cpu_methods()[0]
    with pytest.raises(ValueError, match="memory method 'psutil' is not one of"):
        PeakMemory("cpu", method="psutil")


@pytest.mark.parametrize("method", [m for m in CPU_MEMORY_METHODS if m != "ru_maxrss"])
def test_cpu_peak_sees_a_spike_and_resets_between_phases(method):
    if not cpu_method_works(method):
        pytest.skip(f"{method} does not work on this machine")
    mem = PeakMemory("cpu", method=method)
    mem.start()
    spike = np.ones(96 * MiB // 8)  # 96 MiB, touched, freed before the phase ends
    mem.sample()
    del spike
    first = mem.stop()
    mem.start()
    second = mem.stop()
    assert first is not None and second is not None
    assert first - second > 64 * MiB, (first, second)  # the second phase did not inherit the spike


def test_sampler_thread_samples_while_the_phase_runs():
    if not cpu_method_works("statm-sampler"):
        pytest.skip("no /proc/self/statm")
    mem = PeakMemory("cpu", method="statm-sampler", interval_s=0.001)
    mem.start()
    base = mem.peak_bytes()
    spike = np.ones(64 * MiB // 8)
    deadline = time.monotonic() + 10
    while mem._sampled_peak < base + 48 * MiB and time.monotonic() < deadline:  # the thread, not sample()
        time.sleep(0.005)
    del spike
    assert mem.stop() >= base + 48 * MiB
    assert mem._thread is None


def test_ru_maxrss_is_a_lifetime_peak():
    mem = PeakMemory("cpu", method="ru_maxrss")
    mem.start()
    first = mem.stop()
    mem.start()
    assert mem.stop() >= first > 0


@pytest.mark.gpu
def test_accelerator_peak_memory_and_sync():
    torch = pytest.importorskip("torch")
    if not torch.accelerator.is_available():
        pytest.skip("no accelerator")
    device = torch.accelerator.current_accelerator()
    mem = PeakMemory(device)
    assert mem.method == "accelerator-max-allocated"
    mem.start()
    x = torch.ones(64 * MiB // 4, device=device)
    synchronizer(device)()
    del x
    first = mem.stop()
    mem.start()
    assert first >= 64 * MiB > mem.stop()


def test_recorder_freezes_steps_and_rejects_impossible_ones():
    rec = StrategyRecorder()
    rec.record_step(step_time_s=0.5, loss=3.0, real_tokens=60, padded_tokens=64, sequences=2)
    rec.record_step(step_time_s=0.25, loss=2.5, real_tokens=64, padded_tokens=64, sequences=3)
    rec.eval_loss_start = 3.2
    run = rec.result(peak_memory_bytes=123, memory_method="vmhwm")
    assert run.step_time_s == (0.5, 0.25) and run.real_tokens == (60, 64) and run.sequences == (2, 3)
    assert (run.eval_loss_start, run.eval_loss_end, run.peak_memory_bytes) == (3.2, None, 123)
    with pytest.raises(ValueError, match=r"step 2: real_tokens=65 must be in \[0, padded_tokens=64\]"):
        rec.record_step(step_time_s=0.1, loss=1.0, real_tokens=65, padded_tokens=64, sequences=1)
    with pytest.raises(ValueError, match="step 2: step_time_s is negative"):
        rec.record_step(step_time_s=-1.0, loss=1.0, real_tokens=1, padded_tokens=1, sequences=1)
    assert len(rec.loss) == 2  # rejected steps leave no trace


def test_environment_snapshot_describes_this_process():
    import torch

    import padless

    env = environment_snapshot("cpu")
    assert env.torch == torch.__version__ and env.padless == padless.__version__
    assert env.transformers[0].isdigit()
    assert env.torch_threads == torch.get_num_threads()
    assert env.cpu_count >= env.cpu_available >= 1
    assert env.device == "cpu" and env.device_name == env.cpu_model != ""
    assert datetime.fromisoformat(env.date).tzinfo is not None


def test_a_tiny_training_loop_measures_into_valid_results():
    """The primitives composed as ``padless bench`` composes them, on a tiny model, with the second
    strategy interrupted (Ctrl-C) after one step."""
    import torch

    from padless.models.factory import build_model

    model = build_model("tiny-gpt2", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = torch.device("cpu")
    timer, mem = StepTimer(synchronizer(device)), PeakMemory(device)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))  # (B, T)
    runs, done = {}, []
    for name, steps in (("padding", 3), ("packing", 1)):
        rec = StrategyRecorder()
        mem.start()
        for _ in range(steps):
            with timer.step():
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            rec.record_step(
                step_time_s=timer.times_s[-1], loss=loss.item(), real_tokens=30, padded_tokens=ids.numel(), sequences=2
            )
        runs[name] = rec.result(mem.stop(), mem.method)
        if steps == 3:
            done.append(name)
    config = RunConfig(
        model="tiny-gpt2",
        data="random",
        strategies=("padding", "packing"),
        steps=3,
        batch_size=2,
        max_length=16,
        mode="same-examples",
        seed=0,
        device="cpu",
        dtype="float32",
        grad_accumulation=1,
        warmup_steps=1,
        lr=1e-3,
    )
    results = BenchResults(
        config,
        environment_snapshot(device),
        runs,
        (15, 15),
        RunStatus("interrupted", tuple(done), "packing", 1),
        padless_version="0.1.0",
    )
    data = json.loads(results.to_json())
    assert validate(data) == []
    assert all(t > 0 for t in data["strategies"]["padding"]["step_time_s"])
    assert data["strategies"]["padding"]["peak_memory_bytes"] > 0
    assert data["strategies"]["packing"]["figures"]["measured_steps"] == 0
    assert BenchResults.from_dict(data) == results
