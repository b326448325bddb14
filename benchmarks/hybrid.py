"""Benchmark: a hybrid model's training step (forward + backward) packed vs padded vs bucketed.

Tiny hybrid configs, wider than the tests' (hidden 256, 4 layers: 3 token mixers of the family's own
kind + 1 softmax attention layer, vocabulary 512): Qwen3.5 text (gated DeltaNet), Bamba (Mamba2
mixers), LFM2 (short convolutions). Each step trains the same 16 documents of lognormal lengths
(median 120, sigma 0.7, at most 512 tokens) in four ways, measured interleaved in one process:

- ``packed``: rows of 512 tokens from :class:`padless.PackingCollator` with the padless attention
  backend (``cu_seq_lens``) and :func:`padless.attention.mixers.enable_per_document_mixers`: each mixer runs per
  document, documents of similar length batched and right-padded
- ``packed-sdpa``: the same rows with SDPA and the 4D block mask
- ``padded``: one batch of all 16 documents padded to the longest (SDPA, 2D padding mask)
- ``bucketed``: the documents sorted by length, micro-batches of 4 padded to their longest,
  gradients accumulated

Before timing, each way's token losses are checked against ``padded``'s (the same tokens on the same
weights: packed rows are exact; the default init is small, so this is a smoke check, the exactness
proof is tests/attention/test_mixers.py). Reported: the best step time of interleaved repeats,
real tokens per second, and each way's time relative to ``packed``. Only ratios are meaningful;
the load average is printed because the machine may be shared.
Run: ``PYTHONPATH=src .venv/bin/python benchmarks/hybrid.py [--out docs/bench/hybrid.txt]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import padless  # noqa: E402
from attention import best_times  # noqa: E402  (the interleaved best-of timer of the attention benchmark)
from padless.attention.mixers import enable_per_document_mixers  # noqa: E402

VOCAB, ROW = 512, 512
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


def lengths(seed: int, n: int = 16, median: float = 120.0, sigma: float = 0.7) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), 2, ROW).astype(int).tolist()


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


def ways(family: str, feats: list[dict], bucket: int) -> dict[str, tuple[torch.nn.Module, list[dict]]]:
    """Way name -> (model, micro-batches of one step); every model holds the same weights."""
    padless.register_padless_attention()
    torch.manual_seed(0)
    config = CONFIGS[family]()
    base = T.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    state = base.state_dict()

    def model(attn: str, per_document: bool) -> torch.nn.Module:
        m = T.AutoModelForCausalLM.from_config(config, attn_implementation=attn).train()
        m.load_state_dict(state)
        if per_document:
            enable_per_document_mixers(m)
        return m

    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    buckets = [[feats[i] for i in order[at : at + bucket]] for at in range(0, len(order), bucket)]
    pad = padless.PaddingCollator()
    packed, packed_sdpa = model("padless", True), model("sdpa", True)
    return {
        "packed": (packed, [padless.PackingCollator.for_model(packed, max_length=ROW)(feats)]),
        "packed-sdpa": (packed_sdpa, [padless.PackingCollator.for_model(packed_sdpa, max_length=ROW)(feats)]),
        "padded": (base, [pad(feats)]),
        "bucketed": (base, [pad(b) for b in buckets]),
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


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "unavailable"


def run(families: list[str], repeats: int, bucket: int, seed: int) -> list[str]:
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
             f"transformers {T.__version__}, threads {torch.get_num_threads()}",
             f"loadavg before: {loadavg()}", ""]  # fmt: skip
    columns = ["rows x len", "padded tok", "real tok", "step ms", "tok/s", "vs packed", "loss diff"]
    widths = [12, 10, 8, 9, 8, 9, 9]
    lines.append(f"{'family':14s} {'way':12s} " + " ".join(f"{c:>{w}s}" for c, w in zip(columns, widths, strict=True)))
    for family in families:
        doc_lengths = lengths(seed)
        feats = features(doc_lengths, seed)
        real = sum(doc_lengths) - len(doc_lengths)  # predicted tokens: all but each document's first
        plan = ways(family, feats, bucket)
        reference = step(*plan["padded"])
        diffs = {name: (step(m, b) - reference).abs().max().item() for name, (m, b) in plan.items()}
        times = best_times({name: (lambda m=m, b=b: step(m, b)) for name, (m, b) in plan.items()}, repeats)
        for name, (_, batches) in plan.items():
            shape = " + ".join(f"{b['input_ids'].shape[0]}x{b['input_ids'].shape[1]}" for b in batches)
            shape = shape if len(shape) <= 12 else f"{len(batches)} batches"
            padded = sum(b["input_ids"].numel() for b in batches)
            t = times[name]
            lines.append(
                f"{family:14s} {name:12s} {shape:>12s} {padded:10d} {real:8d} {t * 1e3:9.1f} "
                f"{real / t:8.0f} {t / times['packed']:8.2f}x {diffs[name]:9.1e}"
            )
        lines.append("")
        print("\n".join(lines[-len(plan) - 1 :]), flush=True)  # progress: a family's rows as soon as measured
    lines.append(f"loadavg after: {loadavg()}")
    lines.append(
        "'vs packed': step time / packed step time (>1: slower than packed). 'loss diff': max |token loss - "
        "padded's| over the sorted token losses of the step, checked before timing."
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (at least)")
    parser.add_argument("--bucket", type=int, default=4, help="documents per bucketed micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    lines = run(args.families.split(","), args.repeats, args.bucket, args.seed)
    text = "\n".join(lines) + "\n"
    print("\n" + text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"$ PYTHONPATH=src python benchmarks/hybrid.py {' '.join(sys.argv[1:])}\n\n{text}")


if __name__ == "__main__":
    main()
