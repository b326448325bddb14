"""One strategy of ``padless bench`` in its own process (started by :mod:`padless.bench.isolate`)::

    python -m padless.bench.child CONFIG.json STRATEGY OUT.json ALLOCATOR [--no-progress] [--turns IN OUT]

With ``--turns IN OUT`` (two inherited pipe file descriptors) it runs a step only when the parent
says so: before every step it writes one byte to ``OUT`` (ready: the previous step is done) and waits
for one byte on ``IN`` (go), so the parent can interleave the strategies step by step
(:func:`padless.bench.isolate.run_interleaved`). It trains the strategy (:mod:`padless.bench.train`, the same trainer the parent runs in-process) and
writes its measurements to ``OUT.json`` (atomically); exit status 130 if it was interrupted (what it
measured is still written).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from padless.atomic import atomic_write_text


def _turn_taker(go_fd: int, ready_fd: int) -> Any:
    """The ``turn`` hook of :func:`padless.bench.train.train_strategy`: say ready, wait for go."""

    def turn() -> None:
        os.write(ready_fd, b"r")
        if os.read(go_fd, 1) != b"g":  # the parent is gone or stopping: stop as Ctrl-C would
            raise KeyboardInterrupt

    return turn


def _child(argv: list[str]) -> int:
    from padless.bench.config import RunConfig
    from padless.bench.schema import from_plain
    from padless.bench.train import load_data, resolve_device_dtype, run_one_strategy

    spec, name, out, allocator = argv[:4]
    cfg = from_plain(RunConfig, json.loads(Path(spec).read_text(encoding="utf-8")))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device, dtype = resolve_device_dtype(cfg)
    data = load_data(cfg)
    turn = None
    if "--turns" in argv:
        at = argv.index("--turns")
        turn = _turn_taker(int(argv[at + 1]), int(argv[at + 2]))
    run, at = run_one_strategy(
        cfg,
        name,
        data,
        device=device,
        dtype=dtype,
        progress="--no-progress" not in argv,
        allocator=allocator,
        own_process=True,
        turn=turn,
    )
    payload: dict[str, Any] = {"run": dataclasses.asdict(run), "interrupted_at": at,
                               "lengths": [len(f["input_ids"]) for f in data[0]]}  # fmt: skip
    atomic_write_text(Path(out), json.dumps(payload))
    return 0 if at is None else 130


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
