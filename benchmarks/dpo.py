"""Benchmark: one DPO optimiser step on agentic traces, padded pairs vs packed pairs vs a shared prompt.

Pairs come from the ``agentic-rag`` corpus (GPT-2 tokenizer, ``train_on="assistant"``): the prompt is a
trace up to its last assistant turn, ``chosen`` that turn, ``rejected`` a perturbed copy (a random span
after a random cut replaced by tokens of the prompt). Long prompts, short completions: the case where
sharing the prompt matters. A step = the frozen reference's log-probs (no grad) + the policy's
log-probs, :func:`padless.dpo_loss`, backward, AdamW. Methods, interleaved in one process:

- ``padded``: TRL's layout, ``prompt + chosen`` and ``prompt + rejected`` rows padded to the longest,
  a 2D attention mask, sdpa;
- ``packed``: :class:`padless.PreferenceCollator` ``share_prompt=False`` into rows of ``--max-length``,
  padless attention;
- ``shared``: the same with ``share_prompt=True`` (the prompt once per pair, tree attention).

Every method gets the same LM-head saving: logits only where a completion token is predicted (the
hidden states are gathered first), so the comparison is about the rows, not the head. Each method
starts from the same weights and sees the same pairs, so the losses must agree step by step (printed).
Reported: real tokens/s (real = the tokens of the pairs unpacked, ``2 * prompt + chosen + rejected``,
one figure for all methods, so the ratio is the speed-up), tokens the model computed, and the
analytic forward FLOPs of the step's rows (linear layers per token + causal attention per
(query, key) pair actually attended; the LM head is the same for all three and left out).

Run: ``.venv/bin/python benchmarks/dpo.py`` (3 timed steps; 9 minutes on 2 busy CPU cores at load average 11).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import time

import numpy as np
import torch

import padless
from padless.batching.collate import PaddingCollator
from padless.layout import IGNORE_INDEX


def make_pairs(n: int, max_tokens: int, seed: int) -> list[dict[str, list[int]]]:
    """``n`` pairs from agentic-rag traces of at most ``max_tokens`` tokens (prompt + longer completion)."""
    corpus = padless.load_corpus("agentic-rag", padless.load_tokenizer("gpt2"), train_on="assistant")
    rng = np.random.default_rng(seed)
    pairs = []
    for i in rng.permutation(len(corpus)):
        ids, trained = np.array(corpus.input_ids[i]), np.array(corpus.labels[i]) != IGNORE_INDEX
        starts = np.flatnonzero(trained & ~np.concatenate([[False], trained[:-1]]))
        if starts.size == 0 or ids.size > max_tokens or starts[-1] < 1:
            continue
        prompt, chosen = ids[: starts[-1]], ids[starts[-1] :]
        cut = int(rng.integers(0, chosen.size))
        noise = rng.choice(prompt, size=int(rng.integers(1, max(2, chosen.size - cut + 4))))
        rejected = np.concatenate([chosen[:cut], noise, chosen[-1:]])
        if 2 * prompt.size + chosen.size + rejected.size > 2 * max_tokens:
            continue
        pairs.append({"prompt_ids": prompt.tolist(), "chosen_ids": chosen.tolist(), "rejected_ids": rejected.tolist()})
        if len(pairs) == n:
            return pairs
    raise ValueError(f"only {len(pairs)} traces fit max_tokens={max_tokens}")


def padded_batch(pairs: list[dict]) -> tuple[dict, list[tuple[int, list[int], list[int]]]]:
    """TRL's layout (chosen rows, then rejected rows, right-padded) and, per feature (pair i: 2i chosen,
    2i + 1 rejected), its row, the positions predicting its tokens and its positions."""
    feats = [
        {"input_ids": p["prompt_ids"] + p[k], "labels": [IGNORE_INDEX] * len(p["prompt_ids"]) + p[k]}
        for k in ("chosen_ids", "rejected_ids")
        for p in pairs
    ]
    n, src = len(pairs), []
    for i, p in enumerate(pairs):
        for r, key in ((i, "chosen_ids"), (n + i, "rejected_ids")):
            o, c = len(p["prompt_ids"]), len(p[key])
            src.append((r, list(range(o - 1, o + c - 1)), list(range(o, o + c))))
    return PaddingCollator()(feats), src


def packed_src(batch) -> list[tuple[int, list[int], list[int]]]:
    """Per feature: (row, positions whose logits predict it, its positions), read from the placements."""
    pl = batch.placements
    out = [None] * pl.num_features
    for f, r, o, n, prev in zip(
        pl.feature.tolist(), pl.row.tolist(), pl.offset.tolist(), pl.length.tolist(), pl.prev_offset.tolist()
    ):
        out[f] = (r, [prev, *range(o, o + n - 1)], list(range(o, o + n)))
    return out


def pair_logprobs(model, inputs: dict, src, input_ids: torch.Tensor) -> torch.Tensor:
    """``[num_pairs, 2]`` summed completion log-probs; the LM head runs only where a target is predicted."""
    hidden = model.base_model(**inputs).last_hidden_state  # [R, L, H]
    rows = torch.tensor([r for r, s, _ in src for _ in s])
    pred = torch.tensor([p for _, s, _ in src for p in s])
    tgt = input_ids[rows, torch.tensor([t for _, _, ts in src for t in ts])]
    logp = model.lm_head(hidden[rows, pred]).float().log_softmax(-1).gather(1, tgt[:, None])[:, 0]  # [K]
    owner = torch.repeat_interleave(torch.arange(len(src)), torch.tensor([len(s) for _, s, _ in src]))
    return torch.zeros(len(src)).index_add(0, owner, logp).view(-1, 2)


def row_flops(cfg, segments: list[tuple[list[int], list[int]]]) -> float:
    """Forward FLOPs of the rows' transformer blocks: ``2 * 12 d^2`` per token (GPT-2 blocks) and
    ``4 d`` per attended (query, key) pair, per layer. ``segments``: per row, (lengths, parents)."""
    d, layers = cfg.n_embd, cfg.n_layer
    tokens, pairs = 0, 0
    for lengths, parents in segments:
        tokens += sum(lengths)
        pairs += int(padless.attention.tree.tree_causal_mask(lengths, parents).sum())
    return layers * (2 * 12 * d * d * tokens + 4 * d * pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per method (after one warm-up)")
    parser.add_argument("--max-length", type=int, default=2048, help="packed row length")
    parser.add_argument("--max-tokens", type=int, default=1000, help="longest trace used")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    import padless.attention.tree  # noqa: F401  (row_flops)

    padless.register_padless_attention()
    all_pairs = make_pairs(args.pairs * (args.steps + 1), args.max_tokens, args.seed)
    steps = [all_pairs[i * args.pairs : (i + 1) * args.pairs] for i in range(args.steps + 1)]
    cfg = GPT2Config(
        n_layer=4, n_embd=256, n_head=4, n_positions=args.max_length, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    torch.manual_seed(args.seed)
    base = GPT2LMHeadModel(cfg).eval()
    methods = {}
    for name, backend in (("padded", "sdpa"), ("packed", "padless"), ("shared", "padless")):
        policy, ref = copy.deepcopy(base), copy.deepcopy(base)
        policy.set_attn_implementation(backend)
        ref.set_attn_implementation(backend)
        methods[name] = dict(
            policy=policy,
            ref=ref,
            opt=torch.optim.AdamW(policy.parameters(), lr=1e-3),
            times=[],
            losses=[],
            tokens=[],
            flops=[],
        )
    collators = {
        name: padless.PreferenceCollator.for_model(
            methods[name]["policy"], max_length=args.max_length, share_prompt=name == "shared"
        )
        for name in ("packed", "shared")
    }

    def build(name: str, pairs: list[dict]):
        if name == "padded":
            b, src = padded_batch(pairs)
            inputs = {k: v for k, v in b.items() if k != "labels"}
            rows, width = b["input_ids"].shape
            # sdpa with a padding mask computes the whole causal triangle of every row, padding included
            return inputs, src, b["input_ids"], rows * width, [([width], [-1])] * rows
        b = collators[name](pairs)
        inputs = {k: v for k, v in b.items() if k != "labels"}
        if name == "shared":
            cu, par = b["tree_cu_seqlens"].numpy(), b["tree_parents"].numpy()
        else:
            cu = b["cu_seq_lens_q"].numpy()
            par = -np.ones(cu.size - 1, dtype=np.int64)
        width = b["input_ids"].shape[1]
        row_of = cu[:-1] // width
        segs = []
        for r in range(b["input_ids"].shape[0]):
            idx = np.flatnonzero(row_of == r)
            segs.append((np.diff(cu)[idx].tolist(), [int(p - idx[0]) if p >= 0 else -1 for p in par[idx]]))
        return inputs, packed_src(b), b["input_ids"], b["input_ids"].numel(), segs

    for step, pairs in enumerate(steps):
        for name, m in methods.items():
            start = time.perf_counter()
            inputs, src, ids, computed, segs = build(name, pairs)
            with torch.no_grad():
                ref_lp = pair_logprobs(m["ref"], inputs, src, ids)
            loss = padless.dpo_loss(pair_logprobs(m["policy"], inputs, src, ids), ref_lp, beta=0.1)
            loss.backward()
            m["opt"].step()
            m["opt"].zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - start
            if step > 0:  # step 0 warms up
                m["times"].append(elapsed)
            m["losses"].append(loss.item())
            m["tokens"].append(computed)
            # padding is computed by the padded method's whole rows; the packed rows' trailing pad too
            m["flops"].append(row_flops(cfg, segs))
    real = sum(2 * len(p["prompt_ids"]) + len(p["chosen_ids"]) + len(p["rejected_ids"]) for s in steps[1:] for p in s)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
    print(
        f"model: GPT-2 architecture, {cfg.n_layer} layers x {cfg.n_embd}, vocab {cfg.vocab_size}; "
        f"{args.pairs} pairs/step, {args.steps} timed steps; real tokens {real} (pairs unpacked)"
    )
    padded_time = sum(methods["padded"]["times"])
    indep_flops = sum(methods["packed"]["flops"][1:])
    print(
        f"{'method':<8} {'s/step':>8} {'real tok/s':>11} {'vs padded':>10} {'tokens computed':>16} "
        f"{'row GFLOPs':>11} {'vs packed':>10}"
    )
    for name, m in methods.items():
        t = sum(m["times"])
        flops = sum(m["flops"][1:])
        print(
            f"{name:<8} {t / args.steps:8.3f} {real / t:11.0f} {padded_time / t:9.2f}x {sum(m['tokens'][1:]):16d} "
            f"{flops / 1e9:11.3f} {flops / indep_flops:9.2f}x"
        )
    losses = np.array([m["losses"] for m in methods.values()])  # [methods, steps]
    print("loss per step (padded / packed / shared):")
    for s in range(losses.shape[1]):
        print(f"  step {s}: " + " / ".join(f"{x:.7f}" for x in losses[:, s]))
    print(f"max |loss difference| across methods over all steps: {np.abs(losses - losses[0]).max():.2e}")
    print(
        f"FLOPs saved by sharing the prompt (row FLOPs, shared vs packed independent): "
        f"{1 - sum(methods['shared']['flops'][1:]) / indep_flops:.1%}"
    )


if __name__ == "__main__":
    main()
