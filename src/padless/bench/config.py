"""Benchmark configurations: named presets, and a run's resolved configuration.

Every field has a docstring underneath; :func:`field_docs` turns them into the ``--help`` of
``padless bench``, so the help cannot drift from the code.
"""

from __future__ import annotations

import dataclasses

from padless.bench.strategies import STRATEGIES


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named benchmark configuration; every field can be overridden on the command line."""

    model: str
    """Model name for :func:`padless.models.build_model`."""
    data: str
    """Corpus name (``padless.data.CORPORA``) or a path to the user's data."""
    steps: int
    """Optimiser steps per strategy."""
    batch_size: int
    """Examples per micro-batch."""
    max_length: int
    """Examples are truncated to this many tokens (packing puts a micro-batch into one row)."""
    warmup_steps: int
    """Leading steps excluded from timing (and the learning-rate warm-up)."""
    lr: float
    """Peak learning rate of AdamW (linear warm-up, then linear decay to 10%)."""
    eval_examples: int
    """Held-out examples evaluated before and after training."""
    train_on: str = "all"
    """Which tokens are trained (``all``, ``assistant``, ``completion``; see ``padless.data``)."""
    grad_accumulation: int = 1
    """Micro-batches per optimiser step."""
    limit: int | None = None
    """Read at most this many examples of the corpus (quick runs)."""

    def __post_init__(self) -> None:
        # a run that trains nothing or times nothing is refused, not reported as a result
        for name in ("steps", "batch_size", "max_length", "grad_accumulation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be >= 0 and less than steps={self.steps} "
                             "(warm-up steps are not timed)")
        if self.eval_examples < 0 or (self.limit is not None and self.limit < 1):
            raise ValueError(f"eval_examples={self.eval_examples} must be >= 0 and limit={self.limit} >= 1 (or None)")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")


PRESETS: dict[str, Preset] = {
    # about 10 minutes for all four strategies on 2 CPU cores: the smallest GPT-2 architecture with
    # the real 50k vocabulary, assistant-only training on agent traces (tool results are context)
    "default": Preset("gpt2-2layer", "agentic-rag", steps=120, batch_size=8, max_length=1024,
                      warmup_steps=5, lr=2e-3, eval_examples=32, train_on="assistant"),
    # a smoke run of about a minute (used by the tests)
    "quick": Preset("gpt2-2layer", "agentic-rag", steps=6, batch_size=4, max_length=512,
                    warmup_steps=2, lr=2e-3, eval_examples=8, train_on="assistant", limit=200),
    # GPU-sized: the 124M GPT-2 architecture, and a real fine-tune of the pretrained SmolLM2-135M
    "gpt2": Preset("gpt2", "agentic-rag", steps=200, batch_size=32, max_length=1024,
                   warmup_steps=10, lr=3e-4, eval_examples=256, train_on="assistant"),
    "smollm2": Preset("smollm2-135m", "agentic-rag", steps=200, batch_size=32, max_length=2048,
                      warmup_steps=10, lr=5e-5, eval_examples=256, train_on="assistant"),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunConfig(Preset):
    """A resolved benchmark configuration: a preset's fields (overridden by flags) plus the run's."""

    strategies: tuple[str, ...] = tuple(STRATEGIES)
    """Strategies to run, in order."""
    mode: str = "same-examples"
    """``same-examples`` or ``token-budget`` (see the module docstring)."""
    token_budget: int | None = None
    """Tokens per step, padding included, in ``token-budget`` mode (default batch size x max length)."""
    seed: int = 0
    """Seed of the model initialisation, the data split and the example order."""
    device: str = "auto"
    """``auto`` (a GPU when there is one), ``cpu``, ``cuda``, ``cuda:1``, ..."""
    dtype: str = "auto"
    """``auto`` (bfloat16 on a GPU, float32 on a CPU), or a torch dtype name."""
    tokenizer: str | None = None
    """Tokenizer name or path; default: the model's."""
    trained_logits_only: bool = True
    """Compute logits only where a token is trained, for every strategy (the loss is unchanged)."""


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
