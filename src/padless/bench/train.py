"""One strategy's training, the part of ``padless bench`` that runs in the strategy's own process
(:mod:`padless.bench.child`) or in the parent (``in_process``, or under ``torchrun``): the data, the
steps, the loop and its measurements. The parent's side is :mod:`padless.bench.run`.

Every strategy starts from the same initial weights (same seed), uses the same optimiser, schedule
and example order, and trains the same number of optimiser steps (see :mod:`padless.bench.run` for
the two modes). Timing covers a whole optimiser step: collation, forward, backward and the optimiser
update; the step's trained-token count is taken from the collated batches before they move to the
device, and its loss read after the timed region, so the step holds no host sync of its own beyond
the timer's. A 16-bit ``dtype`` computes under autocast over fp32 master weights; ``float16`` also
scales the loss (``torch.amp.GradScaler``), as fp16 training must, or small gradients underflow to 0.
Across ranks the loop goes through :mod:`padless.bench.parallel`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any  # torch is imported where used: `padless bench --help` imports this module

import numpy as np

from padless.bench.config import RunConfig
from padless.bench.steps import same_example_steps, token_budget_steps
from padless.bench.strategies import BENCH_STRATEGIES, BatchingOptions

if TYPE_CHECKING:
    from padless.bench.results import StrategyRun

COMPILE_BACKEND = "inductor"
"""torch.compile backend of ``--compile`` (what results.json records per strategy)."""

Data = tuple[list[dict[str, Any]], list[dict[str, Any]], int]
"""Train features, held-out features, pad token id (:func:`load_data`)."""


def evaluate(
    model: Any,
    features: Sequence[dict[str, Any]],
    batch_size: int,
    pad_token_id: int,
    trained_logits_only: bool = True,
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
            result = packed_eval_loss(
                model,
                features,
                batch_size=batch_size,
                pad_token_id=pad_token_id,
                trained_logits_only=trained_logits_only,
            )
    finally:
        model.set_attn_implementation(original)
        model.train()
    return result.total


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


def grad_scaler(device: Any, dtype: Any) -> Any:
    """``torch.amp.GradScaler`` for the run: enabled for ``float16`` (whose range loses small
    gradients without loss scaling), a pass-through for every other dtype."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


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
    turn: Any = None,
) -> int | None:
    """Train one strategy from scratch (same seed, same init), record every step into ``recorder``
    and return the peak memory of its training phase (bytes). ``turn``: called before every step,
    outside its timing; it blocks until this strategy may run the step (interleaved strategies,
    :func:`padless.bench.isolate.run_interleaved`)."""
    import torch
    from tqdm.auto import tqdm

    from padless.batching.batch import batch_to
    from padless.bench.flops import ModelShape, executed_step_flops, needed_step_flops
    from padless.bench.parallel import agree_count, all_reduce_step, fillers, wrap_model
    from padless.bench.strategies import packing_attention
    from padless.bench.timing import CpuTimes, StepTimer, synchronizer
    from padless.devices import is_half_precision
    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss, step_num_items

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
    frozen = cfg.lora is not None  # LoRA: no weight gradients for the base model (padless/bench/flops.py)
    opts = BatchingOptions(
        batch_size=cfg.batch_size,
        max_length=None,  # a micro-batch's examples packed into one padding-free row
        pad_token_id=pad_token_id,
        vocab_size=model.config.get_text_config().vocab_size,
        pad_to_multiple_of=cfg.pad_to_multiple_of,
    )
    batcher = strategy.make_batcher(opts, model)
    rank, world_size = world
    parallel = wrap_model(model, device, world_size, cfg.distributed)  # the loss undoes DDP's / FSDP2's averaging
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    scheduler = _schedule(optimizer, cfg.warmup_steps, cfg.steps)
    scaler = grad_scaler(device, dtype)
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
        if turn is not None:
            turn()
        with timer.step():
            # every host-side count and collective first, on the host-side batches: a sync here waits
            # for nothing of this step (the timer already waited for the last one)
            collated = batcher(feats)
            n = step_num_items(collated)
            mine = int(step_num_items(collated, all_ranks=False))
            extra = fillers(collated, agree_count(len(collated), device, world_size))
            extra_items = int(step_num_items(extra, all_ranks=False)) if extra else 0
            micro = [batch_to(b, device) for b in collated]
            fed = [*micro, *(batch_to(b, device) for b in extra)]
            total = torch.zeros((), device=device)
            for i, batch in enumerate(fed):
                with parallel.sync(i == len(fed) - 1):
                    with autocast():
                        loss = model_loss(parallel.module, batch, n, world_size=world_size, trained_logits_only=only)
                    if i >= len(micro):  # a filler: the same collectives, nothing learned
                        loss = loss * 0.0
                    scaler.scale(loss).backward()
                total += loss.detach()
            scaler.unscale_(optimizer)  # clip the true gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        step_loss = total.item()  # after the timer's sync: no wait of its own
        lengths = [len(f["input_ids"]) for f in feats]
        # this rank's share of n (all ranks' trained tokens): its own micro-batches' targets; what it
        # fed and executed includes its fillers (the price of uneven micro-batch counts across ranks)
        counts = [timer.times_s[-1], step_loss / world_size, sum(lengths),
                  sum(int(b["input_ids"].numel()) for b in fed), len(feats), mine,
                  needed_step_flops(shape, lengths, mine, frozen_weights=frozen),
                  executed_step_flops(shape, fed, mine + extra_items, cfg.full_logits, frozen_weights=frozen)]  # fmt: skip
        if world_size > 1:  # the step of the slowest rank; tokens, FLOPs and loss summed over ranks
            counts = all_reduce_step(counts, device)
        recorder.record_step(
            step_time_s=counts[0],
            loss=counts[1],
            real_tokens=int(counts[2]),
            padded_tokens=int(counts[3]),
            sequences=int(counts[4]),
            trained_tokens=int(counts[5]),
            model_flops=counts[6],
            executed_flops=counts[7],
            compile_stats=None if counter is None else counter.stats(),
        )
    cpu.stop()
    peak = memory.stop()
    with _eager_if(counter is not None):  # the held-out loss is not what compile is measured on
        recorder.eval_loss_end = evaluate(model, evals, cfg.batch_size, pad_token_id, only, autocast())
    if counter is not None:
        counter.close()
    return peak


def resolve_device_dtype(cfg: RunConfig) -> tuple[Any, Any]:
    """The run's torch device and compute dtype (padless.devices.resolve_device / resolve_dtype)."""
    from padless.devices import resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    return device, resolve_dtype(cfg.dtype, device)


def load_data(cfg: RunConfig) -> Data:
    """Tokenized train and eval features (a seeded split) and the pad token id."""
    from padless.bench.captions import CAPTIONS, captions_file
    from padless.data import load_corpus, load_tokenizer
    from padless.models.factory import tokenizer_name_for

    processor = None
    if cfg.processor is not None:
        from padless.data.shards import cached_processor

        processor = cached_processor(cfg.processor)
    tokenizer = (
        processor.tokenizer if processor is not None else load_tokenizer(cfg.tokenizer or tokenizer_name_for(cfg.model))
    )
    data: Any = cfg.data
    if cfg.data == CAPTIONS:  # built offline for the vision-language preset
        data = captions_file(cfg.seed)
    corpus = load_corpus(
        data,
        tokenizer,
        processor=processor,
        train_on=cfg.train_on,
        max_length=cfg.max_length,
        overlong="truncate",
        limit=cfg.limit,
        seed=cfg.seed,
    )
    features = corpus.features()
    order = np.random.default_rng(cfg.seed).permutation(len(features))
    if len(features) <= cfg.eval_examples:
        raise ValueError(
            f"{cfg.data} has {len(features)} examples; eval_examples={cfg.eval_examples} leaves none to train on"
        )
    evals = [features[i] for i in order[: cfg.eval_examples]]
    train = [features[i] for i in order[cfg.eval_examples :]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return train, evals, int(pad if pad is not None else 0)


def strategy_steps(cfg: RunConfig, name: str, lengths: np.ndarray, world: tuple[int, int] = (0, 1)) -> list[np.ndarray]:
    """This rank's example indices of every step of strategy ``name`` (see :mod:`padless.bench.run`)."""
    rank, world_size = world
    if cfg.mode == "same-examples":  # each rank takes every world_size-th example of a global step
        per_rank = cfg.batch_size * cfg.grad_accumulation
        return [
            s[rank::world_size] for s in same_example_steps(lengths.size, cfg.steps, per_rank * world_size, cfg.seed)
        ]
    budget = cfg.token_budget or cfg.batch_size * cfg.max_length
    return token_budget_steps(name, lengths, cfg.steps * world_size, budget, cfg.seed)[rank::world_size]


def run_one_strategy(
    cfg: RunConfig,
    name: str,
    data: Data,
    *,
    device: Any,
    dtype: Any,
    world: tuple[int, int] = (0, 1),
    progress: bool = True,
    allocator: str | None = None,
    own_process: bool = False,
    turn: Any = None,
) -> tuple[StrategyRun, int | None]:
    """Train strategy ``name`` and return its measurements and, when interrupted (Ctrl-C), the number
    of steps it completed (``None``: it finished). ``own_process``: the process exists for this
    strategy alone, so its lifetime peak RSS is the strategy's."""
    from padless.bench.measure import StrategyRecorder
    from padless.bench.memory import PeakMemory, max_rss_bytes

    train, evals, pad_token_id = data
    lengths = np.array([len(f["input_ids"]) for f in train], dtype=np.int64)
    steps = strategy_steps(cfg, name, lengths, world)
    memory, recorder = PeakMemory(device), StrategyRecorder()
    interrupted = None
    try:
        peak = train_strategy(
            name,
            cfg,
            train,
            evals,
            steps,
            device=device,
            dtype=dtype,
            pad_token_id=pad_token_id,
            recorder=recorder,
            memory=memory,
            progress=progress,
            world=world,
            turn=turn,
        )
    except KeyboardInterrupt:
        peak, interrupted = memory.stop(), len(recorder.step_time_s)
    rss = max_rss_bytes() if own_process else None
    return recorder.result(peak, memory.method, max_rss_bytes=rss, allocator=allocator), interrupted
