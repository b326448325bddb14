"""The benchmark: its step plans, bucketing's partition, step-for-step loss equality of padding and
packing, and the quick preset end to end (results.json complete, report redrawn from the json)."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_features
from padless.bench import run as bench_run
from padless.bench import train as bench_train
from padless.bench.config import RunConfig
from padless.bench.steps import same_example_steps, token_budget_steps
from padless.bench.strategies import bucket_partition, parse_strategies


def _cost(groups, lengths, overhead):
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=7), st.integers(0, 100))
def test_bucket_partition_is_optimal_on_small_inputs(lengths, overhead):
    groups = bucket_partition(lengths, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    # brute force over contiguous splits of the sorted order (an optimal partition is contiguous there)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = min(
        _cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], lengths, overhead)
        for r in range(len(order))
        for cuts in itertools.combinations(range(1, len(order)), r)
    )
    assert _cost(groups, lengths, overhead) == best


def test_same_example_steps_cover_examples_without_repeats_in_an_epoch():
    steps = same_example_steps(20, 5, 4, seed=0)
    flat = np.concatenate(steps)
    assert sorted(flat.tolist()) == list(range(20))
    assert [s.tolist() for s in steps] == [s.tolist() for s in same_example_steps(20, 5, 4, seed=0)]
    with pytest.raises(ValueError, match="a step needs 8"):
        same_example_steps(5, 1, 8, seed=0)


@pytest.mark.parametrize("strategy", ["padding", "packing", "flattening", "bucketing"])
def test_token_budget_steps_respect_the_budget(strategy):
    lengths = np.random.default_rng(0).integers(1, 100, 300)
    steps = token_budget_steps(strategy, lengths, 10, 400, seed=0)
    assert len(steps) == 10
    for s in steps:
        fed = len(s) * lengths[s].max() if strategy in ("padding", "bucketing") else lengths[s].sum()
        assert fed <= 400


def test_parse_strategies():
    assert parse_strategies("packing, padding") == ["packing", "padding"]
    with pytest.raises(ValueError, match="unknown strategy 'packed'"):
        parse_strategies("packing,packed")


def _cfg(**kw):
    base = dict(
        model="tiny-gpt2",
        data="-",
        strategies=("padding", "packing"),
        steps=4,
        batch_size=6,
        max_length=64,
        warmup_steps=1,
        lr=1e-3,
        eval_examples=4,
        train_on="all",
        grad_accumulation=1,
        limit=None,
        in_process=True,
    )
    return RunConfig(**{**base, **kw})


def test_padding_and_packing_losses_match_step_for_step():
    """Same examples per step, same init: packing changes the speed, not what is learned."""
    import torch

    from padless.bench.measure import StrategyRecorder
    from padless.bench.memory import PeakMemory

    # token ids from a 16-token subset of the 512-token vocabulary: quick to learn, so the loss drops
    feats = make_features(np.random.default_rng(1).integers(1, 40, 40), vocab_size=16, seed=1, with_labels=True)
    train, evals = feats[4:], feats[:4]
    cfg = _cfg(grad_accumulation=2, batch_size=3)
    steps = same_example_steps(len(train), cfg.steps, cfg.batch_size * cfg.grad_accumulation, 0)
    losses = {}
    for name in ("padding", "packing", "flattening", "bucketing"):
        rec = StrategyRecorder()
        bench_train.train_strategy(
            name,
            cfg,
            train,
            evals,
            steps,
            device=torch.device("cpu"),
            dtype=torch.float32,
            pad_token_id=0,
            recorder=rec,
            memory=PeakMemory("cpu"),
            progress=False,
        )
        losses[name] = (rec.loss, rec.eval_loss_start, rec.eval_loss_end)
    for name in ("packing", "flattening", "bucketing"):
        np.testing.assert_allclose(losses[name][0], losses["padding"][0], rtol=2e-5)
        np.testing.assert_allclose(losses[name][1:], losses["padding"][1:], rtol=2e-5)
    assert losses["padding"][2] < losses["padding"][1] - 0.1  # it trains: the held-out loss drops


@pytest.mark.slow
def test_quick_preset_end_to_end(tmp_path):
    from padless.bench.results import validate
    from padless.cli import main

    out = tmp_path / "quick"
    assert main(["bench", "--preset", "quick", "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert validate(data) == []
    assert data["status"]["state"] == "complete"
    assert set(data["strategies"]) == {"padding", "bucketing", "packing", "flattening"}
    for run in data["strategies"].values():
        assert len(run["loss"]) == 6 and all(np.isfinite(run["loss"]))
        assert run["figures"]["real_tokens_per_s"] > 0
        assert run["allocator"] == "glibc-tuned" and run["max_rss_bytes"] > 0 and run["figures"]["mfu"] > 0
    assert data["summary"]["strongest_baseline"] in {"padding", "bucketing", "flattening"}
    assert (
        data["strategies"]["packing"]["figures"]["padding_fraction"]
        < data["strategies"]["padding"]["figures"]["padding_fraction"]
    )
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html
    redraw = tmp_path / "redraw"
    assert main(["report", str(out / "results.json"), "--out", str(redraw)]) == 0
    assert (redraw / "report.html").exists()


@pytest.mark.slow
def test_bench_under_torchrun_two_gloo_ranks(tmp_path):
    """``padless bench`` under ``torchrun --nproc-per-node 2``, all four strategies (bucketing's
    micro-batch counts differ between the ranks): aggregate figures from rank 0, the same losses."""
    import os
    import socket
    import subprocess
    import sys

    from padless.bench.results import validate

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "padless", "bench", "--preset", "quick", "--strategies",
           "padding,bucketing,packing,flattening", "--steps", "3", "--warmup-steps", "1", "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert validate(data) == [] and data["config"]["world_size"] == 2
    # each step sums both ranks: 2 ranks x 4 examples
    assert data["strategies"]["packing"]["sequences"] == [8, 8, 8]
    for name in ("bucketing", "packing", "flattening"):
        assert data["strategies"][name]["sequences"] == [8, 8, 8]
        np.testing.assert_allclose(data["strategies"][name]["loss"], data["strategies"]["padding"]["loss"], rtol=1e-4)


def test_ctrl_c_writes_what_was_measured(tmp_path, monkeypatch):
    from padless.bench.results import load_results

    feats = make_features(np.random.default_rng(2).integers(2, 30, 40), vocab_size=16, seed=2)
    monkeypatch.setattr(bench_run, "load_data", lambda cfg: (feats[4:], feats[:4], 0))
    real_train = bench_train.train_strategy

    def interrupted_second(name, cfg, train, evals, steps, **kw):
        if name == "packing":  # two steps done, then Ctrl-C
            real_train(name, cfg, train, evals, steps[:2], **kw)
            raise KeyboardInterrupt
        return real_train(name, cfg, train, evals, steps, **kw)

    monkeypatch.setattr(bench_train, "train_strategy", interrupted_second)
    path = bench_run.run_benchmark(_cfg(strategies=("padding", "packing", "flattening")), tmp_path, progress=False)
    results = load_results(path)
    assert results.status.state == "interrupted"
    assert results.status.strategies_done == ("padding",)
    assert results.status.interrupted_strategy == "packing" and results.status.interrupted_at_step == 2
    assert len(results.strategies["packing"].loss) == 2 and "flattening" not in results.strategies
    assert (tmp_path / "report.html").exists()


def test_token_budget_mode_runs(tmp_path, monkeypatch):
    from padless.bench.results import load_results

    feats = make_features(np.random.default_rng(3).integers(2, 30, 60), vocab_size=16, seed=3)
    monkeypatch.setattr(bench_run, "load_data", lambda cfg: (feats[4:], feats[:4], 0))
    cfg = _cfg(strategies=("padding", "packing"), mode="token-budget", token_budget=96, steps=3)
    results = load_results(bench_run.run_benchmark(cfg, tmp_path, progress=False))
    assert results.config.token_budget == 96
    for run in results.strategies.values():
        assert all(p <= 96 for p in run.padded_tokens)
    # packing fills the budget with real tokens; padding spends part of it on pad
    assert sum(results.strategies["packing"].real_tokens) > sum(results.strategies["padding"].real_tokens)


# --- FLOPs, configuration, isolation ---------------------------------------------------------------


def test_flops_of_a_tiny_llama_match_a_hand_count():
    from padless.bench.flops import ModelShape, executed_step_flops, needed_step_flops
    from padless.models.factory import tiny_config

    shape = ModelShape.from_config(tiny_config("llama"))  # 2 layers, d 64, 4 heads of 16, 2 KV heads, I 128, V 512
    assert shape == ModelShape(
        layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512, gated_mlp=True
    )
    # per layer and token: q 64x64, k and v 64x32 each, o 64x64 -> 12288 MACs; MLP 3 x 64x128 -> 24576 MACs
    body = 2 * 2 * (12288 + 24576)
    attention = lambda n: 2 * 4 * 64 * n * (n + 1) // 2  # noqa: E731  2 layers x 2 products x 2 FLOPs x Hq*D
    head = 2 * 64 * 512
    assert needed_step_flops(shape, [3, 5], trained_tokens=4) == 3 * (8 * body + attention(3) + attention(5) + 4 * head)
    # LoRA (base weights frozen): no weight gradients, so the weight matmuls cost 2x; attention still 3x
    assert needed_step_flops(shape, [3, 5], trained_tokens=4, frozen_weights=True) == (
        2 * (8 * body + 4 * head) + 3 * (attention(3) + attention(5))
    )
    import torch

    padded = {"input_ids": torch.zeros(2, 5, dtype=torch.long)}  # two rows of 5: 2 tokens of padding
    packed = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 3, 8])}
    assert executed_step_flops(shape, [padded], 4, full_logits=False) == 3 * (10 * body + 2 * attention(5) + 4 * head)
    assert executed_step_flops(shape, [packed], 4, full_logits=False) == needed_step_flops(shape, [3, 5], 4)
    assert executed_step_flops(shape, [packed], 4, full_logits=True) == 3 * (
        8 * body + attention(3) + attention(5) + 8 * head
    )


def test_gpt2_shape_reads_the_gpt2_names():
    from padless.bench.flops import ModelShape
    from padless.models.factory import gpt2_config

    assert ModelShape.from_config(gpt2_config("gpt2")) == ModelShape(12, 768, 12, 12, 64, 3072, 50257, False)


def test_every_config_field_is_a_flag_and_flags_override_the_preset():
    import dataclasses

    from padless.bench.config import PRESETS, RESULT_ONLY_FIELDS, RunConfig
    from padless.cli import build_parser
    from padless.cli.bench import config_from_args

    parser = build_parser(["bench"])
    flags = {
        a for action in parser._subparsers._group_actions[0].choices["bench"]._actions for a in action.option_strings
    }
    for f in dataclasses.fields(RunConfig):
        assert (f"--{f.name.replace('_', '-')}" in flags) == (f.name not in RESULT_ONLY_FIELDS), f.name
    args = parser.parse_args(
        [
            "bench",
            "--preset",
            "quick",
            "--steps",
            "3",
            "--strategies",
            "packing,padding",
            "--full-logits",
            "--mode",
            "token-budget",
            "--allocator",
            "glibc",
        ]
    )
    cfg = config_from_args(args)
    assert cfg == dataclasses.replace(
        PRESETS["quick"],
        steps=3,
        strategies=("packing", "padding"),
        full_logits=True,
        mode="token-budget",
        allocator="glibc",
    )


@pytest.mark.parametrize("field, value, message", [
    ("strategies", ("packing", "packed"), "strategies: unknown strategy 'packed'"),
    ("mode", "fast", "mode 'fast'"),
    ("allocator", "mimalloc", "allocator 'mimalloc'"),
    ("distributed", "zero3", "distributed 'zero3'"),
    ("steps", 0, "steps=0 must be >= 1"),
    ("batch_size", True, "batch_size=True must be >= 1"),
])  # fmt: skip
def test_run_config_refuses_bad_values_naming_the_field(field, value, message):
    from padless.bench.config import RunConfig

    with pytest.raises(ValueError, match=message):
        RunConfig(**{field: value})


@pytest.mark.parametrize(
    "extra, message",
    [({"compile": "dynamic"}, "compile='dynamic'"), ({"dtype": "float16"}, "dtype='float16'"), ({"lora": 8}, "lora")],
)
def test_fsdp_refuses_what_has_not_run_with_it(extra, message):
    from padless.bench.config import RunConfig

    with pytest.raises(ValueError, match=f"distributed='fsdp' with {message}.*use distributed='ddp'"):
        RunConfig(distributed="fsdp", **extra)


def test_fsdp_outside_torchrun_is_refused(monkeypatch):
    from padless.bench.parallel import init_distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="runs under torchrun"):
        init_distributed("cpu", "fsdp")


@pytest.mark.slow
def test_bench_fsdp_under_torchrun_with_one_process(tmp_path):
    """``torchrun --nproc-per-node 1 padless bench --distributed fsdp`` (benchmarks/gpu.sh's FSDP step on
    one GPU): the model sharded over a group of one, trained in the bench's own process, recorded."""
    import os
    import subprocess
    import sys

    from padless.bench.results import validate

    out = tmp_path / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "padless",
           "bench", "--preset", "quick", "--strategies", "padding,packing", "--steps", "3", "--warmup-steps", "1",
           "--threads", "1", "--no-progress", "--distributed", "fsdp", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert validate(data) == [] and (data["config"]["distributed"], data["config"]["world_size"]) == ("fsdp", 1)
    np.testing.assert_allclose(data["strategies"]["packing"]["loss"], data["strategies"]["padding"]["loss"], rtol=1e-4)


def test_allocator_env():
    from padless.bench.isolate import GLIBC_TUNED, allocator_env

    assert allocator_env("glibc") == ("glibc", {})
    assert allocator_env("auto") == ("glibc-tuned", GLIBC_TUNED)
    for name in ("jemalloc", "tcmalloc"):
        used, env = allocator_env(name)
        assert (used, env) == (name, {"LD_PRELOAD": env.get("LD_PRELOAD", "")}) or (
            used == f"glibc-tuned ({name} not installed)" and env == GLIBC_TUNED
        )
    with pytest.raises(ValueError, match="allocator 'x'"):
        allocator_env("x")


def test_each_strategy_in_its_own_process_stepped_in_turn_under_a_load_started_halfway(tmp_path, monkeypatch, capsys):
    """A tiny pre-tokenized file: every strategy in a child process, the children stepped in turn, their
    results gathered side by side, with per-process memory, CPU times, allocator, FLOPs and MFU. A
    CPU-burning process per core starts at the middle round and lands on padding and packing alike, since
    every round steps each strategy once; the report says so. (Timing is the benchmark's to measure, not a
    test's: docs/results.md has the demo under an injected load.)"""
    import functools
    import os
    import subprocess
    import sys

    import padless.bench.isolate as isolate
    from padless.bench.results import load_results
    from padless.cli import main

    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(0, 300, n).tolist()} for n in rng.integers(8, 200, 100)]
    data = tmp_path / "tiny.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steps, warmup = 12, 2
    burners: list[subprocess.Popen[bytes]] = []

    rounds: list[int] = []

    def load(i: int) -> None:
        rounds.append(i)
        if i == steps // 2:
            burners.extend(
                subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)
            )

    monkeypatch.setattr(isolate, "run_interleaved", functools.partial(isolate.run_interleaved, on_round=load))
    out = tmp_path / "run"
    args = ["bench", "--preset", "quick", "--data", str(data), "--tokenizer", "gpt2", "--train-on", "all",
            "--steps", str(steps), "--warmup-steps", str(warmup), "--batch-size", "8", "--eval-examples", "4",
            "--strategies", "padding,packing", "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    try:
        assert main(args) == 0
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    assert burners
    results = load_results(out / "results.json")
    assert results.status.state == "complete" and results.peak_flops_per_s > 0
    assert results.config.device == "cpu" and results.config.dtype == "float32" and results.config.allocator == "auto"
    figs = results.figures()
    for name, run in results.strategies.items():
        assert run.allocator == "glibc-tuned" and run.max_rss_bytes > 0
        assert run.cpu_user_s > 0 and run.cpu_sys_s >= 0
        assert len(run.model_flops) == steps and 0 < figs[name].mfu
    pad, pack = results.strategies["padding"], results.strategies["packing"]
    assert pad.model_flops == pack.model_flops and pad.trained_tokens == pack.trained_tokens  # same work needed
    assert sum(pad.executed_flops) > sum(pad.model_flops) and pack.executed_flops == pack.model_flops
    np.testing.assert_allclose(pack.loss, pad.loss, rtol=1e-5)
    assert len(results.lengths) == 96
    # stepped in turn: every round steps every strategy once, so the load that starts at the middle round
    # lands on both alike (the measured effect, on the real demo under a burner, is in docs/results.md:
    # a timed assert here would only measure how busy the test machine is)
    assert rounds == list(range(len(rounds))) and len(rounds) >= steps
    assert len(pad.step_time_s) == len(pack.step_time_s) == steps
    said = capsys.readouterr().out
    assert "each strategy in its own process, the processes stepped in turn" in said


def test_under_autocast_padless_attention_computes_in_the_autocast_dtype(monkeypatch):
    """Llama under autocast hands fp32 queries to attention (RoPE runs in fp32); padless casts q/k/v
    to the autocast dtype, as transformers' flash-attention integration does, so the automatic kernel
    choice sees bf16 (on CUDA: a varlen kernel, not the grouped-SDPA fallback). Same loss as SDPA."""
    import torch

    import padless.attention.backend as backend
    from padless.attention.backend import register_padless_attention
    from padless.batching.collate import PackingCollator, PaddingCollator
    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss, step_num_items

    seen = []
    real = backend.varlen_attention
    monkeypatch.setattr(backend, "varlen_attention", lambda q, *a, **k: seen.append(q.dtype) or real(q, *a, **k))
    feats = make_features([5, 17, 9], vocab_size=512, seed=4, with_labels=True)
    losses = {}
    for attn in ("sdpa", register_padless_attention()):
        model = build_model("tiny-llama", attn_implementation=attn).eval()
        collate = PaddingCollator() if attn == "sdpa" else PackingCollator.for_model(model, max_length=None)
        batch = collate(feats)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses[attn] = model_loss(model, batch, step_num_items([batch]), trained_logits_only=True).item()
    assert seen and set(seen) == {torch.bfloat16}
    assert losses["sdpa"] == pytest.approx(losses["padless"], rel=2e-2)


def test_float16_scales_the_loss_and_other_dtypes_do_not(monkeypatch):
    """``--dtype float16``: the loss goes through an enabled ``torch.amp.GradScaler`` (fp16 gradients
    underflow without it), the optimiser steps through the scaler, and training still matches fp32
    closely; float32 and bfloat16 get a disabled (pass-through) scaler."""
    import torch

    from padless.bench.measure import StrategyRecorder
    from padless.bench.memory import PeakMemory

    seen = []

    class Scaler(torch.amp.GradScaler):
        def scale(self, outputs):
            seen.append(("scale", self.is_enabled()))
            return super().scale(outputs)

        def step(self, optimizer, *args, **kwargs):
            seen.append(("step", self.is_enabled()))
            return super().step(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.amp, "GradScaler", Scaler)
    feats = make_features(np.random.default_rng(5).integers(2, 30, 24), vocab_size=16, seed=5, with_labels=True)
    train, evals = feats[4:], feats[:4]
    cfg = _cfg(strategies=("packing",), steps=3, batch_size=4)
    steps = same_example_steps(len(train), 3, 4, 0)
    losses = {}
    for dtype in (torch.float32, torch.float16):
        seen.clear()
        rec = StrategyRecorder()
        bench_train.train_strategy(
            "padding",
            cfg,
            train,
            evals,
            steps,
            device=torch.device("cpu"),
            dtype=dtype,
            pad_token_id=0,
            recorder=rec,
            memory=PeakMemory("cpu"),
            progress=False,
        )
        enabled = dtype == torch.float16
        assert seen and set(seen) == {("scale", enabled), ("step", enabled)}
        assert sum(1 for s in seen if s[0] == "step") == 3  # one optimiser step per step, through the scaler
        losses[dtype] = rec.loss
    assert all(np.isfinite(losses[torch.float16]))
    np.testing.assert_allclose(losses[torch.float16], losses[torch.float32], rtol=2e-2)
