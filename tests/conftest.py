"""Shared test fixtures: tiny models, deterministic features."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# No per-example deadline (a loaded 2-core machine is slow, not wrong); in CI the examples are
# derandomized so a run is reproducible.
settings.register_profile("padless", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "padless")


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    import torch

    # under pytest-xdist (make test runs two workers on the 2-core CI machine) each worker takes one core
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))
    torch.use_deterministic_algorithms(False)


def make_features(lengths, vocab_size=512, seed=0, with_labels=False):
    """Random token-id features; with labels, a prompt-like prefix of each is masked with -100."""
    rng = np.random.default_rng(seed)
    feats = []
    for n in lengths:
        ids = rng.integers(0, vocab_size, int(n)).tolist()
        feature = {"input_ids": ids}
        if with_labels:
            cut = int(rng.integers(0, n))
            feature["labels"] = [-100] * cut + ids[cut:]
        feats.append(feature)
    return feats


def alone_logits(model, ids):
    """``[n, V]`` logits of one sequence run alone (no cache)."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


def max_diff_to_alone(model, feats, batch):
    """Largest |logit| difference between each packed document of ``batch`` (read from its placements)
    and the same feature run alone."""
    import torch

    from padless.batching.batch import forward_inputs

    with torch.no_grad():
        logits = model(**forward_inputs(batch)).logits
    pl, worst = batch.placements, 0.0
    for j in range(pl.feature.size):
        r, o, n = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])
        alone = alone_logits(model, feats[int(pl.feature[j])]["input_ids"])
        worst = max(worst, (logits[r, o : o + n] - alone).abs().max().item())
    return worst


def row_documents(rows):
    """The documents of packed rows (dicts with ``input_ids`` and ``seq_lengths``), in row order."""
    docs = []
    for row in rows:
        at = 0
        for n in row["seq_lengths"]:
            docs.append(row["input_ids"][at : at + n])
            at += n
    return docs


def make_results(
    strategies=("padding", "bucketing", "packing"), steps=6, batch=4, seed=0, interrupted_at=None, sys_s=0.5
):
    """A synthetic but valid results object: per-step token counts follow from real batches of a
    random length sample (pad to longest for padding, sorted batches for bucketing, rows of
    ``max_length`` for packing); step times are proportional to tokens fed. Not a measurement."""
    import math

    from padless.bench.results import BenchResults, Environment, RunConfig, RunStatus, StrategyRun

    rng = np.random.default_rng(seed)
    max_length = 64
    lengths = rng.integers(4, max_length + 1, steps * batch).tolist()
    batches = [lengths[i * batch : (i + 1) * batch] for i in range(steps)]
    by_len = sorted(lengths)
    padded = {
        "padding": [batch * max(b) for b in batches],
        "bucketing": [batch * by_len[(i + 1) * batch - 1] for i in range(steps)],
        "packing": [max_length * math.ceil(sum(b) / max_length) for b in batches],
        "flattening": [sum(b) for b in batches],
    }
    runs = {}
    done = []
    for k, name in enumerate(strategies):
        n = steps
        if interrupted_at is not None and k == len(strategies) - 1:
            n = interrupted_at
        real = (
            [sum(b) for b in batches][:n]
            if name != "bucketing"
            else [sum(by_len[i * batch : (i + 1) * batch]) for i in range(n)]
        )
        runs[name] = StrategyRun(
            step_time_s=tuple(1e-3 * p * (1.5 if i == 0 else 1.0) for i, p in enumerate(padded[name][:n])),
            loss=tuple(2.0 + 4.0 * math.exp(-i / 8) + 0.02 * k for i in range(n)),
            real_tokens=tuple(real),
            padded_tokens=tuple(padded[name][:n]),
            sequences=(batch,) * n,
            peak_memory_bytes=(200 + 10 * k) * 2**20,
            memory_method="vmhwm",
            eval_loss_start=6.1,
            eval_loss_end=None if n < steps else 4.5 + 0.01 * k,
            trained_tokens=tuple(r // 2 for r in real),
            model_flops=tuple(1e6 * r for r in real),
            executed_flops=tuple(1e6 * p for p in padded[name][:n]),
            cpu_user_s=10.0,
            cpu_sys_s=sys_s if name == "padding" else 0.5,
            max_rss_bytes=(300 + 10 * k) * 2**20,
            allocator="glibc-tuned",
        )
        if n == steps:
            done.append(name)
    status = RunStatus("complete", tuple(done))
    if interrupted_at is not None:
        status = RunStatus("interrupted", tuple(done), strategies[-1], interrupted_at)
    config = RunConfig(
        model="tiny-gpt2",
        data="synthetic",
        strategies=tuple(strategies),
        steps=steps,
        batch_size=batch,
        max_length=max_length,
        mode="same-examples",
        seed=seed,
        device="cpu",
        dtype="float32",
        grad_accumulation=1,
        warmup_steps=1,
        lr=1e-3,
    )
    env = Environment(
        python="3.11.7",
        torch="2.13.0+cpu",
        transformers="5.24.0",
        padless="0.1.0",
        os="Linux",
        device="cpu",
        device_name="Test CPU <x86>",
        cpu_model="Test CPU <x86>",
        cpu_count=2,
        cpu_available=2,
        torch_threads=2,
        date="2026-01-01T00:00:00+00:00",
    )
    return BenchResults(
        config,
        env,
        runs,
        tuple(lengths),
        status,
        padless_version="0.1.0",
        peak_flops_per_s=1e9,
        peak_gemm="2048 x 64 x 256 float32",
    )


# --- schema -------------------------------------------------------------------------------------


def check_documents(rows, lengths, max_length):
    """Every sequence is one document of one row, whole, exactly once; rows fit. The sequences are made so
    that sequence ``i`` is ``lengths[i]`` copies of the token ``i`` (``padless pack`` and export tests)."""
    seen = []
    for row in rows:
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["labels"]) <= max_length
        at = 0
        for n in row["seq_lengths"]:
            doc = row["input_ids"][at : at + n]
            assert len(set(doc)) == 1 and n == lengths[doc[0]]
            seen.append(doc[0])
            at += n
    assert sorted(seen) == list(range(len(lengths)))
