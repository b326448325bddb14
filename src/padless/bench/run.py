"""``padless bench``: fine-tune one model with each batching strategy and measure them side by side.

Every strategy starts from the same initial weights (same seed), uses the same optimiser, schedule
and example order, and trains the same number of optimiser steps. Two modes:

- ``same-examples``: every optimiser step trains the same examples under every strategy, so the
  loss curves are comparable step by step; the strategies differ only in how the step is batched.
- ``token-budget``: every step feeds at most ``token_budget`` tokens, padding included. Packing fills
  them with real tokens, padding spends part of them on pad; compare loss against tokens trained.

Timing covers a whole optimiser step: collation, forward, backward and the optimiser update. Warm-up
steps are excluded from the timing figures. Ctrl-C stops the run and still writes what was measured.

Every strategy runs in its own process (padless/bench/isolate.py) unless ``in_process`` is set or
the run is distributed: the parent measures the machine's peak (a timed GEMM of the model's shapes),
starts one child per strategy with the chosen allocator, gathers their results and reports them
side by side. Every strategy gets the same optimisations: the LM head only on trained tokens
(unless ``full_logits``), fp32 master weights under autocast for a 16-bit ``dtype``; with
``compile``, the same :func:`padless.compile_layers` of the decoder layers (after the first
held-out evaluation; the last one runs eager), and with ``pad_to_multiple_of`` the same rounding
of every row length.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from padless.bench.config import RunConfig
from padless.bench.steps import same_example_steps, token_budget_steps
from padless.bench.strategies import BENCH_STRATEGIES, BatchingOptions

COMPILE_BACKEND = "inductor"
"""torch.compile backend of ``--compile`` (what results.json records per strategy)."""

if TYPE_CHECKING:
    from padless.bench.results import StrategyRun


# --------------------------------------------------------------------------- training


def evaluate(
    model: Any, features: Sequence[dict[str, Any]], batch_size: int, pad_token_id: int, trained_logits_only: bool = True,
    autocast: Any = None,
) -> float:
    """Token-normalised loss over held-out examples, computed the same way for every strategy
    (packed rows on SDPA, each example exactly as if run alone: :func:`padless.packed_eval_loss`),
    so the figures are comparable."""
    from padless.objectives.evaluation import packed_eval_loss

    original = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    model.eval()
    try:
        with autocast or contextlib.nullcontext():
            result = packed_eval_loss(model, features, batch_size=batch_size, pad_token_id=pad_token_id,
                                      trained_logits_only=trained_logits_only)  # fmt: skip
    finally:
        model.set_attn_implementation(original)
        model.train()
    return result.total


def _all_reduce_step(counts: list[float], device: Any) -> list[float]:
    """[time, loss, real, padded, sequences, ...] of this rank -> max time, summed rest over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(counts[:1], dtype=torch.float64, device=device)
    rest = torch.tensor(counts[1:], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(rest)
    return [t.item(), *rest.tolist()]


def _compile(model: Any, mode: str) -> Any:
    """``padless.compile_layers`` with inductor for ``mode`` static or dynamic; ``None`` for off."""
    if mode == "off":
        return None
    from padless.models.compile import compile_layers

    return compile_layers(model, backend=COMPILE_BACKEND, dynamic=mode == "dynamic")


def _eager_if(on: bool) -> Any:
    """A context that runs compiled code eagerly (``torch.compiler.set_stance``), when ``on``."""
    import torch

    return torch.compiler.set_stance("force_eager") if on else contextlib.nullcontext()


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

    from padless.batching.batch import batch_to
    from padless.bench.flops import ModelShape, executed_step_flops, needed_step_flops
    from padless.bench.measure import CpuTimes, StepTimer, synchronizer
    from padless.bench.strategies import packing_attention
    from padless.objectives.loss import model_loss, step_num_items
    from padless.models.factory import build_model
    from padless.devices import is_half_precision

    strategy = BENCH_STRATEGIES[name]
    attn = packing_attention(cfg.model, device, dtype) if name == "packing" else strategy.attn_implementation
    # a 16-bit dtype computes under autocast over fp32 master weights: AdamW's small updates would
    # round away in bf16 weights (at lr 5e-5 most of them do)
    half = is_half_precision(dtype)
    model = build_model(cfg.model, attn_implementation=attn, seed=cfg.seed, dtype=torch.float32 if half else dtype)
    if cfg.lora is not None:  # every strategy trains the same adapter; packing reads through the wrapper
        from padless.models.lora import with_lora

        model = with_lora(model, cfg.lora)
    model = model.to(device)
    model.train()
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if half else contextlib.nullcontext
    shape = ModelShape.from_config(model.config)
    opts = BatchingOptions(
        batch_size=cfg.batch_size,
        max_length=None,  # a micro-batch's examples packed into one padding-free row
        pad_token_id=pad_token_id,
        vocab_size=model.config.vocab_size,
        pad_to_multiple_of=cfg.pad_to_multiple_of,
    )
    batcher = strategy.make_batcher(opts, model)
    rank, world_size = world
    trained = model
    if world_size > 1:  # gradients all-reduced in backward; the loss undoes DDP's averaging
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    scheduler = _schedule(optimizer, cfg.warmup_steps, cfg.steps)
    only = not cfg.full_logits
    recorder.eval_loss_start = evaluate(model, evals, cfg.batch_size, pad_token_id, only, autocast())
    counter = _compile(model, cfg.compile)  # after the first evaluation, which runs eager
    if counter is not None:
        recorder.compile_mode = (cfg.compile, COMPILE_BACKEND)
    timer = StepTimer(sync=synchronizer(device))
    recorder.cpu_times = cpu = CpuTimes()
    memory.start()
    cpu.start()
    show = progress and rank == 0
    for indices in tqdm(step_indices, desc=f"{name:>10}", unit="step", disable=not show, leave=False):
        feats = [train[i] for i in indices]
        with timer.step():
            micro = [batch_to(b, device) for b in batcher(feats)]
            n = step_num_items(micro)
            total = torch.zeros((), device=device)
            for batch in micro:
                with autocast():
                    loss = model_loss(trained, batch, n, world_size=world_size, trained_logits_only=only)
                loss.backward()
                total += loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step_loss = total.item()  # waits for the step on an accelerator
        lengths = [len(f["input_ids"]) for f in feats]
        # this rank's share of n (all ranks' trained tokens): its own micro-batches' targets
        mine = int(step_num_items(micro, all_ranks=False))
        counts = [timer.times_s[-1], step_loss / world_size, sum(lengths),
                  sum(int(b["input_ids"].numel()) for b in micro), len(feats), mine,
                  needed_step_flops(shape, lengths, mine), executed_step_flops(shape, micro, mine, cfg.full_logits)]  # fmt: skip
        if world_size > 1:  # the step of the slowest rank; tokens, FLOPs and loss summed over ranks
            counts = _all_reduce_step(counts, device)
        recorder.record_step(step_time_s=counts[0], loss=counts[1], real_tokens=int(counts[2]),
                             padded_tokens=int(counts[3]), sequences=int(counts[4]), trained_tokens=int(counts[5]),
                             model_flops=counts[6], executed_flops=counts[7],
                             compile_stats=None if counter is None else counter.stats())  # fmt: skip
    cpu.stop()
    peak = memory.stop()
    with _eager_if(counter is not None):  # the held-out loss is not what compile is measured on
        recorder.eval_loss_end = evaluate(model, evals, cfg.batch_size, pad_token_id, only, autocast())
    if counter is not None:
        counter.close()
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


def resolve_device_dtype(cfg: RunConfig) -> tuple[Any, Any]:
    """The run's torch device and compute dtype (padless.devices.resolve_device / resolve_dtype)."""
    from padless.devices import resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    return device, resolve_dtype(cfg.dtype, device)


def _load(cfg: RunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Tokenized train and eval features (a seeded split) and the pad token id."""
    from padless.data import load_corpus, load_tokenizer
    from padless.models.factory import tokenizer_name_for

    tokenizer = load_tokenizer(cfg.tokenizer or tokenizer_name_for(cfg.model))
    corpus = load_corpus(cfg.data, tokenizer, train_on=cfg.train_on, max_length=cfg.max_length,
                         overlong="truncate", limit=cfg.limit, seed=cfg.seed)  # fmt: skip
    features = corpus.features()
    order = np.random.default_rng(cfg.seed).permutation(len(features))
    if len(features) <= cfg.eval_examples:
        raise ValueError(f"{cfg.data} has {len(features)} examples; eval_examples={cfg.eval_examples} leaves none to train on")
    evals = [features[i] for i in order[: cfg.eval_examples]]
    train = [features[i] for i in order[cfg.eval_examples :]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return train, evals, int(pad if pad is not None else 0)


def strategy_steps(cfg: RunConfig, name: str, lengths: np.ndarray, world: tuple[int, int] = (0, 1)) -> list[np.ndarray]:
    """This rank's example indices of every step of strategy ``name`` (see the module docstring)."""
    rank, world_size = world
    if cfg.mode == "same-examples":  # each rank takes every world_size-th example of a global step
        per_rank = cfg.batch_size * cfg.grad_accumulation
        return [s[rank::world_size] for s in same_example_steps(lengths.size, cfg.steps, per_rank * world_size, cfg.seed)]
    budget = cfg.token_budget or cfg.batch_size * cfg.max_length
    return token_budget_steps(name, lengths, cfg.steps * world_size, budget, cfg.seed)[rank::world_size]


def run_one_strategy(
    cfg: RunConfig, name: str, data: tuple[list[dict[str, Any]], list[dict[str, Any]], int], *,
    device: Any, dtype: Any, world: tuple[int, int] = (0, 1), progress: bool = True, allocator: str | None = None,
    own_process: bool = False,
) -> tuple[StrategyRun, int | None]:
    """Train strategy ``name`` and return its measurements and, when interrupted (Ctrl-C), the number
    of steps it completed (``None``: it finished). ``own_process``: the process exists for this
    strategy alone, so its lifetime peak RSS is the strategy's."""
    from padless.bench.measure import PeakMemory, StrategyRecorder, max_rss_bytes

    train, evals, pad_token_id = data
    lengths = np.array([len(f["input_ids"]) for f in train], dtype=np.int64)
    steps = strategy_steps(cfg, name, lengths, world)
    memory, recorder = PeakMemory(device), StrategyRecorder()
    interrupted = None
    try:
        peak = train_strategy(name, cfg, train, evals, steps, device=device, dtype=dtype, pad_token_id=pad_token_id,
                              recorder=recorder, memory=memory, progress=progress, world=world)  # fmt: skip
    except KeyboardInterrupt:
        peak, interrupted = memory.stop(), len(recorder.step_time_s)
    rss = max_rss_bytes() if own_process else None
    return recorder.result(peak, memory.method, max_rss_bytes=rss, allocator=allocator), interrupted


def _gemm_shapes(cfg: RunConfig) -> list[tuple[int, int, int]]:
    """The model's GEMMs for the peak measurement: rows of one micro-batch (at most 2048) through the
    attention projection, the MLP and the LM head."""
    from padless.bench.flops import ModelShape
    from padless.models.factory import model_config

    shape = ModelShape.from_config(model_config(cfg.model))
    rows = min(2048, cfg.batch_size * cfg.max_length)
    q = shape.heads * shape.head_dim
    return [(rows, shape.hidden, q), (rows, shape.hidden, shape.intermediate), (rows, shape.intermediate, shape.hidden),
            (rows, shape.hidden, shape.vocab)]  # fmt: skip


def run_benchmark(cfg: RunConfig, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Run every strategy of ``cfg``, write ``results.json`` and the report into ``out_dir``.

    Returns the results path. Ctrl-C ends the run early; what was measured is still written, with
    ``status.state == "interrupted"``.
    """
    import dataclasses

    import torch

    from padless import __version__
    from padless.bench.measure import environment_snapshot, measure_peak_flops
    from padless.bench.report import format_summary_table, write_report
    from padless.bench.results import BenchResults, RunStatus, save_results

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank, world_size = _init_distributed(cfg)
    device, dtype = resolve_device_dtype(cfg)
    peak, peak_gemm = measure_peak_flops(_gemm_shapes(cfg), device, dtype)
    isolated = not cfg.in_process and world_size == 1
    runs: dict[str, Any] = {}
    done: list[str] = []
    status = RunStatus("complete", ())
    lengths: tuple[int, ...] = ()
    data = None if isolated else _load(cfg)
    for name in cfg.strategies:
        if isolated:
            from padless.bench.isolate import run_in_child

            run, at, child_lengths = run_in_child(cfg, name, progress=progress)
            lengths = lengths or child_lengths
        else:
            assert data is not None
            run, at = run_one_strategy(cfg, name, data, device=device, dtype=dtype, world=(rank, world_size),
                                       progress=progress)  # fmt: skip
            lengths = tuple(len(f["input_ids"]) for f in data[0])
        runs[name] = run
        if at is not None:
            status = RunStatus("interrupted", tuple(done), name, at)
            print("\ninterrupted: writing what was measured so far", file=sys.stderr)
            break
        done.append(name)
    resolved = dataclasses.replace(cfg, device=str(device), dtype=str(dtype).removeprefix("torch."), world_size=world_size,
                                   token_budget=(cfg.token_budget or cfg.batch_size * cfg.max_length)
                                   if cfg.mode == "token-budget" else None)  # fmt: skip
    results = BenchResults(
        config=resolved,
        environment=environment_snapshot(device),
        strategies=runs,
        lengths=lengths,
        status=status,
        padless_version=__version__,
        peak_flops_per_s=peak,
        peak_gemm=peak_gemm,
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
