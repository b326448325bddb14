"""``padless bench``: fine-tune one model with each batching strategy and measure them side by side.

Every strategy starts from the same initial weights (same seed), uses the same optimiser, schedule
and example order, and trains the same number of optimiser steps. Two modes:

- ``same-examples``: every optimiser step trains the same examples under every strategy, so the
  loss curves are comparable step by step; the strategies differ only in how the step is batched.
- ``token-budget``: every step feeds at most ``token_budget`` tokens, padding included. Packing fills
  them with real tokens, padding spends part of them on pad; compare loss against tokens trained.

Timing covers a whole optimiser step: collation, forward, backward and the optimiser update. Warm-up
steps are excluded from the timing figures. Ctrl-C stops the run and still writes what was measured.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from padless.bench.config import RunConfig
from padless.bench.steps import same_example_steps, token_budget_steps
from padless.bench.strategies import STRATEGIES, BatchingOptions


# --------------------------------------------------------------------------- training


def evaluate(
    model: Any, features: Sequence[dict[str, Any]], batch_size: int, pad_token_id: int, trained_logits_only: bool = True
) -> float:
    """Token-normalised loss over held-out examples, computed the same way for every strategy
    (packed rows on SDPA, each example exactly as if run alone: :func:`padless.packed_eval_loss`),
    so the figures are comparable."""
    from padless.evaluation import packed_eval_loss

    original = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    model.eval()
    try:
        result = packed_eval_loss(model, features, batch_size=batch_size, pad_token_id=pad_token_id,
                                  trained_logits_only=trained_logits_only)  # fmt: skip
    finally:
        model.set_attn_implementation(original)
        model.train()
    return result.total


def _all_reduce_step(counts: list[float], device: Any) -> list[float]:
    """[time, loss, real, padded, sequences] of this rank -> max time, summed rest over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(counts[:1], dtype=torch.float64, device=device)
    rest = torch.tensor(counts[1:], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(rest)
    return [t.item(), *rest.tolist()]


def _schedule(optimizer: Any, warmup: int, steps: int) -> Any:
    import torch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_strategy(
    name: str,
    cfg: Any,
    train: Sequence[dict[str, Any]],
    evals: Sequence[dict[str, Any]],
    step_indices: Sequence[np.ndarray],
    *,
    device: Any,
    dtype: Any,
    pad_token_id: int,
    recorder: Any,
    memory: Any,
    progress: bool = True,
    world: tuple[int, int] = (0, 1),
) -> int | None:
    """Train one strategy from scratch (same seed, same init), record every step into ``recorder``
    and return the peak memory of its training phase (bytes)."""
    import torch
    from tqdm.auto import tqdm

    from padless.bench.measure import StepTimer, synchronizer
    from padless.batching.collate import batch_to
    from padless.loss import model_loss, step_num_items
    from padless.models import build_model
    from padless.bench.strategies import packing_attention

    strategy = STRATEGIES[name]
    attn = packing_attention(cfg.model, device, dtype) if name == "packing" else strategy.attn_implementation
    model = build_model(cfg.model, attn_implementation=attn, seed=cfg.seed, dtype=dtype).to(device)
    model.train()
    opts = BatchingOptions(
        batch_size=cfg.batch_size,
        max_length=None,  # a micro-batch's examples packed into one padding-free row
        pad_token_id=pad_token_id,
        vocab_size=model.config.vocab_size,
    )
    batcher = strategy.make_batcher(opts, model)
    rank, world_size = world
    trained = model
    if world_size > 1:  # gradients all-reduced in backward; the loss undoes DDP's averaging
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    scheduler = _schedule(optimizer, cfg.warmup_steps, cfg.steps)
    recorder.eval_loss_start = evaluate(model, evals, cfg.batch_size, pad_token_id, cfg.trained_logits_only)
    timer = StepTimer(sync=synchronizer(device))
    memory.start()
    show = progress and rank == 0
    for indices in tqdm(step_indices, desc=f"{name:>10}", unit="step", disable=not show, leave=False):
        feats = [train[i] for i in indices]
        with timer.step():
            micro = [batch_to(b, device) for b in batcher(feats)]
            n = step_num_items(micro)
            total = torch.zeros((), device=device)
            for batch in micro:
                loss = model_loss(trained, batch, n, world_size=world_size, trained_logits_only=cfg.trained_logits_only)
                loss.backward()
                total += loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step_loss = total.item()  # waits for the step on an accelerator
        counts = [timer.times_s[-1], step_loss / world_size, sum(len(f["input_ids"]) for f in feats),
                  sum(int(b["input_ids"].numel()) for b in micro), len(feats)]  # fmt: skip
        if world_size > 1:  # the step of the slowest rank; tokens and loss summed over ranks
            counts = _all_reduce_step(counts, device)
        recorder.record_step(step_time_s=counts[0], loss=counts[1], real_tokens=int(counts[2]),
                             padded_tokens=int(counts[3]), sequences=int(counts[4]))  # fmt: skip
    peak = memory.stop()
    recorder.eval_loss_end = evaluate(model, evals, cfg.batch_size, pad_token_id, cfg.trained_logits_only)
    return peak


# --------------------------------------------------------------------------- the whole run


def _init_distributed(cfg: RunConfig) -> tuple[int, int]:
    """``(rank, world_size)``; under ``torchrun`` this joins the process group (gloo on CPU, NCCL
    on CUDA)."""
    import torch
    import torch.distributed as dist

    from padless.batching.samplers import world_info

    rank, world_size = world_info()
    if world_size > 1 and not dist.is_initialized():
        on_gpu = torch.cuda.is_available() and cfg.device != "cpu"
        if on_gpu:  # each rank on its own GPU before NCCL starts (else every rank works on GPU 0)
            import os

            index = None if cfg.device == "auto" else torch.device(cfg.device).index
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) if index is None else index)
        dist.init_process_group("nccl" if on_gpu else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return rank, world_size


def _resolve_device(cfg: RunConfig, rank: int = 0) -> tuple[Any, Any]:
    import os

    import torch

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)
    if device.type != "cpu" and device.index is None:  # one accelerator per process under torchrun
        device = torch.device(device.type, int(os.environ.get("LOCAL_RANK", rank)))
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = getattr(torch, cfg.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--dtype {cfg.dtype!r} is not a torch dtype (float32, bfloat16, float16)")
    return device, dtype


def _load(cfg: RunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Tokenized train and eval features (a seeded split) and the pad token id."""
    from padless.data import load_corpus, load_tokenizer
    from padless.models import tokenizer_name_for

    tokenizer = load_tokenizer(cfg.tokenizer or tokenizer_name_for(cfg.model))
    corpus = load_corpus(cfg.data, tokenizer, train_on=cfg.train_on, max_length=cfg.max_length,
                         overlong="truncate", limit=cfg.limit, seed=cfg.seed)  # fmt: skip
    features = corpus.features()
    order = np.random.default_rng(cfg.seed).permutation(len(features))
    if len(features) <= cfg.eval_examples:
        raise ValueError(f"{cfg.data} has {len(features)} examples; --eval-examples {cfg.eval_examples} leaves none to train on")
    evals = [features[i] for i in order[: cfg.eval_examples]]
    train = [features[i] for i in order[cfg.eval_examples :]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return train, evals, int(pad if pad is not None else 0)


def run_benchmark(cfg: RunConfig, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Run every strategy of ``cfg``, write ``results.json`` and the report into ``out_dir``.

    Returns the results path. Ctrl-C ends the run early; what was measured is still written, with
    ``status.state == "interrupted"``.
    """
    from padless import __version__
    from padless.bench.measure import PeakMemory, StrategyRecorder, environment_snapshot
    from padless.bench.report import format_summary_table, write_report
    from padless.bench.results import BenchConfig, BenchResults, RunStatus, save_results

    if cfg.mode not in ("same-examples", "token-budget"):
        raise ValueError(f"unknown --mode {cfg.mode!r}; choose same-examples or token-budget")
    rank, world_size = _init_distributed(cfg)
    device, dtype = _resolve_device(cfg, rank)
    train, evals, pad_token_id = _load(cfg)
    lengths = np.array([len(f["input_ids"]) for f in train], dtype=np.int64)
    budget = cfg.token_budget or cfg.batch_size * cfg.max_length
    if cfg.mode == "same-examples":  # each rank takes every world_size-th example of a global step
        per_rank = cfg.batch_size * cfg.grad_accumulation
        shared = [s[rank::world_size] for s in same_example_steps(len(train), cfg.steps, per_rank * world_size, cfg.seed)]
    memory = PeakMemory(device)
    runs: dict[str, Any] = {}
    done: list[str] = []
    status = RunStatus("complete", ())
    current, recorder = None, None
    try:
        for name in cfg.strategies:
            current, recorder = name, StrategyRecorder()
            if cfg.mode == "same-examples":
                steps = shared
            else:
                steps = token_budget_steps(name, lengths, cfg.steps * world_size, budget, cfg.seed)[rank::world_size]
            peak = train_strategy(name, cfg, train, evals, steps, device=device, dtype=dtype, pad_token_id=pad_token_id,
                                  recorder=recorder, memory=memory, progress=progress, world=(rank, world_size))  # fmt: skip
            runs[name] = recorder.result(peak, memory.method)
            done.append(name)
            current = None
    except KeyboardInterrupt:
        if current is not None and recorder is not None:
            runs[current] = recorder.result(memory.stop(), memory.method)
        status = RunStatus("interrupted", tuple(done), current, len(recorder.step_time_s) if recorder else 0)
        print("\ninterrupted: writing what was measured so far", file=sys.stderr)
    bench_config = BenchConfig(
        model=cfg.model, data=cfg.data, strategies=tuple(cfg.strategies), steps=cfg.steps,
        batch_size=cfg.batch_size, max_length=cfg.max_length, mode=cfg.mode, seed=cfg.seed,
        device=str(device), dtype=str(dtype).removeprefix("torch."), grad_accumulation=cfg.grad_accumulation,
        warmup_steps=cfg.warmup_steps, lr=cfg.lr, token_budget=budget if cfg.mode == "token-budget" else None,
        world_size=world_size,
    )  # fmt: skip
    results = BenchResults(
        config=bench_config,
        environment=environment_snapshot(device),
        strategies=runs,
        lengths=tuple(int(n) for n in lengths),
        status=status,
        padless_version=__version__,
    )
    out = Path(out_dir)
    path = out / "results.json"
    if rank != 0:  # rank 0 writes for everyone
        return path
    out.mkdir(parents=True, exist_ok=True)
    save_results(results, path)
    write_report(results, out)
    print(format_summary_table(results))
    print(f"results: {path}\nreport:  {out / 'report.html'}")
    return path
