"""Benchmark: packed vision-language fine-tuning (Qwen2-VL class) vs padded vs bucketed, one step at a time.

A random-init Qwen2-VL (``--size default``: text hidden 256, 4 layers, 8 query / 4 key-value heads,
MLP 1024, vocabulary 2048; vision encoder 2 blocks of width 256, 4 heads, MLP ratio 4, the 2x2 merger;
fp32, ``--size tiny`` for the smoke test) is fine-tuned on a corpus of ``--records`` chat records:
caption requests (1-3 images, "describe the image" and a 1-4 sentence caption) and short dialogues
(0-3 images, 2-3 user / assistant turns), images of varied sizes run through transformers'
``Qwen2VLImageProcessorPil`` (the data section of docs/vlm.md says how they are built). A step is a
fixed set of ``--records-per-step`` records (the corpus in a random order, cut in order); every
strategy trains the same records of the step, from the same weights, with the same loss:

    loss = (summed next-token cross-entropy over the step's trained tokens) / (trained tokens of the step)

(each micro-batch's summed cross-entropy over that count, gradients accumulated), then one AdamW step.
Strategies, interleaved step by step in one process (their order rotating from step to step, so load
on a shared machine falls on all of them alike):

- ``padding``: :class:`padless.PaddingCollator` over micro-batches of ``--batch-size`` records in the
  step's random order (right padding, 2D mask; the model computes its own 3-D rope index), sdpa;
- ``bucketing``: the step's records grouped by length with
  :class:`padless.batching.samplers.LengthGroupedBatchSampler` (one mega-batch = the step), micro-batches
  of ``--batch-size``, then padded as ``padding``; sdpa;
- ``packing``: :meth:`padless.PackingCollator.for_model` rows of ``--max-length`` tokens, all rows of the
  step in one forward (so its activations, and its peak memory, are a whole step's where the padded
  strategies hold one micro-batch's), the padless attention backend (``cu_seq_lens``; the vision tower too);
- ``packing-sdpa``: the same rows with sdpa and the 4D block-diagonal mask.

Before timing, the first step checks every strategy's loss against ``padding``'s (``--tolerance``,
relative, default 1e-5) and aborts otherwise. Reported per strategy: median step time; real tokens/s
(text tokens that are not padding, image placeholder tokens included, + the vision patches the encoder
processed; each also alone); the padding fraction of the text positions fed; peak memory of a step (CPU:
the kernel's peak RSS over the step minus the RSS at its start, :class:`padless.bench.memory.PeakMemory`
after ``malloc_trim`` so that freed heap is returned first; an accelerator: its peak allocated bytes);
the loss; the speed-up over ``padding`` (median of the per-step time ratios, also in CPU time); and the
FLOP ideal, ``padding``'s FLOPs / the strategy's FLOPs. FLOPs: the text model's from
:func:`padless.bench.flops.executed_step_flops` (its ``ModelShape`` of the text config; projections and
MLP per token fed, padding included; attention per causal block: a padded row or a 4D-masked packed row
is one block of its width, the padless backend's ``cu_seq_lens`` documents their own blocks; the LM head
over every position fed, as the forward computes logits everywhere), plus the vision encoder's
(:func:`vision_flops`, the same for every strategy). Training = 3x forward. The text model's FLOP
ideal alone (``text FLOP ideal``) is printed too: the vision encoder's share dilutes every ratio alike.

Run: ``.venv/bin/python benchmarks/vlm.py --out results.json`` (the figures and the machine are in
docs/vlm.md). ``--threads 1`` (the default), as benchmarks/grpo.py: one torch thread keeps step times
steady on a CPU other jobs share. Each step's times go to stderr.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

import padless
from padless.attention.select import use_backend
from padless.batching.batch import batch_to
from padless.batching.samplers import LengthGroupedBatchSampler
from padless.bench.flops import ModelShape, executed_step_flops
from padless.bench.memory import PeakMemory, current_rss_bytes
from padless.bench.timing import synchronizer
from padless.layout import IGNORE_INDEX

STRATEGIES = ("padding", "bucketing", "packing", "packing-sdpa")
BACKENDS = {"padding": "sdpa", "bucketing": "sdpa", "packing": "padless", "packing-sdpa": "sdpa"}
LR = 1e-5


@dataclass(frozen=True)
class Size:
    """Model and image sizes of one ``--size``."""

    vocab: int
    """Text vocabulary (GPT-2 ids are folded into it, the special tokens take its last 8 ids)."""
    hidden: int
    """Text model width (the vision merger's output width too)."""
    layers: int
    """Text decoder layers."""
    heads: int
    """Text query heads (key-value heads: half of them)."""
    intermediate: int
    """Text MLP inner width."""
    vision_depth: int
    """Vision encoder blocks."""
    vision_width: int
    """Vision encoder width (``embed_dim``)."""
    vision_heads: int
    """Vision attention heads."""
    vision_mlp_ratio: int
    """Vision MLP inner width / its width."""
    min_pixels: int
    """The image processor's ``min_pixels`` (images smaller than this are scaled up)."""
    max_pixels: int
    """The image processor's ``max_pixels`` (larger images are scaled down)."""


SIZES = {
    "default": Size(2048, 256, 4, 8, 1024, 2, 256, 4, 4, 56 * 56, 224 * 224),
    "tiny": Size(512, 32, 2, 4, 64, 1, 32, 2, 2, 28 * 28, 56 * 56),
}


# --- the model --------------------------------------------------------------------------------------


def special_ids(vocab: int) -> dict[str, int]:
    """The special tokens, the last ids of the vocabulary (text ids are folded below them)."""
    names = ("image", "vision_start", "vision_end", "video", "im_start", "im_end")
    return {name: vocab - 8 + i for i, name in enumerate(names)}


def build_model(size: Size, seed: int) -> Qwen2VLForConditionalGeneration:
    """A random-init Qwen2-VL of ``size``, fp32, sdpa."""
    head_dim = size.hidden // size.heads
    half = head_dim // 2  # mrope sections (temporal, height, width) cover half the rotary dims
    sections = [half // 2, half // 4, half - half // 2 - half // 4]
    text = dict(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads // 2,
                max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                rope_parameters={"rope_type": "default", "mrope_section": sections, "rope_theta": 10000.0})  # fmt: skip
    vision = dict(depth=size.vision_depth, embed_dim=size.vision_width, hidden_size=size.hidden,
                  num_heads=size.vision_heads, mlp_ratio=size.vision_mlp_ratio, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_chans=3)  # fmt: skip
    ids = special_ids(size.vocab)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["image"],
                           vision_start_token_id=ids["vision_start"], vision_end_token_id=ids["vision_end"],
                           video_token_id=ids["video"], bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config).float()


def vision_flops(vision_config, grids: list[tuple[int, int, int]]) -> float:
    """Training FLOPs (3x forward) of Qwen2-VL's vision encoder over images of these ``(t, h, w)`` patch
    grids: the patch embedding (a linear map of each ``3 x 2 x 14 x 14`` patch), per block and patch the
    qkv, output and MLP products, attention over all (query, key) pairs of each image (bidirectional,
    per image), and the merger's two products per merged token (``h * w / 4`` of them)."""
    e, out = vision_config.embed_dim, vision_config.hidden_size
    mlp = int(e * vision_config.mlp_ratio)
    patch_in = vision_config.in_chans * vision_config.temporal_patch_size * vision_config.patch_size**2
    merge = vision_config.spatial_merge_size**2
    forward = 0
    for t, h, w in grids:
        n = t * h * w
        forward += 2 * patch_in * e * n
        forward += vision_config.depth * (2 * (3 * e * e + e * e + 2 * e * mlp) * n + 4 * e * n * n)
        forward += (n // merge) * 2 * (merge * e * merge * e + merge * e * out)
    return 3.0 * forward


# --- the data: chat records with images ---------------------------------------------------------------

_ADJ = "red small old wooden bright busy quiet tall striped rusty snowy crowded empty golden".split()
_NOUN = "bicycle dog market bridge kitchen tower boat garden street lamp train field window chair".split()
_VERB = "stands near|leans against|sits beside|rests under|faces|is parked by|crosses".split("|")
_PLACE = "a river|the old station|a stone wall|the harbour|a row of trees|the city square|a wooden fence".split("|")
_ASK = ["Describe this image.", "What is shown here?", "Write a caption for the picture.", "Describe what you see."]
_QUESTION = ["What colour is the {n}?", "Where is the {n}?", "How many {n}s are there?", "Is the {n} old or new?",
             "What is next to the {n}?", "Why might the {n} be there?"]  # fmt: skip


def sentence(rng: np.random.Generator) -> str:
    adj, noun = rng.choice(_ADJ, size=2), rng.choice(_NOUN, size=2)
    extra = f", and a {adj[1]} {noun[1]} can be seen in the background" if rng.random() < 0.5 else ""
    return f"A {adj[0]} {noun[0]} {rng.choice(_VERB)} {rng.choice(_PLACE)}{extra}."


def make_image(rng: np.random.Generator, photo: np.ndarray | None):
    """One image of a random size (56-448 px a side): a crop of the bundled sample photo, or a generated
    picture (a colour gradient with noise and a few rectangles)."""
    from PIL import Image

    h, w = (int(x) for x in rng.choice([56, 84, 112, 168, 224, 336, 448], size=2))
    if photo is not None and rng.random() < 0.5:
        y, x = int(rng.integers(0, photo.shape[0] // 3)), int(rng.integers(0, photo.shape[1] // 3))
        return Image.fromarray(photo[y:, x:]).resize((w, h))
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), np.full_like(xx, rng.integers(0, 255))], -1)
    img = img + rng.normal(0, 20, img.shape)
    for _ in range(int(rng.integers(1, 4))):
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        img[y0 : y0 + h // 4, x0 : x0 + w // 4] = rng.integers(0, 255, 3)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def chats(n: int, rng: np.random.Generator) -> list[list[dict]]:
    """``n`` chats, each a list of ``{"role", "text", "images"}`` messages (``images``: a count)."""
    out = []
    for _ in range(n):
        if rng.random() < 0.4:  # a caption request
            caption = " ".join(sentence(rng) for _ in range(int(rng.integers(1, 5))))
            out.append([{"role": "user", "text": str(rng.choice(_ASK)), "images": int(rng.integers(1, 4))},
                        {"role": "assistant", "text": caption, "images": 0}])  # fmt: skip
            continue
        chat, images = [], int(rng.integers(0, 4))
        for turn in range(int(rng.integers(2, 4))):
            q = str(rng.choice(_QUESTION)).format(n=rng.choice(_NOUN))
            answer = " ".join(sentence(rng) for _ in range(int(rng.integers(1, 6))))
            chat += [{"role": "user", "text": q, "images": images if turn == 0 else 0},
                     {"role": "assistant", "text": answer, "images": 0}]  # fmt: skip
        out.append(chat)
    return out


def render(chat: list[dict], tokenizer, processor, size: Size, rng: np.random.Generator, photo) -> dict:
    """One record as Qwen2-VL's processor gives it: ChatML-like turns (``<im_start>role\\n ... <im_end>\\n``),
    each image as ``<vision_start>`` + ``t*h*w / 4`` image tokens + ``<vision_end>`` before the user's
    text; GPT-2 ids folded below the special ids; labels on the assistant turns' text and ``<im_end>``."""
    ids_of = special_ids(size.vocab)
    fold = size.vocab - 8 - 3

    def text(s: str) -> list[int]:
        return [3 + t % fold for t in tokenizer(s)["input_ids"]]

    ids: list[int] = []
    labels: list[int] = []
    images = [make_image(rng, photo) for m in chat for _ in range(m["images"])]
    vision = processor(images=images, return_tensors="pt") if images else None
    grids = vision["image_grid_thw"].tolist() if vision is not None else []
    g = 0
    for m in chat:
        head = [ids_of["im_start"], *text(m["role"] + "\n")]
        body: list[int] = []
        for _ in range(m["images"]):
            t, h, w = grids[g]
            body += [ids_of["vision_start"], *[ids_of["image"]] * (t * h * w // 4), ids_of["vision_end"]]
            g += 1
        body += [*text(m["text"]), ids_of["im_end"]]
        tail = text("\n")
        ids += head + body + tail
        trained = m["role"] == "assistant"
        labels += (
            [IGNORE_INDEX] * len(head) + (body if trained else [IGNORE_INDEX] * len(body)) + [IGNORE_INDEX] * len(tail)
        )
    feature = {"input_ids": ids, "labels": labels}
    if vision is not None:
        feature.update(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"],
                       mm_token_type_ids=[int(i == ids_of["image"]) for i in ids])  # fmt: skip
    return feature


def build_records(n: int, size: Size, seed: int) -> list[dict]:
    """``n`` records (features of one document each), reproducible from ``seed``."""
    from matplotlib import cbook
    from PIL import Image
    from transformers import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(seed)
    tokenizer = padless.load_tokenizer("gpt2")
    processor = Qwen2VLImageProcessorPil(min_pixels=size.min_pixels, max_pixels=size.max_pixels)
    try:
        photo = np.asarray(Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB"))
    except (OSError, ValueError):  # a matplotlib without its sample data: generated pictures only
        photo = None
    return [render(chat, tokenizer, processor, size, rng, photo) for chat in chats(n, rng)]


def describe(records: list[dict]) -> dict:
    lengths = np.array([len(r["input_ids"]) for r in records])
    images = [len(r.get("image_grid_thw", [])) for r in records]
    patches = [int(np.prod(g)) for r in records for g in r.get("image_grid_thw", torch.zeros(0, 3)).tolist()]
    return {
        "records": len(records),
        "tokens": {
            "min": int(lengths.min()),
            "median": float(np.median(lengths)),
            "max": int(lengths.max()),
            "total": int(lengths.sum()),
        },  # fmt: skip
        "images": {"total": int(sum(images)), "per_record": {str(k): images.count(k) for k in sorted(set(images))}},
        "patches_per_image": {
            "min": min(patches, default=0),
            "median": float(np.median(patches)) if patches else 0.0,
            "max": max(patches, default=0),
        },  # fmt: skip
    }


# --- one step of each strategy -------------------------------------------------------------------------


def micro_batches(name: str, step: list[dict], args, collators: dict, seed: int) -> list[dict]:
    """The batches ``name`` feeds for one step's records (in the step's order)."""
    if name == "padding":
        return [collators["pad"](step[i : i + args.batch_size]) for i in range(0, len(step), args.batch_size)]
    if name == "bucketing":
        sampler = LengthGroupedBatchSampler(
            [len(r["input_ids"]) for r in step],
            batch_size=args.batch_size,
            mega_batch_mult=max(1, -(-len(step) // args.batch_size)),
            seed=seed,
        )
        return [collators["pad"]([step[i] for i in batch]) for batch in sampler]
    return [collators[name](step)]


def train_step(model, batches: list[dict], trained: int, device) -> float:
    """Forward + backward of every micro-batch (summed cross-entropy / ``trained``); returns the loss."""
    total = 0.0
    for batch in batches:
        b = batch_to(batch, device)
        labels = b["labels"]
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits  # [R, T, V]
        # labels unshifted, as transformers takes them; packed rows mask each document's first label
        ce = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        (ce / trained).backward()
        total += ce.item()
    return total / trained


def trim_heap() -> None:
    """Return freed heap to the kernel (glibc), so that a phase's RSS starts from live memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run(args, size: Size, records: list[dict]) -> dict:
    device = torch.device(args.device)
    sync = synchronizer(device)
    base = build_model(size, args.seed)
    text_shape = ModelShape.from_config(base.config.text_config)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(records))
    per = args.records_per_step
    n_steps = len(records) // per if args.steps is None else args.steps + 1
    if n_steps < 2 or n_steps * per > len(records):
        sys.exit(
            f"--records {len(records)} / --records-per-step {per} give {len(records) // per} step(s); "
            f"at least 2 are needed (a warm-up and a timed step){'' if args.steps is None else ', and --steps + 1'}"
        )
    steps = [[records[i] for i in order[s * per : (s + 1) * per]] for s in range(n_steps)]
    longest = max(len(r["input_ids"]) for r in records)
    if args.max_length < longest:
        sys.exit(f"--max-length {args.max_length} is shorter than the longest record ({longest} tokens); raise it")

    methods = {}
    for name in STRATEGIES:
        model = copy.deepcopy(base)
        model.set_attn_implementation(use_backend(BACKENDS[name]))
        model.to(device).train()
        methods[name] = dict(model=model, opt=torch.optim.AdamW(model.parameters(), lr=LR), times=[], cpu=[],
                             losses=[], peak=[], fed=[], text_flops=[], grad_norm=None)  # fmt: skip
    collators = {"pad": padless.PaddingCollator(pad_token_id=0)}
    for name in ("packing", "packing-sdpa"):
        collators[name] = padless.PackingCollator.for_model(methods[name]["model"], max_length=args.max_length)
    memory = PeakMemory(device)
    real_text, real_patches, vis_flops, rows = [], [], [], []
    for s, step in enumerate(steps):
        trained = sum(int((np.array(r["labels"][1:]) != IGNORE_INDEX).sum()) for r in step)
        grids = [tuple(g) for r in step for g in r.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long)).tolist()]
        rot = s % len(STRATEGIES)
        took = []
        for name in STRATEGIES[rot:] + STRATEGIES[:rot]:
            m = methods[name]
            batches = micro_batches(name, step, args, collators, args.seed + s)  # collation is not timed
            gc.collect()
            trim_heap()
            start_rss = current_rss_bytes() if device.type == "cpu" else 0
            memory.start()
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            loss = train_step(m["model"], batches, trained, device)
            if s == 0:
                with torch.no_grad():
                    m["grad_norm"] = float(
                        torch.sqrt(
                            sum((p.grad.double() ** 2).sum() for p in m["model"].parameters() if p.grad is not None)
                        )
                    )
            m["opt"].step()
            m["opt"].zero_grad(set_to_none=True)
            sync()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            peak = memory.stop()
            m["losses"].append(loss)
            took.append(f"{name} {elapsed:.2f} s ({cpu:.2f} s CPU)")
            if s > 0:
                m["times"].append(elapsed)
                m["cpu"].append(cpu)
                m["peak"].append(None if peak is None or start_rss is None else peak - start_rss)
                m["fed"].append(sum(int(b["input_ids"].numel()) for b in batches))
                m["text_flops"].append(executed_step_flops(text_shape, batches, trained, full_logits=True))
                if name == "packing":
                    rows.append(int(batches[0]["input_ids"].shape[0]))
        print(f"  step {s}{' (warm-up, checked)' if s == 0 else ''}: {', '.join(took)}", file=sys.stderr, flush=True)
        if s == 0:
            check(methods, args.tolerance)
        else:
            real_text.append(sum(len(r["input_ids"]) for r in step))
            real_patches.append(sum(t * h * w for t, h, w in grids))
            vis_flops.append(vision_flops(base.config.vision_config, grids))
    return dict(methods=methods, real_text=real_text, real_patches=real_patches, vision_flops=vis_flops,
                packed_rows=rows, memory_method=memory.method, n_steps=n_steps)  # fmt: skip


def check(methods: dict, tolerance: float) -> None:
    """Every strategy's first-step loss against ``padding``'s; exit above ``tolerance`` (relative)."""
    ref = methods["padding"]
    parts, worst = [], 0.0
    for name in STRATEGIES[1:]:
        m = methods[name]
        d_loss = abs(m["losses"][0] - ref["losses"][0]) / max(abs(ref["losses"][0]), 1e-12)
        d_grad = abs(m["grad_norm"] - ref["grad_norm"]) / max(ref["grad_norm"], 1e-30)
        worst = max(worst, d_loss)
        parts.append(f"{name}: loss {d_loss:.1e}, grad norm {d_grad:.1e}")
    ok = worst <= tolerance
    print(
        f"check before timing (relative to padding, loss {ref['losses'][0]:.6f}): {'; '.join(parts)} -> "
        f"{'ok' if ok else 'FAILED'} (loss tolerance {tolerance:.0e})"
    )
    if not ok:
        sys.exit(f"the strategies' first-step losses differ from padding's beyond {tolerance:.0e}; not timing them")


def summarise(result: dict) -> dict:
    """Per strategy: the figures of the table (medians over the timed steps)."""
    methods, text, patches = result["methods"], result["real_text"], result["real_patches"]
    base = methods["padding"]
    base_flops = sum(base["text_flops"]) + sum(result["vision_flops"])
    out = {}
    for name, m in methods.items():
        t = m["times"]
        flops = sum(m["text_flops"]) + sum(result["vision_flops"])
        peaks = [p for p in m["peak"] if p is not None]
        out[name] = {
            "median_step_s": statistics.median(t),
            "real_tokens_per_s": statistics.median((a + b) / x for a, b, x in zip(text, patches, t)),
            "text_tokens_per_s": statistics.median(a / x for a, x in zip(text, t)),
            "patches_per_s": statistics.median(b / x for b, x in zip(patches, t)),
            "padding_fraction": 1 - sum(text) / sum(m["fed"]),
            "text_positions_fed": sum(m["fed"]),
            "peak_step_memory_mib": max(peaks) / 2**20 if peaks else None,
            "loss_first_step": m["losses"][0],
            "losses": m["losses"],
            "speedup_vs_padding": statistics.median(b / x for b, x in zip(base["times"], t)),
            "cpu_speedup_vs_padding": statistics.median(b / x for b, x in zip(base["cpu"], m["cpu"])),
            "median_cpu_s": statistics.median(m["cpu"]),
            "flop_ideal": base_flops / flops,
            "text_flop_ideal": sum(base["text_flops"]) / sum(m["text_flops"]),
            "step_gflops": flops / len(t) / 1e9,
            "text_gflops": sum(m["text_flops"]) / len(t) / 1e9,
            "step_times_s": t,
            "step_cpu_s": m["cpu"],
        }
    return out


def table(summary: dict) -> str:
    head = ("| strategy | s/step | real tok/s | text tok/s | patches/s | padding | peak MiB | loss (step 0) "
            "| vs padding | CPU vs padding | FLOP ideal | text FLOP ideal | GFLOPs/step |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in summary.items():
        peak = "n/a" if r["peak_step_memory_mib"] is None else f"{r['peak_step_memory_mib']:.0f}"
        lines.append(
            f"| {name} | {r['median_step_s']:.2f} | {r['real_tokens_per_s']:.0f} | {r['text_tokens_per_s']:.0f} "
            f"| {r['patches_per_s']:.0f} | {r['padding_fraction']:.1%} | {peak} | {r['loss_first_step']:.6f} "
            f"| {r['speedup_vs_padding']:.2f}x | {r['cpu_speedup_vs_padding']:.2f}x | {r['flop_ideal']:.2f}x "
            f"| {r['text_flop_ideal']:.2f}x | {r['step_gflops']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="default", help="model and image sizes")
    parser.add_argument("--records", type=int, default=192, help="records in the corpus")
    parser.add_argument("--records-per-step", type=int, default=16, help="records every strategy trains per step")
    parser.add_argument("--batch-size", type=int, default=4, help="records per padded micro-batch")
    parser.add_argument("--max-length", type=int, default=1024, help="packed row length (tokens)")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps after one warm-up (default: the whole corpus, once)"
    )
    parser.add_argument("--tolerance", type=float, default=1e-5, help="relative first-step loss agreement required")
    parser.add_argument("--device", default="cpu", help="cpu or an accelerator (written for one, run on CPU only)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results JSON here")
    args = parser.parse_args(argv)
    for flag in ("records", "records_per_step", "batch_size", "max_length", "steps"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    size = SIZES[args.size]
    records = build_records(args.records, size, args.seed)
    data = describe(records)
    result = run(args, size, records)
    summary = summarise(result)
    load = os.getloadavg()
    machine = (
        f"{platform.machine()} {platform.processor() or ''}".strip()
        + f", {os.cpu_count()} cores, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {args.device}, threads {torch.get_num_threads()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    timed = result["n_steps"] - 1
    losses = np.array([m["losses"] for m in result["methods"].values()])  # [strategies, steps]
    spread = float(np.abs(losses - losses[0]).max() / max(np.abs(losses[0]).max(), 1e-12))
    out = {
        "command": "benchmarks/vlm.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": vars(args),
        "size": dataclasses.asdict(size),
        "machine": machine,
        "data": {**data, "built_with": "benchmarks/vlm.py build_records (Qwen2VLImageProcessorPil, GPT-2 tokenizer)"},
        "timed_steps": timed,
        "packed_rows_per_step": result["packed_rows"],
        "real_text_tokens_per_step": result["real_text"],
        "vision_patches_per_step": result["real_patches"],
        "vision_gflops_per_step": sum(result["vision_flops"]) / timed / 1e9,
        "memory_method": result["memory_method"],
        "max_loss_difference_relative": spread,
        "strategies": summary,
        "seconds": time.perf_counter() - started,
    }
    print(f"machine: {machine}")
    print(
        f"data: {data['records']} records, tokens per record {data['tokens']['min']}-{data['tokens']['max']} "
        f"(median {data['tokens']['median']:.0f}), {data['images']['total']} images; {timed} timed steps of "
        f"{args.records_per_step} records + 1 warm-up; packed rows of {args.max_length}: "
        f"{statistics.median(result['packed_rows']):.0f} per step (median); vision encoder "
        f"{out['vision_gflops_per_step']:.1f} GFLOPs/step in every strategy; {out['seconds']:.0f} s"
    )
    print(table(summary))
    print(f"max loss difference between strategies over all steps: {spread:.1e} relative")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
