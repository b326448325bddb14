"""padless in TRL's world, side by side in one run (a benchmark, not a test).

    python benchmarks/integrations.py                       # both parts, ~10 minutes on 2 quiet CPU cores
    python benchmarks/integrations.py --part pack --rows 1000000
    python benchmarks/integrations.py --part sft --limit 240 --repeats 2 --json out.json

(a) ``pack``: ``padless.pack_dataset`` against ``trl.pack_dataset`` on the same tokenized dataset (lengths
    uniform in [10, 500], rows of 2048): time, rows, and the lower bound ceil(tokens / 2048).
(b) ``sft``: one short fine-tune through ``SFTTrainer`` on the ``agentic-rag`` corpus (tiny GPT-2
    architecture, GPT-2 tokenizer, fp32, CPU): TRL's default packing (bfd + its padding-free collator on
    sdpa), TRL padding, and padless inside SFTTrainer (``padless.integrations.trl``, padless attention);
    TRL's defaults otherwise, except fp32 and no gradient checkpointing (SFTConfig turns both on).
    For each: real (non-padding) tokens per second, the final loss, and whether the batches it fed were
    isolated, checked on the trained model by ``padless.isolation.audit`` (each example's logits in
    the batch == alone; no target across examples). Every run trains the same examples for one epoch;
    each kind runs ``--repeats`` times in mirrored order (A B C C B A) and its tokens/s is the mean.

Timings are only comparable within one run of this script; the machine is reported with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

EOS = 50256  # GPT-2's <|endoftext|>: every agentic-rag example ends with it, and only there


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


# ------------------------------------------------------------------------------------------- (a) pack


def token_dataset(rows: int, seed: int) -> Any:
    """``rows`` sequences of uniform(10..500) int32 token ids, built straight in Arrow."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 501, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 50257, int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return Dataset(InMemoryTable(pa.table({"input_ids": column}))), lengths


def pack_benchmark(rows: int, seq_length: int, seed: int) -> list[dict[str, Any]]:
    import trl

    import padless

    ds, lengths = token_dataset(rows, seed)
    bound = -(-int(lengths.sum()) // seq_length)
    runs = [
        ("padless pack_dataset bfd (whole dataset)", lambda: padless.pack_dataset(ds, seq_length)),
        ("trl.pack_dataset bfd (default: map batches of 1,000)", lambda: trl.pack_dataset(ds, seq_length)),
        ("trl.pack_dataset bfd, map_kwargs batch_size=None",
         lambda: trl.pack_dataset(ds, seq_length, map_kwargs={"batch_size": None})),
        ("padless pack_dataset wrapped (pieces stay documents)", lambda: padless.pack_dataset(ds, seq_length, "wrapped")),
        ("trl.pack_dataset wrapped (no document boundaries)", lambda: trl.pack_dataset(ds, seq_length, "wrapped")),
    ]  # fmt: skip
    out = []
    for name, run in runs:
        start = time.perf_counter()
        packed = run()
        seconds = time.perf_counter() - start
        out.append(
            {
                "packer": name,
                "seconds": seconds,
                "rows": packed.num_rows,
                "lower_bound": bound,
                "tokens": int(lengths.sum()),
            }
        )
        del packed
    return out


# -------------------------------------------------------------------------------------------- (b) sft


class Recorder:
    """Wraps a trainer's collator: counts the real tokens it packs and keeps its first batches with the
    spans of their examples (each example ends with EOS), for the isolation audit after training."""

    def __init__(self, collator: Any, keep: int = 2) -> None:
        self.collator, self.keep = collator, keep
        self.real_tokens, self.kept = 0, []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(features)
        lengths = [len(f["input_ids"]) for f in features]
        self.real_tokens += sum(lengths)
        if len(self.kept) < self.keep:
            self.kept.append((batch, self.spans(features, batch)))
        return batch

    @staticmethod
    def spans(features: list[dict[str, Any]], batch: dict[str, Any]) -> list[tuple[int, int, int]]:
        """(row, offset, length) of every example: features are rows (padded / packed) or, in a
        padding-free batch of one row, concatenated; inside a feature examples end with EOS."""
        flat = batch["input_ids"].shape[0] == 1 and len(features) > 1
        spans, offset = [], 0
        for i, feature in enumerate(features):
            ids = [int(t) for t in feature["input_ids"]]
            row, base = (0, offset) if flat else (i, 0)
            start = 0
            for t, token in enumerate(ids):
                if token == EOS:
                    spans.append((row, base + start, t + 1 - start))
                    start = t + 1
            offset += len(ids)
        return spans


def sft_run(
    kind: str,
    examples: Any,
    tokenizer: Any,
    *,
    max_length: int,
    padded_batch: int,
    packed_rows: int,
    out_dir: str,
    model_name: str,
) -> dict[str, Any]:
    import torch
    import trl

    import padless
    from padless.integrations.trl import SFTTrainer as PadlessSFTTrainer
    from padless.isolation.audit import audit_batch

    attn = "padless" if kind == "padless" else "sdpa"
    if attn == "padless":
        padless.register_padless_attention()
    model = padless.build_model(model_name, attn_implementation=attn, seed=0)
    packing = kind != "trl-padding"
    args = trl.SFTConfig(
        output_dir=out_dir,
        packing=packing,
        max_length=max_length,
        num_train_epochs=1,
        per_device_train_batch_size=packed_rows if packing else padded_batch,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        bf16=False,  # SFTConfig's default turns bf16 autocast on, on a CPU too: fp32 for every run
        gradient_checkpointing=False,  # SFTConfig's default recomputes every forward; off for every run
    )
    cls = PadlessSFTTrainer if kind == "padless" else trl.SFTTrainer
    trainer = cls(model=model, args=args, train_dataset=examples, processing_class=tokenizer)
    recorder = Recorder(trainer.data_collator)
    trainer.data_collator = recorder
    result = trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    audit = None
    for batch, spans in recorder.kept:
        one = audit_batch(model, batch, spans, forward_kwargs={"use_cache": False})
        audit = one if audit is None else audit.merge(one)
    seconds = result.metrics["train_runtime"]
    return {
        "run": kind,
        "attention": attn,
        "steps": result.global_step,
        "seconds": seconds,
        "real_tokens": recorder.real_tokens,
        "real_tokens_per_s": recorder.real_tokens / seconds,
        "final_loss": float(np.mean(losses[-10:])),
        "isolated": bool(audit.isolated),
        "max_logit_diff": audit.max_logit_diff,
        "cross_document_targets": audit.cross_document_targets,
        "threads": torch.get_num_threads(),
    }


def sft_benchmark(
    limit: int, max_length: int, padded_batch: int, packed_rows: int, model_name: str, out_dir: str, repeats: int
) -> list[dict[str, Any]]:
    from datasets import Dataset

    import padless

    tokenizer = padless.load_tokenizer("gpt2")
    corpus = padless.load_corpus(
        "agentic-rag", tokenizer, train_on="assistant", limit=limit, seed=0, max_length=max_length, overlong="drop"
    )
    assert all(ids.count(EOS) == 1 and ids[-1] == EOS for ids in corpus.input_ids), "an example has an inner EOS"
    examples = Dataset.from_dict({"input_ids": corpus.input_ids, "labels": corpus.labels})
    print(f"agentic-rag: {corpus.report}", flush=True)
    kinds = ["trl-packing", "trl-padding", "padless"]
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for r in range(repeats):  # A B C, then C B A, ...: a load that drifts during the run hits every kind alike
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            runs[kind].append(
                sft_run(
                    kind,
                    examples,
                    tokenizer,
                    max_length=max_length,
                    padded_batch=padded_batch,
                    packed_rows=packed_rows,
                    out_dir=os.path.join(out_dir, kind),
                    model_name=model_name,
                )
            )
            print(f"  {kind}: {runs[kind][-1]['real_tokens_per_s']:.0f} real tokens/s", flush=True)
    out = []
    for kind in kinds:
        rates = [run["real_tokens_per_s"] for run in runs[kind]]
        out.append(
            {
                **runs[kind][0],
                "real_tokens_per_s": float(np.mean(rates)),
                "real_tokens_per_s_runs": rates,
                "seconds": float(np.mean([run["seconds"] for run in runs[kind]])),
            }
        )
    return out


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["pack", "sft", "all"], default="all")
    p.add_argument("--rows", type=int, default=1_000_000, help="(a) sequences to pack")
    p.add_argument("--seq-length", type=int, default=2048, help="(a) row length")
    p.add_argument("--limit", type=int, default=160, help="(b) agentic-rag examples (one epoch)")
    p.add_argument("--max-length", type=int, default=1024, help="(b) SFTConfig.max_length (longer examples skipped)")
    p.add_argument("--padded-batch", type=int, default=4, help="(b) examples per padded micro-batch")
    p.add_argument("--packed-rows", type=int, default=2, help="(b) packed rows per micro-batch")
    p.add_argument("--model", default="gpt2-2layer", help="(b) a padless model name with GPT-2's vocabulary")
    p.add_argument("--repeats", type=int, default=2, help="(b) runs of each kind, in mirrored order")
    p.add_argument("--out-dir", default="runs/bench-integrations")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"machine_before": machine()}
    print(f"machine: {report['machine_before']}", flush=True)
    if args.part in ("pack", "all"):
        report["pack"] = pack_benchmark(args.rows, args.seq_length, seed=0)
        print(f"\n(a) {args.rows:,} sequences, uniform(10..500) tokens, rows of {args.seq_length}")
        print(f"{'packer':<56} {'seconds':>8} {'rows':>9} {'lower bound':>12} {'x bound':>8}")
        for r in report["pack"]:
            print(
                f"{r['packer']:<56} {r['seconds']:>8.2f} {r['rows']:>9,} {r['lower_bound']:>12,} "
                f"{r['rows'] / r['lower_bound']:>8.4f}"
            )
    if args.part in ("sft", "all"):
        report["sft"] = sft_benchmark(
            args.limit, args.max_length, args.padded_batch, args.packed_rows, args.model, args.out_dir, args.repeats
        )
        print(
            f"\n(b) SFTTrainer, agentic-rag, {args.model}, max_length {args.max_length}, one epoch; "
            f"mean of {args.repeats} runs each"
        )
        print(
            f"{'run':<12} {'attention':<9} {'steps':>5} {'seconds':>8} {'real tok/s':>10} {'final loss':>10} "
            f"{'isolated':>8} {'max |dlogit|':>12} {'x-doc targets':>13}"
        )
        for r in report["sft"]:
            print(
                f"{r['run']:<12} {r['attention']:<9} {r['steps']:>5} {r['seconds']:>8.1f} "
                f"{r['real_tokens_per_s']:>10.0f} {r['final_loss']:>10.4f} {str(r['isolated']):>8} "
                f"{r['max_logit_diff']:>12.2e} {r['cross_document_targets']:>13}"
            )
    report["machine_after"] = machine()
    print(f"\nload average after: {report['machine_after']['load_average']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
