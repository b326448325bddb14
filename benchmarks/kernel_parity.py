"""Parity of padless' varlen attention kernels with the dense reference, on whatever device is here.

For each kernel (``grouped_sdpa``, ``torch_varlen``, ``flash_attn`` and the automatic choice), dtype,
head size (64, 72, 100, 320: 100 is not a multiple of 8, 320 is over 256), heads (MHA and GQA),
sliding window and a layout with 1-token documents: forward and backward against
:func:`padless.attention.varlen.reference_varlen_attention` (float32 oracle; relative max difference per tensor). A kernel that cannot run a case must
refuse it with a ``ValueError`` naming the reason (``refused``), and the automatic choice must then
pick one that runs. One line per case; exit status 1 if any case FAILED (a wrong result, or a crash
that is not a refusal)::

    PYTHONPATH=src .venv/bin/python benchmarks/kernel_parity.py                 # every case for this device
    PYTHONPATH=src .venv/bin/python benchmarks/kernel_parity.py --json out.json # also the lines as JSON
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np
import torch

from padless.attention.varlen import choose_impl, reference_varlen_attention, varlen_attention
from padless.layout import cu_seqlens_from_lengths

LENGTHS = (1, 37, 1, 128, 5, 200, 1, 64)  # 1-token documents between longer ones
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def case(impl: str, dtype: torch.dtype, head_dim: int, heads: tuple[int, int], window: int | None, device) -> dict:
    g = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    hq, hk = heads
    make = lambda h: torch.randn(total, h, head_dim, generator=g).to(device=device, dtype=dtype).requires_grad_()  # noqa: E731
    q, k, v = make(hq), make(hk), make(hk)
    cu = torch.from_numpy(cu_seqlens_from_lengths(np.array(LENGTHS))).to(device)
    row = dict(impl=impl, dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, heads=f"{hq}/{hk}", window=window)
    if impl == "auto":
        row["chosen"] = choose_impl(q)
    try:
        out = varlen_attention(q, k, v, cu, impl=impl, sliding_window=window)
        grad = torch.randn(out.shape, generator=g).to(device=device, dtype=dtype)
        got = torch.autograd.grad(out, (q, k, v), grad)
    except ValueError as exc:
        return {**row, "status": "refused", "detail": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a crash instead of a refusal is what this script looks for
        return {**row, "status": "FAILED", "detail": f"{type(exc).__name__}: {exc}"}
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference_varlen_attention(q32, k32, v32, cu, sliding_window=window)
    want = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    # per tensor (output, dq, dk, dv): max difference over max(1, its largest reference value)
    diff = max(
        (a.float() - b).abs().max().item() / max(1.0, b.abs().max().item()) for a, b in zip((out, *got), (ref, *want))
    )
    return {**row, "status": "ok" if diff <= TOLERANCE[dtype] else "FAILED", "max_diff": diff}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the lines to this JSON file")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtypes = (torch.bfloat16, torch.float16) if device.type == "cuda" else (torch.float32,)
    impls = ("auto", "grouped_sdpa", "torch_varlen", "flash_attn")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {where}  torch {torch.__version__}")
    rows = []
    for impl, dtype, head_dim, heads, window in itertools.product(
        impls, dtypes, (64, 72, 100, 320), ((4, 4), (8, 2)), (None, 16)
    ):
        if device.type == "cpu" and impl in ("torch_varlen", "flash_attn") and head_dim != 64:
            continue  # on a CPU both refuse for the device alone: one line each is enough
        row = case(impl, dtype, head_dim, heads, window, device)
        rows.append(row)
        figures = f"max diff {row['max_diff']:.2e}" if "max_diff" in row else row.get("detail", "")
        chosen = f" -> {row['chosen']}" if "chosen" in row else ""
        print(
            f"{row['status']:>7}  {impl + chosen:<28} {row['dtype']:<8} d={head_dim:<3} h={row['heads']:<4} "
            f"window={window}  {figures}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "torch": torch.__version__, "cases": rows}, f, indent=1)
    failed = sum(r["status"] == "FAILED" for r in rows)
    print(
        f"{len(rows)} cases: {sum(r['status'] == 'ok' for r in rows)} ok, "
        f"{sum(r['status'] == 'refused' for r in rows)} refused, {failed} FAILED"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
