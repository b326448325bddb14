"""GPU check of context parallelism's CUDA path (benchmarks/gpu.sh step ``context-parallel``).

One process, no collective: for cp = 2, 4 and 8, both layouts (contiguous, zigzag) and every rank, the rank's queries of packed rows
(documents straddling shard boundaries, one spanning every shard, a sliding window or none) against
the whole rows' keys and values, through the flash-attn varlen path with per-rank boundaries
(:func:`padless.attention.context_parallel._flash_varlen`), compared with the masked-sdpa path in
float32 (the global document mask of :func:`padless.attention.context_parallel.document_mask`).
Writes ``{"cases": [...], "max_abs": ...}`` and exits 1 past the bf16 tolerance, 0 when it passes or
when there is no CUDA device or no flash-attn (``"skipped"``).

    python benchmarks/gpu_context_parallel.py out.json
"""

from __future__ import annotations

import json
import sys

import torch

from padless.attention import context_parallel as cpmod


def main(out: str) -> int:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        flash = False
    else:
        flash = True
    if not torch.cuda.is_available() or not flash:
        json.dump({"skipped": "needs CUDA and flash-attn"}, open(out, "w"))
        return 0
    torch.manual_seed(0)
    lengths = [[700, 2500, 300, 396], [64, 1000, 1000, 1000, 832]]  # rows of 3,896 tokens (and padding)
    length, heads, kv_heads, dim = 4096, 8, 2, 64
    ids = torch.stack(
        [torch.repeat_interleave(torch.arange(len(r) + 1), torch.tensor([*r, length - sum(r)])) for r in lengths]
    )
    ids = ids.cuda()
    cases, worst = [], 0.0
    keys = torch.arange(length, device="cuda")
    for cp in (2, 4, 8):
        for layout in cpmod.LAYOUTS:
            order = torch.cat([cpmod.shard_index(length, cp, r, layout) for r in range(cp)]).cuda()
            for window in (None, 256):
                q = torch.randn(2, heads, length, dim, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(2, kv_heads, length, dim, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                for rank in range(cp):
                    index = order.reshape(cp, -1)[rank]
                    state = cpmod.ContextParallelState(ids, index, order, layout, None)
                    local = q[:, :, index]
                    got = cpmod._flash_varlen(local, k, v, ids, state, None, 0.0, window)  # [R, L/cp, H, D]
                    mask = cpmod.document_mask(ids, index, keys, window)[:, None]
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        local.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
                    ).transpose(1, 2)
                    diff = float((got.float() - ref).abs().max())
                    worst = max(worst, diff)
                    cases.append({"cp": cp, "layout": layout, "rank": rank, "window": window, "max_abs": diff})
    json.dump({"cases": cases, "max_abs": worst}, open(out, "w"), indent=1)
    return int(worst > 2e-2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
