"""The benchmark's configuration: one frozen dataclass, :class:`RunConfig`, and named presets of it.

The same type is what ``padless bench`` is asked to run (its flags are generated from the fields,
their help from the docstring under each field, see :func:`field_docs`) and what ``results.json``
records under ``config`` (with ``device`` and ``dtype`` resolved, and ``world_size`` filled in).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from padless.bench.strategies import BENCH_STRATEGIES

Mode = Literal["same-examples", "token-budget"]
Allocator = Literal["auto", "glibc", "glibc-tuned", "jemalloc", "tcmalloc"]
Compile = Literal["off", "static", "dynamic"]
Distributed = Literal["ddp", "fsdp"]

RESULT_ONLY_FIELDS = ("world_size",)
"""Fields the run fills in (recorded in results.json), not flags."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What ``padless bench`` runs; every field is a flag (``--batch-size`` for ``batch_size``)."""

    model: str = "gpt2-2layer"
    """Model name for padless.models.factory.build_model (a GPT-2 size, smollm2-135m, tiny-<family>, a path)."""
    data: str = "agentic-rag"
    """Corpus name (padless.data.CORPORA) or a path to the user's data."""
    steps: int = 120
    """Optimiser steps per strategy."""
    batch_size: int = 8
    """Examples per micro-batch."""
    max_length: int = 1024
    """Examples are truncated to this many tokens (packing puts a micro-batch into one row)."""
    warmup_steps: int = 5
    """Leading steps excluded from timing (and the learning-rate warm-up); a speedup needs at least 5
    timed steps after them, fewer are reported with a warning."""
    lr: float = 2e-3
    """Peak learning rate of AdamW (linear warm-up, then linear decay to 10%)."""
    eval_examples: int = 32
    """Held-out examples evaluated before and after training."""
    train_on: str = "assistant"
    """Which tokens are trained (all, assistant, completion; see padless.data)."""
    grad_accumulation: int = 1
    """Micro-batches per optimiser step."""
    limit: int | None = None
    """Read at most this many examples of the corpus (quick runs)."""
    strategies: tuple[str, ...] = tuple(BENCH_STRATEGIES)
    """Strategies to run, in order (comma-separated: padding,bucketing,packing,flattening)."""
    mode: Mode = "same-examples"
    """same-examples (every strategy trains the same examples per step) or token-budget (a fixed
    number of tokens per step, padding included)."""
    token_budget: int | None = None
    """Tokens per step, padding included, in token-budget mode (default batch size x max length)."""
    seed: int = 0
    """Seed of the model initialisation, the data split and the example order."""
    device: str = "auto"
    """auto (a GPU when there is one), cpu, cuda, cuda:1, ..."""
    dtype: str = "auto"
    """auto (bfloat16 on a GPU, float32 on a CPU), float32, bfloat16, float16. A 16-bit dtype trains
    fp32 master weights under autocast."""
    processor: str | None = None
    """A vision-language model's processor (``offline``: the embedded Qwen2-VL one, or a hub name / folder):
    the data's chats with images are rendered through it, each document's images travel with it, and
    every strategy feeds them to the model."""
    tokenizer: str | None = None
    """Tokenizer name or path; default: the model's (padless.models.factory.tokenizer_name_for: gpt2
    for the GPT-2 sizes, the packaged one for smollm2-135m); results.json records the tokenizer used."""
    full_logits: bool = False
    """Compute logits at every position, as Trainer does (default: only for trained tokens, for every
    strategy; the loss is the same)."""
    threads: int | None = None
    """torch CPU threads (default: torch's choice)."""
    in_process: bool = False
    """Run every strategy in this process (default: each in its own process, so one strategy's
    allocator state and memory peak cannot leak into the next)."""
    allocator: Allocator = "auto"
    """Memory allocator of the strategy processes: glibc (untuned), glibc-tuned (glibc with mmap and
    trim thresholds raised, so large tensors are not returned to the kernel every step), jemalloc,
    tcmalloc (where installed), or auto (glibc-tuned, see padless/bench/isolate.py)."""
    compile: Compile = "off"
    """torch.compile every strategy's decoder layers the same way (padless.compile_layers, inductor):
    off, static (dynamic=False: one graph per row shape; needs pad_to_multiple_of) or dynamic
    (dynamic=True: symbolic shapes). Compile time is reported apart, and a steady-state tok/s
    leaves out the steps that compiled."""
    pad_to_multiple_of: int | None = None
    """Round every strategy's row length up to a multiple of this (padded, bucketed, packed and
    flattened rows alike): fewer distinct shapes for compile, more padding."""
    lora: int | None = None
    """Train every strategy's model through a LoRA adapter of this rank (padless.models.lora.with_lora,
    peft's default modules, base weights frozen; needs padless[peft]); unset: full fine-tuning."""
    distributed: Distributed = "ddp"
    """How ranks train together under torchrun: ddp (a whole replica per rank, gradients all-reduced;
    with one process nothing is wrapped) or fsdp (FSDP2 through padless.models.fsdp.shard_model: parameters,
    gradients and optimiser state sharded over the ranks per decoder layer; under torchrun only, with
    one process too). The loss is the same token-normalised one."""
    world_size: int = 1
    """Data-parallel processes (torchrun) the run found; per-step figures are summed over them."""

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in BENCH_STRATEGIES]
        if unknown or not self.strategies:
            raise ValueError(
                f"strategies: unknown strategy {unknown[0] if unknown else '(none given)'!r}; "
                f"choose from {', '.join(BENCH_STRATEGIES)}"
            )
        for name, allowed in (
            ("mode", Mode),
            ("allocator", Allocator),
            ("compile", Compile),
            ("distributed", Distributed),
        ):
            if getattr(self, name) not in typing.get_args(allowed):
                raise ValueError(f"{name} {getattr(self, name)!r}: choose one of {', '.join(typing.get_args(allowed))}")
        if self.lora is not None and (isinstance(self.lora, bool) or not isinstance(self.lora, int) or self.lora < 1):
            raise ValueError(f"lora={self.lora!r} must be a LoRA rank >= 1 (an integer)")
        for name in ("steps", "batch_size", "max_length", "eval_examples", "grad_accumulation", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be >= 1 (an integer)")
        # a run that trains nothing or times nothing is refused, not reported as a result
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} must be >= 0 and less than steps={self.steps} "
                "(warm-up steps are not timed)"
            )
        multiple = self.pad_to_multiple_of
        if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1):
            raise ValueError(f"pad_to_multiple_of={multiple!r} must be >= 1 (an integer) or None")
        if self.distributed == "fsdp" and (self.compile != "off" or self.dtype == "float16" or self.lora is not None):
            what = (
                f"compile={self.compile!r}"
                if self.compile != "off"
                else "lora (frozen base weights in the shards)"
                if self.lora is not None
                else "dtype='float16' (loss scaling of shards)"
            )
            raise ValueError(f"distributed='fsdp' with {what} has not been run; use distributed='ddp' for it")
        if self.compile == "static" and multiple is None:
            raise ValueError(
                "compile='static' compiles a graph per row shape, so pad_to_multiple_of must be set "
                "(e.g. 64: rows then take a few shapes); or use compile='dynamic'"
            )
        if self.processor is not None and "flattening" in self.strategies:
            raise ValueError(
                "strategies: flattening (transformers' DataCollatorWithFlattening) drops a record's images; "
                "with a processor choose from padding, bucketing, packing"
            )
        if self.data == "captions" and self.processor is None:
            raise ValueError("data 'captions' holds images: it needs processor (e.g. 'offline')")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or None), got {self.limit}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


PRESETS: dict[str, RunConfig] = {
    # about 10 minutes for all four strategies on 2 CPU cores: the smallest GPT-2 architecture with
    # the real 50k vocabulary, assistant-only training on agent traces (tool results are context)
    "default": RunConfig(),
    # a smoke run of about a minute (used by the tests)
    "quick": RunConfig(steps=6, batch_size=4, max_length=512, warmup_steps=2, eval_examples=8, limit=200),
    # a real fine-tune on a CPU: the pretrained SmolLM2-135M on short dialogues (median 52 tokens),
    # 16 examples a step, about 20 minutes for all four strategies on 2 cores (a 4-step trial: padding
    # 7.6 s, packing 4.2 s median per step)
    "smollm2-cpu": RunConfig(model="smollm2-135m", data="dialogues", steps=40, batch_size=16, max_length=512,
                             warmup_steps=4, lr=5e-5, eval_examples=32),
    # GPU-sized: the 124M GPT-2 architecture, and a real fine-tune of the pretrained SmolLM2-135M
    "gpt2": RunConfig(model="gpt2", steps=200, batch_size=32, warmup_steps=10, lr=3e-4, eval_examples=256),
    "smollm2": RunConfig(model="smollm2-135m", steps=200, batch_size=32, max_length=2048, warmup_steps=10,
                         lr=5e-5, eval_examples=256),
    # vision-language: a tiny Qwen2-VL matched to the offline processor, on chats with 0-2 images each
    # (padless.bench.captions), padding / bucketing / packing with the images travelling with their documents
    "vlm": RunConfig(model="tiny-qwen2-vl", data="captions", processor="offline", steps=40, batch_size=8,
                     max_length=512, warmup_steps=4, eval_examples=16, strategies=("padding", "bucketing", "packing")),
}  # fmt: skip


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (read from its source), for ``--help``."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr):
            if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split()).replace("%", "%%")  # argparse formats help
    return docs
