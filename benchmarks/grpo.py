"""Benchmark: one GRPO update on groups of rollouts, TRL's padded layout vs packed vs one prompt per group.

A step (an *update*) = the reference model's per-token log-probs (no grad; with ``--lora`` the policy
with its adapter disabled, as TRL does) + the policy's, :func:`padless.grpo_loss` (``dapo``, beta 0.04,
on-policy: no old log-probs), backward, AdamW. Layouts, interleaved step by step in one process, each
from the same weights on the same rollouts:

- ``trl``: TRL 1.16's ``GRPOTrainer`` layout exactly: prompts left-padded to the batch's longest,
  completions right-padded, ``cat`` of the two, a 2D attention mask, no position_ids, sdpa;
- ``packed``: :class:`padless.RolloutCollator` ``share_prompt=False`` (every completion its own
  document ``prompt + completion``), padless attention;
- ``shared``: ``share_prompt=True`` (the prompt once per group, the completions after it attending to
  it and not to each other), padless attention.

Every layout gets the same LM-head saving: logits only where a trained completion token is predicted
(:func:`padless.objectives.loss.trained_logits`; TRL's ``logits_to_keep`` keeps the padded completion
positions too, so this gives its layout more than TRL does). Lengths (``--lengths``):

- ``agentic-rag``: the prompt is a real trace of the corpus (SmolLM2 tokenizer) up to one of its
  assistant turns (a prompt of at most ``--max-prompt`` tokens); each of the ``--group-size``
  completions is an assistant turn drawn at random from the whole corpus, real token ids, cut at
  ``--max-completion`` (as TRL's ``max_completion_length`` cuts generation);
- ``long-tail``: prompt lengths lognormal (median ``max_prompt / 2``, sigma 0.5) and completion lengths
  lognormal (median ``max_completion / 10``, sigma 1.0), clipped to ``[max_prompt / 8, max_prompt]``
  and ``[max_completion / 100, max_completion]`` (30..3000 at ``--max-completion 3000``); token ids are
  real text, slices of the agentic-rag token stream.

Advantages are TRL's: per-group ``(r - mean) / (std + 1e-4)`` of rewards drawn from a normal. Before
timing, the warm-up step checks the layouts against each other (fp32): per-token log-probs of policy
and reference, the loss, and the gradient norm; a relative difference above ``--tolerance`` (1e-4)
aborts. Reported per layout: median step time, real tokens/s (real = each completion with its prompt,
``sum(prompt + completion)``: what TRL's layout computes without its padding, one figure for every
layout, so the ratios are speed-ups), the tokens the model computed (reference pass and policy pass
each), the analytic FLOPs of the step, and the ratio to the FLOP ideal: the measured speed-up over
``trl`` divided by the FLOP-ideal one (``trl`` FLOPs / the layout's FLOPs). FLOPs per forward: the
projections and MLP per token (padding included), attention per attended (query, key) pair (the
causal triangle of each padded row for ``trl``; each document, and the trailing pad as its own
segment, for ``packed``; the prompt tree for ``shared``), the LM head per predicted token (the same
for every layout); the step is the reference forward + 3x the policy forward (2x the weight products
with LoRA's frozen base, :mod:`padless.bench.flops`). Speed-ups over ``trl`` are the median of the
per-step ratios (the layouts of a step run back to back, their order rotating, so load on a shared
machine falls on all of them alike).

Run: ``.venv/bin/python benchmarks/grpo.py`` (SmolLM2-135M, both length sets, full fine-tuning and
LoRA r=16, one group of 8 per step, 3 timed steps after a warm-up; 3 min 58 s on 2 CPU cores shared
with other jobs, load average 1.8-3.6. The sizes are small so that it fits a few minutes on this CPU;
the results are in docs/rl.md). Each step's times go to stderr,
with its CPU time (also reported per layout, a check on the wall-time ratios when other jobs load the
machine).
On a GPU: ``--device cuda`` (written for CUDA, not yet run on one; larger ``--groups`` and
``--max-prompt`` / ``--max-completion`` there). ``--model tiny-llama`` (ids folded into its
512-token vocabulary) is for the smoke test. ``--threads 1`` (the default): on 2 cores that other jobs
share, 2 torch threads made a step's time swing 10x (4 s to 40 s) from step to step, and 1 thread held
it within about 2x.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

import padless
from padless.bench.flops import ModelShape
from padless.bench.timing import synchronizer
from padless.layout import IGNORE_INDEX
from padless.objectives.rollouts import rollout_token_logprobs

LAYOUTS = ("trl", "packed", "shared")
BACKENDS = {"trl": "sdpa", "packed": "padless", "shared": "padless"}
BETA = 0.04
LOSS_TYPE = "dapo"
DEFAULT_COMPLETION = {"agentic-rag": 32, "long-tail": 96}
"""``--max-completion`` per length set when not given (sizes for a 2-core CPU)."""
LR = {"full": 1e-6, "lora": 1e-5}  # TRL's GRPOConfig default learning rate; LoRA's usual 10x


# --- rollouts: lengths and real token ids ---------------------------------------------------------


@functools.cache
def corpus_tokens() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The agentic-rag traces (SmolLM2 tokenizer) and, per trace, the start of each assistant turn."""
    corpus = padless.load_corpus("agentic-rag", padless.load_tokenizer("smollm2-135m"), train_on="assistant")
    traces, starts = [], []
    for ids, labels in zip(corpus.input_ids, corpus.labels):
        trained = np.array(labels) != IGNORE_INDEX
        traces.append(np.array(ids, dtype=np.int64))
        starts.append(np.flatnonzero(trained & ~np.concatenate([[False], trained[:-1]])))
    return traces, starts


def assistant_turns(traces: list[np.ndarray], starts: list[np.ndarray]) -> list[np.ndarray]:
    """Every assistant turn of the corpus (a trained span of a trace)."""
    turns = []
    for ids, st in zip(traces, starts):
        ends = [*st[1:], ids.size]
        for s, e in zip(st, ends):
            turns.append(ids[s:e])
    return turns


def agentic_groups(n: int, k: int, max_prompt: int, max_completion: int, rng: np.random.Generator) -> list[dict]:
    """``n`` groups: a trace up to one of its assistant turns (at most ``max_prompt`` tokens), and ``k``
    assistant turns drawn from the whole corpus, each cut at ``max_completion``."""
    traces, starts = corpus_tokens()
    turns = assistant_turns(traces, starts)
    groups = []
    for i in rng.permutation(len(traces)):
        fits = [int(s) for s in starts[i] if 1 <= s <= max_prompt]
        if not fits:
            continue
        prompt = traces[i][: int(rng.choice(fits))]
        picks = rng.integers(0, len(turns), size=k)
        groups.append(
            {"prompt_ids": prompt.tolist(), "completion_ids": [turns[j][:max_completion].tolist() for j in picks]}
        )
        if len(groups) == n:
            return groups
    raise ValueError(f"only {len(groups)} agentic-rag traces have an assistant turn within max_prompt={max_prompt}")


def long_tail_groups(n: int, k: int, max_prompt: int, max_completion: int, rng: np.random.Generator) -> list[dict]:
    """``n`` groups with lognormal prompt and completion lengths (the module docstring), token ids cut
    from the agentic-rag token stream at random offsets."""
    stream = np.concatenate(corpus_tokens()[0])

    def lengths(size: int, median: float, sigma: float, low: int, high: int) -> np.ndarray:
        return np.clip(np.rint(rng.lognormal(np.log(median), sigma, size=size)), low, high).astype(int)

    def text(length: int) -> list[int]:
        start = int(rng.integers(0, stream.size - length))
        return stream[start : start + length].tolist()

    prompts = lengths(n, max_prompt / 2, 0.5, max(1, max_prompt // 8), max_prompt)
    comps = lengths(n * k, max_completion / 10, 1.0, max(1, max_completion // 100), max_completion).reshape(n, k)
    return [{"prompt_ids": text(int(p)), "completion_ids": [text(int(c)) for c in cs]} for p, cs in zip(prompts, comps)]


def advantages(groups: list[dict], rng: np.random.Generator) -> torch.Tensor:
    """``[B]``: TRL's group-normalised advantages ``(r - mean) / (std + 1e-4)`` of normal rewards."""
    out = []
    for g in groups:
        r = torch.from_numpy(rng.normal(size=len(g["completion_ids"]))).float()
        out.append((r - r.mean()) / (r.std() + 1e-4))
    return torch.cat(out)


def fold(groups: list[dict], vocab: int) -> list[dict]:
    """Token ids folded into a smaller vocabulary (the tiny test model's)."""
    return [
        {
            "prompt_ids": [t % vocab for t in g["prompt_ids"]],
            "completion_ids": [[t % vocab for t in c] for c in g["completion_ids"]],
        }
        for g in groups
    ]


# --- the layouts ------------------------------------------------------------------------------------


def trl_batch(groups: list[dict], pad_id: int) -> dict:
    """TRL's ``GRPOTrainer`` tensors: ``input_ids = cat(left-padded prompts, right-padded completions)``
    ``[B, P + T]``, its 2D ``attention_mask``, and ``predicting`` (bool ``[B, P + T]``: the positions
    whose logits predict a completion token, ``P - 1 + t``)."""
    prompts = [g["prompt_ids"] for g in groups for _ in g["completion_ids"]]
    comps = [c for g in groups for c in g["completion_ids"]]
    P, T, B = max(map(len, prompts)), max(map(len, comps)), len(comps)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + T), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, comps)):
        ids[b, P - len(p) : P] = torch.tensor(p)
        ids[b, P : P + len(c)] = torch.tensor(c)
        mask[b, P - len(p) : P + len(c)] = 1
    completion_mask = mask[:, P:].bool()  # [B, T]
    predicting = torch.zeros((B, P + T), dtype=torch.bool)
    predicting[:, P - 1 : P + T - 1] = completion_mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "predicting": predicting,
        "completion_mask": completion_mask,
        "prompt_width": P,
    }


def trl_logps(model, batch: dict) -> torch.Tensor:
    """``[B, T]`` per-token log-probs on TRL's layout, the LM head on the predicting positions only."""
    from padless.objectives.loss import trained_logits

    P, cm = batch["prompt_width"], batch["completion_mask"]
    logits = trained_logits(
        model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, batch["predicting"]
    )  # [K, V], row-major over (b, t) where cm
    targets = batch["input_ids"][:, P:][cm]  # [K]
    logp = logits.float().log_softmax(-1).gather(1, targets[:, None])[:, 0]
    return logp.new_zeros(cm.shape).masked_scatter(cm, logp)


def segments_of(batch) -> list[tuple[list[int], list[int]]]:
    """Per row of a packed batch: (segment lengths, row-local parents); the trailing pad is a segment."""
    if "tree_cu_seqlens" in batch:
        cu, par = batch["tree_cu_seqlens"].cpu().numpy(), batch["tree_parents"].cpu().numpy()
    else:
        cu = batch["cu_seq_lens_q"].cpu().numpy()
        par = -np.ones(cu.size - 1, dtype=np.int64)
    width = batch["input_ids"].shape[1]
    row_of = cu[:-1] // width
    segs = []
    for r in range(batch["input_ids"].shape[0]):
        idx = np.flatnonzero(row_of == r)
        segs.append((np.diff(cu)[idx].tolist(), [int(p - idx[0]) if p >= 0 else -1 for p in par[idx]]))
    return segs


def attended_pairs(segments: list[tuple[list[int], list[int]]]) -> int:
    """(query, key) pairs a tree-causal mask keeps: per segment, its causal triangle plus every token of
    its ancestors (a document is a segment without a parent)."""
    total = 0
    for lengths, parents in segments:
        for s, (n, p) in enumerate(zip(lengths, parents)):
            above = 0
            while p >= 0:
                above, p = above + lengths[p], parents[p]
            total += n * above + n * (n + 1) // 2
    return total


def step_flops(shape: ModelShape, tokens: int, pairs: int, head_rows: int, lora: bool) -> float:
    """Reference forward + policy forward and backward (:mod:`padless.bench.flops`' conventions)."""
    weights = tokens * shape.body_per_token() + head_rows * shape.head_per_row()
    attention = shape.layers * 4 * shape.heads * shape.head_dim * pairs
    return (1 + (2 if lora else 3)) * weights + (1 + 3) * attention


# --- one configuration: the three layouts, interleaved ------------------------------------------------


def run(args, base, steps: list[list[dict]], advs: list[torch.Tensor], lora: bool, label: str) -> dict:
    device = torch.device(args.device)
    sync = synchronizer(device)
    shape = ModelShape.from_config(base.config)
    pad_id = 0 if args.model.startswith("tiny-") else padless.load_tokenizer("smollm2-135m").pad_token_id
    # Full fine-tuning: one frozen reference for every layout (its attention backend set before each
    # layout's step, outside the timing); LoRA: the policy with its adapter disabled.
    ref = None if lora else copy.deepcopy(base).to(device).eval().requires_grad_(False)
    methods = {}
    for name in LAYOUTS:
        policy = copy.deepcopy(base)
        policy.set_attn_implementation(BACKENDS[name])
        if lora:
            from padless.models.lora import with_lora

            torch.manual_seed(args.seed)  # the same adapter initialisation in every layout
            policy = with_lora(policy, args.lora)
        policy.to(device).train()
        params = [p for p in policy.parameters() if p.requires_grad]
        methods[name] = dict(
            policy=policy,
            params=params,
            times=[],
            cpu=[],
            losses=[],
            tokens=[],
            flops=[],
            opt=torch.optim.AdamW(params, lr=LR["lora" if lora else "full"]),
        )
    width = max(len(g["prompt_ids"]) + len(c) for s in steps for g in s for c in g["completion_ids"])
    max_length = args.max_length or args.group_size * width
    collators = {
        name: padless.RolloutCollator.for_model(
            methods[name]["policy"], max_length=max_length, share_prompt=name == "shared"
        )
        for name in ("packed", "shared")
    }

    def logps(name: str, model, b, width: int) -> torch.Tensor:
        if name == "trl":
            return trl_logps(model, b)
        return rollout_token_logprobs(model, b, width=width)[0]

    def one_step(name: str, groups: list[dict], adv: torch.Tensor, check: dict | None):
        m = methods[name]
        if name == "trl":
            b = trl_batch(groups, pad_id)
            mask = b["completion_mask"]
            rows, width = b["input_ids"].shape
            tokens, pairs = rows * width, rows * width * (width + 1) // 2
            b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
        else:
            from padless.batching.batch import batch_to

            packed = collators[name](groups)
            mask = packed.rollouts["completion_mask"].bool()
            tokens, pairs = packed["input_ids"].numel(), attended_pairs(segments_of(packed))
            b = batch_to(packed, device)
        mask = mask.to(device)
        policy = m["policy"]
        with torch.no_grad():
            if lora:
                with policy.disable_adapter():
                    ref_lp = logps(name, policy, b, mask.shape[1])
            else:
                ref_lp = logps(name, ref, b, mask.shape[1])
        lp = logps(name, policy, b, mask.shape[1])
        out = padless.grpo_loss(lp, adv.to(device), mask, ref_per_token_logps=ref_lp, loss_type=LOSS_TYPE, beta=BETA)
        out.loss.backward()
        if check is not None:  # the warm-up step: what the layouts must agree on, before the update
            with torch.no_grad():
                grad = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m["params"] if p.grad is not None))
            check[name] = dict(
                lp=lp.detach().cpu(), ref=ref_lp.cpu(), mask=mask.cpu(), loss=out.loss.item(), grad=grad.item()
            )
        m["opt"].step()
        m["opt"].zero_grad(set_to_none=True)
        head_rows = int(mask.sum())
        return out.loss.item(), tokens, step_flops(shape, tokens, pairs, head_rows, lora)

    real = []
    check: dict = {}
    for step, (groups, adv) in enumerate(zip(steps, advs)):
        order = LAYOUTS[step % 3 :] + LAYOUTS[: step % 3]  # rotate, so no layout always runs first
        took = []
        for name in order:
            m = methods[name]
            if ref is not None:
                ref.set_attn_implementation(BACKENDS[name])
            sync()
            start, cpu = time.perf_counter(), time.process_time()
            loss, tokens, flops = one_step(name, groups, adv, check if step == 0 else None)
            sync()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            m["losses"].append(loss)
            took.append(f"{name} {elapsed:.2f} s ({cpu:.2f} s CPU)")
            if step > 0:  # step 0 warms up and checks
                m["times"].append(elapsed)
                m["cpu"].append(cpu)
                m["tokens"].append(tokens)
                m["flops"].append(flops)
        print(
            f"  [{label}] step {step}{' (warm-up)' if step == 0 else ''}: {', '.join(took)}",
            file=sys.stderr,
            flush=True,
        )
        if step == 0:
            verdict(check, args.tolerance, label)
        else:
            real.append(sum(len(g["prompt_ids"]) + len(c) for g in groups for c in g["completion_ids"]))
    for m in methods.values():
        del m["policy"], m["opt"], m["params"]  # the reference goes with this frame
    gc.collect()
    return dict(methods=methods, real=real)


def verdict(check: dict, tolerance: float, label: str) -> None:
    """Print how far ``packed`` and ``shared`` are from ``trl`` on the warm-up step; exit above tolerance."""
    ref = check["trl"]
    worst, parts = 0.0, []
    for name in ("packed", "shared"):
        c = check[name]
        if not torch.equal(c["mask"], ref["mask"]):
            sys.exit(f"{label}: {name}'s completion mask differs from trl's: the layouts do not hold the same rollouts")
        m = ref["mask"]
        scale = ref["lp"][m].abs().max().item()
        d_lp = max((c["lp"] - ref["lp"])[m].abs().max().item(), (c["ref"] - ref["ref"])[m].abs().max().item())
        d_loss = abs(c["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
        d_grad = abs(c["grad"] - ref["grad"]) / max(ref["grad"], 1e-30)
        worst = max(worst, d_lp / scale, d_loss, d_grad)
        parts.append(
            f"{name} vs trl: max |d logp| {d_lp:.1e} (of |logp| up to {scale:.1f}), loss {d_loss:.1e} "
            f"relative, grad norm {d_grad:.1e} relative"
        )
    ok = worst <= tolerance
    print(
        f"check before timing ({label}): "
        + "; ".join(parts)
        + f" -> {'ok' if ok else 'FAILED'} (worst {worst:.1e}, tolerance {tolerance:.0e} relative)"
    )
    if not ok:
        sys.exit(f"{label}: the layouts disagree beyond tolerance {tolerance:.0e}; not timing them")


def report(result: dict, label: str, timed: int) -> dict[str, tuple[float, float]]:
    """Print one configuration's table; returns per layout (speed-up over trl, ratio to the FLOP ideal)."""
    methods, real = result["methods"], result["real"]
    base_t, base_f = methods["trl"]["times"], sum(methods["trl"]["flops"])
    print(
        f"{label}: {timed} timed steps, real tokens/step {statistics.median(real):.0f} (median), "
        f"{sum(real)} in all" + ("  [fewer than 3 timed steps: too few to trust]" if timed < 3 else "")
    )
    print(
        f"  {'layout':<7} {'s/step':>8} {'real tok/s':>11} {'vs trl':>7} {'tokens computed':>16} "
        f"{'step GFLOPs':>12} {'FLOP ideal':>11} {'of ideal':>9} {'CPU s/step':>11} {'vs trl, CPU':>12}"
    )
    out = {}
    for name, m in methods.items():
        speedup = statistics.median(b / t for b, t in zip(base_t, m["times"]))
        cpu_speedup = statistics.median(b / t for b, t in zip(methods["trl"]["cpu"], m["cpu"]))
        ideal = base_f / sum(m["flops"])
        out[name] = (speedup, speedup / ideal, cpu_speedup)
        tok_s = statistics.median(r / t for r, t in zip(real, m["times"]))
        print(
            f"  {name:<7} {statistics.median(m['times']):8.2f} {tok_s:11.0f} {speedup:6.2f}x {sum(m['tokens']):16d} "
            f"{sum(m['flops']) / timed / 1e9:12.1f} {ideal:10.2f}x {speedup / ideal:9.2f} "
            f"{statistics.median(m['cpu']):11.2f} {cpu_speedup:11.2f}x"
        )
    losses = np.array([m["losses"] for m in methods.values()])  # [layouts, steps]
    rel = np.abs(losses - losses[0]).max() / max(np.abs(losses[0]).max(), 1e-12)
    print(
        "  loss per step (trl / packed / shared): "
        + ", ".join("/".join(f"{x:.6f}" for x in losses[:, s]) for s in range(losses.shape[1]))
    )
    print(f"  max loss difference over all steps: {rel:.1e} relative")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, or a tiny-* test model")
    parser.add_argument("--lengths", choices=("agentic-rag", "long-tail", "both"), default="both")
    parser.add_argument("--finetune", choices=("full", "lora", "both"), default="both")
    parser.add_argument("--lora", type=int, default=16, metavar="R", help="LoRA rank of the LoRA runs")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--groups", type=int, default=1, help="groups per step")
    parser.add_argument("--max-prompt", type=int, default=48, help="longest prompt (tokens)")
    parser.add_argument(
        "--max-completion", type=int, default=None, help=f"longest completion (tokens; default {DEFAULT_COMPLETION})"
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="packed row length (default: group size x the longest prompt + completion)",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="relative agreement required before timing")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda: written, not yet run on one)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: steady step times on a CPU other jobs share; 0: torch's own)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    for flag in ("group_size", "groups", "max_prompt", "max_completion", "lora"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.model != "smollm2-135m" and not args.model.startswith("tiny-"):
        parser.error(f"--model {args.model!r}: choose smollm2-135m or a tiny-* test model")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    padless.register_padless_attention()
    torch.manual_seed(args.seed)
    base = padless.build_model(args.model, seed=args.seed).eval()
    vocab = base.config.vocab_size
    lengths = ("agentic-rag", "long-tail") if args.lengths == "both" else (args.lengths,)
    modes = ("full", "lora") if args.finetune == "both" else (args.finetune,)
    started = time.perf_counter()
    summary = {}
    for which in lengths:
        rng = np.random.default_rng(args.seed)
        make = agentic_groups if which == "agentic-rag" else long_tail_groups
        longest = args.max_completion or DEFAULT_COMPLETION[which]
        groups = make(args.groups * (args.steps + 1), args.group_size, args.max_prompt, longest, rng)
        if vocab < 49152:
            groups = fold(groups, vocab)
        steps = [groups[i * args.groups : (i + 1) * args.groups] for i in range(args.steps + 1)]
        advs = [advantages(s, rng) for s in steps]
        for mode in modes:
            label = f"{which}, {'full fine-tuning' if mode == 'full' else f'LoRA r={args.lora}'}"
            result = run(args, base, steps, advs, mode == "lora", label)
            summary[label] = report(result, label, args.steps)
    load = os.getloadavg()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, device {args.device}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"model: {args.model} ({sum(p.numel() for p in base.parameters()) / 1e6:.0f}M); groups of "
        f"{args.group_size}, {args.groups} group(s)/step, prompts <= {args.max_prompt}, completions <= "
        f"{args.max_completion or ', '.join(f'{v} ({k})' for k, v in DEFAULT_COMPLETION.items())}; {LOSS_TYPE}, beta {BETA}; {args.steps} timed steps + 1 warm-up; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print("speed-up over trl in real tokens/s (of the FLOP ideal; in CPU time):")
    print(f"  {'configuration':<32} " + " ".join(f"{n:>24}" for n in LAYOUTS[1:]))
    for label, out in summary.items():
        print(
            f"  {label:<32} "
            + " ".join(f"{out[n][0]:6.2f}x ({out[n][1]:4.2f}; {out[n][2]:5.2f}x)" for n in LAYOUTS[1:])
        )


if __name__ == "__main__":
    main()
