"""Benchmark: a hybrid model's training step (forward + backward) packed vs bucketed vs padded, against
the token ideal over bucketing.

Tiny hybrid configs, wider than the tests' (hidden 256, 4 layers: 3 token mixers of the family's own
kind + 1 softmax attention layer, vocabulary 512): Qwen3.5 text (gated DeltaNet), Bamba (Mamba2, the
mixer of Granite 4 / Nemotron-H / Falcon-H1), LFM2 (short convolutions). Two length regimes of 24
lognormal documents each (sigma 0.7): median 120 tokens in rows of 512, median 400 in rows of 2048.
Each step trains the same documents three ways, measured interleaved in one process:

- ``packed``: :class:`padless.PackingCollator` rows, one row per micro-batch, on the exact attention
  backend ``resolve_backend`` picks (padless attention, ``cu_seq_lens``); the token mixers run one
  chunked scan over the row with the boundaries as masks (:mod:`padless.attention.scans`)
- ``bucketed``: the documents sorted by length, micro-batches of 4 padded to their longest (sdpa, 2D
  padding mask), gradients accumulated: the strongest padding baseline
- ``padded``: one batch of all documents padded to the longest

Timed on ONE thread, CPU time (``time.thread_time``) beside wall time, best of interleaved rounds: a
shared machine only ever adds time, and one thread is reproducible where two are not. Reported: the
token ideal over bucketing (bucketing's padded tokens / packed's padded tokens), the measured speedup
over bucketing, and their ratio (the goal: >= 0.95), with each way's peak activation memory per
micro-batch (bytes saved for backward) and the token losses checked equal to padding's before timing.
Run: ``PYTHONPATH=src .venv/bin/python benchmarks/hybrid.py [--out docs/bench/hybrid.txt]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers as T

import padless
from padless.attention.select import resolve_backend

VOCAB = 512
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_hidden_layers=4,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_PATTERN = ["linear_attention"] * 3 + ["full_attention"]

CONFIGS: dict[str, Callable[[], T.PretrainedConfig]] = {
    "qwen3_5_text": lambda: T.Qwen3_5TextConfig(
        **_COMMON,
        layer_types=_PATTERN,
        head_dim=32,
        linear_num_value_heads=8,
        linear_num_key_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
    ),
    "bamba": lambda: T.BambaConfig(
        **_COMMON,
        attn_layer_indices=[3],
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=32,
        mamba_n_groups=1,
        mamba_chunk_size=64,
        mamba_expand=2,
    ),
    "lfm2": lambda: T.Lfm2Config(**_COMMON, layer_types=["conv"] * 3 + ["full_attention"], conv_L_cache=3),
}
REGIMES = {"median 120": (120.0, 512), "median 400": (400.0, 2048)}
"""Regime -> (median document length, packed row length)."""


def lengths(seed: int, median: float, row: int, n: int = 24, sigma: float = 0.7) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), 2, row).astype(int).tolist()


def features(doc_lengths: list[int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(3, VOCAB, n).tolist()} for n in doc_lengths]


def token_losses(model, batch: dict) -> torch.Tensor:
    """``[T]`` next-token cross-entropy of each labelled token of a batch."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**{**inputs, "use_cache": False}).logits
    labels = batch["labels"][:, 1:].reshape(-1)
    keep = labels != -100
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB)[keep].float(), labels[keep], reduction="none")


def ways(family: str, feats: list[dict], row: int, bucket: int) -> dict[str, tuple[torch.nn.Module, list[dict]]]:
    """Way name -> (model, micro-batches of one step); every model holds the same weights."""
    torch.manual_seed(0)
    config = CONFIGS[family]()
    base = T.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    backend = resolve_backend(config=T.AutoModelForCausalLM.from_config(config), max_length=row)
    packed = T.AutoModelForCausalLM.from_config(config, attn_implementation=backend).train()
    packed.load_state_dict(base.state_dict())
    collator = padless.PackingCollator.for_model(packed, max_length=row)
    rows = padless.PackedRows(feats, max_length=row)
    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    buckets = [[feats[i] for i in order[at : at + bucket]] for at in range(0, len(order), bucket)]
    pad = padless.PaddingCollator()
    return {
        "packed": (packed, [collator([rows[i]]) for i in range(len(rows))]),
        "bucketed": (base, [pad(b) for b in buckets]),
        "padded": (base, [pad(feats)]),
    }


def step(model: torch.nn.Module, batches: list[dict]) -> torch.Tensor:
    """One training step's forward + backward; returns the token losses, sorted (ways order the
    documents differently, so equal multisets of losses is what "the same step" means)."""
    model.zero_grad(set_to_none=True)
    losses = []
    for batch in batches:
        loss = token_losses(model, batch)
        loss.sum().backward()
        losses.append(loss.detach())
    return torch.cat(losses).sort().values


def peak_saved_bytes(model: torch.nn.Module, batches: list[dict]) -> int:
    """The most bytes any one micro-batch's forward saves for backward (activation memory), counting
    each storage once."""
    peak = 0
    for batch in batches:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.device.type != "meta":
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = token_losses(model, batch).sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        peak = max(peak, sum(seen.values()))
    return peak


def timed(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """(CPU seconds, wall seconds) of each function per round, rounds interleaved (the order rotating)."""
    for fn in fns.values():
        fn()  # warm-up
    names = list(fns)
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cpu, wall = time.thread_time(), time.perf_counter()
            fns[name]()
            out[name][0].append(time.thread_time() - cpu)
            out[name][1].append(time.perf_counter() - wall)
    return out


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "unavailable"


def run(families: list[str], rounds: int, bucket: int, seed: int) -> list[str]:
    torch.set_num_threads(1)
    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"transformers {T.__version__}, threads {torch.get_num_threads()} (CPU time of that thread)",
        f"loadavg before: {loadavg()}",
        "",
    ]
    head = ["micro-batches", "padded tok", "real tok", "cpu ms", "wall ms", "tok/s cpu", "peak act MB", "loss diff"]
    widths = [13, 10, 8, 8, 8, 9, 11, 9]
    summary = []
    for regime, (median, row) in REGIMES.items():
        lines.append(f"== {regime} (24 documents, rows of {row}, buckets of {bucket})")
        lines.append(f"{'family':14s} {'way':9s} " + " ".join(f"{c:>{w}s}" for c, w in zip(head, widths, strict=True)))
        for family in families:
            doc_lengths = lengths(seed, median, row)
            feats = features(doc_lengths, seed)
            real = sum(doc_lengths) - len(doc_lengths)  # predicted tokens: all but each document's first
            plan = ways(family, feats, row, bucket)
            reference = step(*plan["padded"])
            diffs = {name: (step(m, b) - reference).abs().max().item() for name, (m, b) in plan.items()}
            memory = {name: peak_saved_bytes(m, b) for name, (m, b) in plan.items()}
            times = timed({name: (lambda m=m, b=b: step(m, b)) for name, (m, b) in plan.items()}, rounds)
            best = {name: (min(cpu), min(wall)) for name, (cpu, wall) in times.items()}
            padded = {name: sum(b["input_ids"].numel() for b in batches) for name, (_, batches) in plan.items()}
            for name, (_, batches) in plan.items():
                cpu, wall = best[name]
                lines.append(
                    f"{family:14s} {name:9s} {len(batches):13d} {padded[name]:10d} {real:8d} {cpu * 1e3:8.1f} "
                    f"{wall * 1e3:8.1f} {real / cpu:9.0f} {memory[name] / 2**20:11.1f} {diffs[name]:9.1e}"
                )
            ideal = padded["bucketed"] / padded["packed"]
            speedup = best["bucketed"][0] / best["packed"][0]
            per_round = [b / p for b, p in zip(times["bucketed"][0], times["packed"][0], strict=True)]
            summary.append(
                f"{regime:11s} {family:14s} ideal {ideal:5.2f}x  measured {speedup:5.2f}x (rounds "
                f"{min(per_round):.2f}-{max(per_round):.2f}, median {statistics.median(per_round):.2f})  "
                f"of ideal {speedup / ideal:5.2f}  peak memory packed/bucketed "
                f"{memory['packed'] / memory['bucketed']:.2f}"
            )
            print("\n".join(lines[-len(plan) :]), flush=True)
        lines.append("")
    lines.append("packed over bucketing (CPU time, best of interleaved rounds):")
    lines.extend(summary)
    lines.append("")
    lines.append(f"loadavg after: {loadavg()}")
    lines.append(
        "'ideal': bucketing's padded tokens / packed's. 'of ideal': measured / ideal (goal >= 0.95). "
        "'peak act': the most bytes one micro-batch saves for backward. 'loss diff': max |token loss - "
        "padded's| over the sorted token losses of the step, checked before timing."
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--bucket", type=int, default=4, help="documents per bucketed micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    lines = run(args.families.split(","), args.rounds, args.bucket, args.seed)
    text = "\n".join(lines) + "\n"
    print("\n" + text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"$ PYTHONPATH=src python benchmarks/hybrid.py {' '.join(sys.argv[1:])}\n\n{text}")


if __name__ == "__main__":
    main()
