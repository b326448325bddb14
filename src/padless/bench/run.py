"""``padless bench``, the parent's side: fine-tune one model with each batching strategy and measure
them side by side (each strategy's training itself is :mod:`padless.bench.train`).

Every strategy starts from the same initial weights (same seed), uses the same optimiser, schedule
and example order, and trains the same number of optimiser steps. Two modes:

- ``same-examples``: every optimiser step trains the same examples under every strategy, so the
  loss curves are comparable step by step; the strategies differ only in how the step is batched.
- ``token-budget``: every step feeds at most ``token_budget`` tokens, padding included. Packing fills
  them with real tokens, padding spends part of them on pad; compare loss against tokens trained.

Timing covers a whole optimiser step: collation, forward, backward and the optimiser update. Warm-up
steps are excluded from the timing figures. Ctrl-C stops the run and still writes what was measured
(``status.state == "interrupted"``).

Every strategy runs in its own process (padless/bench/isolate.py) unless ``in_process`` is set or
the run is distributed: the parent measures the machine's peak (a timed GEMM of the model's shapes),
starts one child per strategy with the chosen allocator, all at once, and steps them in turn (step 1
of every strategy, then step 2 of every strategy, ...; one step runs at a time), so load on the
machine that comes and goes falls on every strategy alike; it gathers their results and reports them
side by side. In process (and distributed), the strategies run one after another. Every strategy gets the same optimisations: the LM head only on trained tokens
(unless ``full_logits``), fp32 master weights under autocast for a 16-bit ``dtype``; with
``compile``, the same :func:`padless.compile_layers` of the decoder layers (after the first
held-out evaluation; the last one runs eager), and with ``pad_to_multiple_of`` the same rounding
of every row length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any  # torch is imported where used: `padless bench --help` imports this module

from padless.bench.config import RunConfig
from padless.bench.parallel import init_distributed
from padless.bench.train import load_data, resolve_device_dtype, run_one_strategy


def _gemm_shapes(cfg: RunConfig) -> list[tuple[int, int, int]]:
    """The model's GEMMs for the peak measurement: rows of one micro-batch (at most 2048)."""
    from padless.bench.flops import ModelShape
    from padless.bench.peak import gemm_shapes
    from padless.models.factory import model_config

    return gemm_shapes(ModelShape.from_config(model_config(cfg.model)), min(2048, cfg.batch_size * cfg.max_length))


def _tokenizer_name(cfg: RunConfig) -> str | None:
    """The tokenizer the run reads its data with (what results.json records): ``cfg.tokenizer``, else
    the model's; ``None`` for a model without one (the tiny test models, fed token ids)."""
    from padless.models.factory import tokenizer_name_for

    if cfg.processor is not None:
        return f"{cfg.processor} processor's tokenizer"
    try:
        return cfg.tokenizer or tokenizer_name_for(cfg.model)
    except ValueError:
        return None


def run_benchmark(cfg: RunConfig, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Run every strategy of ``cfg``, write ``results.json`` and the report into ``out_dir`` (rank 0
    writes for every rank) and return the results path.

    Ctrl-C ends the run early; what was measured is still written, with ``status.state ==
    "interrupted"``.
    """
    import dataclasses

    import torch

    from padless._version import __version__
    from padless.bench.measure import environment_snapshot
    from padless.bench.peak import measure_peak_flops
    from padless.bench.report import write_report
    from padless.bench.results import BenchResults, RunStatus, save_results
    from padless.devices import dtype_name

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank, world_size = init_distributed(cfg.device, cfg.distributed)
    device, dtype = resolve_device_dtype(cfg)
    peak, peak_gemm = measure_peak_flops(_gemm_shapes(cfg), device, dtype)
    isolated = not cfg.in_process and world_size == 1 and cfg.distributed == "ddp"  # FSDP2 keeps its one group
    runs: dict[str, Any] = {}
    done: list[str] = []
    status = RunStatus("complete", ())
    lengths: tuple[int, ...] = ()
    data = None if isolated else load_data(cfg)
    if isolated:  # every strategy in its own process, stepped in turn (padless/bench/isolate.py)
        from padless.bench.isolate import run_interleaved

        for name, (run, at, child_lengths) in run_interleaved(cfg, cfg.strategies, progress=progress).items():
            runs[name], lengths = run, lengths or child_lengths
            if at is None:
                done.append(name)
            elif status.state == "complete":
                status = RunStatus("interrupted", (), name, at)
        if status.state != "complete":
            status = dataclasses.replace(status, strategies_done=tuple(done))
    for name in () if isolated else cfg.strategies:
        assert data is not None
        run, at = run_one_strategy(
            cfg, name, data, device=device, dtype=dtype, world=(rank, world_size), progress=progress
        )
        lengths = tuple(len(f["input_ids"]) for f in data[0])
        runs[name] = run
        if at is not None:
            status = RunStatus("interrupted", tuple(done), name, at)
            break
        done.append(name)
    resolved = dataclasses.replace(
        cfg,
        device=str(device),
        dtype=dtype_name(dtype),
        world_size=world_size,
        tokenizer=_tokenizer_name(cfg),
        token_budget=(cfg.token_budget or cfg.batch_size * cfg.max_length) if cfg.mode == "token-budget" else None,
    )
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
    return path
