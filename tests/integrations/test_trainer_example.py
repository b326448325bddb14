"""``examples/trainer.py``: padless packing under ``transformers.Trainer`` gives the first step's loss and
gradients of padding under Trainer on the same examples (fp32), and the script runs offline."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "trainer.py"
MAX_LENGTH, GRAD_ACCUM, NUM_EXAMPLES = 160, 2, 8


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("padless_trainer_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def examples(example):
    # train_on="all": every example's first token is a label, which is where Trainer's count of GPT-2's
    # trained tokens goes wrong without count_shifted_labels.
    feats = example.load_examples("dialogues", NUM_EXAMPLES, 0, max_length=MAX_LENGTH, train_on="all")
    assert len(feats) == NUM_EXAMPLES and all(f["labels"][0] != -100 for f in feats)
    return feats


def _first_step(example, examples, tmp_path, mode, attn):
    """(loss, gradients, num_items_in_batch) of the first optimiser step: all examples, 2 micro-batches."""
    import torch
    from transformers import TrainerCallback

    from padless.attention.backend import register_padless_attention
    from padless.models.factory import build_model
    from padless.planning.schedule import schedule_epoch

    class FirstGrads(TrainerCallback):
        grads = None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if self.grads is None:
                self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    if attn == "padless":
        register_padless_attention()
    model = build_model("gpt2-2layer", attn_implementation=attn, seed=0)
    lengths = [len(e["input_ids"]) for e in examples]
    rows = schedule_epoch(lengths, MAX_LENGTH, world_size=1, rows_per_batch=1).plan.num_rows
    assert rows >= GRAD_ACCUM
    capture = FirstGrads()
    trainer = example.make_trainer(
        model,
        examples,
        mode=mode,
        output_dir=str(tmp_path / mode),
        max_length=MAX_LENGTH,
        rows_per_batch=-(-rows // GRAD_ACCUM),
        batch_size=NUM_EXAMPLES // GRAD_ACCUM,
        grad_accum=GRAD_ACCUM,
        steps=1,
        callbacks=[capture],
    )
    trainer.args.max_grad_norm = 0.0  # compare raw gradients, not clipped ones
    losses, counts = [], []
    training_step, compute_loss = trainer.training_step, trainer.compute_loss

    def record_step(*args, **kwargs):
        losses.append(training_step(*args, **kwargs))
        return losses[-1]

    def record_count(model, inputs, return_outputs=False, num_items_in_batch=None):
        counts.append(int(num_items_in_batch))
        return compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    trainer.training_step, trainer.compute_loss = record_step, record_count
    trainer.train()
    assert len(losses) == GRAD_ACCUM and len(set(counts)) == 1  # one count for the whole step
    return torch.stack(losses).sum().item(), capture.grads, counts[0]


def _trained_tokens(examples):
    return sum(sum(t != -100 for t in e["labels"][1:]) for e in examples)


@pytest.fixture(scope="module")
def padded_step(example, examples, tmp_path_factory):
    return _first_step(example, examples, tmp_path_factory.mktemp("padded"), "padded", "sdpa")


@pytest.mark.parametrize("attn", ["padless", "sdpa"])
def test_packed_trainer_step_equals_padded_trainer_step(example, examples, padded_step, tmp_path, attn):
    import torch

    padded_loss, padded_grads, padded_count = padded_step
    packed_loss, packed_grads, packed_count = _first_step(example, examples, tmp_path, "packed", attn)
    assert padded_count == packed_count == _trained_tokens(examples)  # Trainer counts like padless
    assert math.isclose(packed_loss, padded_loss, rel_tol=1e-6), (packed_loss, padded_loss)
    scale = max(g.abs().max().item() for g in padded_grads.values())
    for name, g in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], g, rtol=1e-5, atol=1e-6 * scale, msg=name)


def test_without_the_count_fix_trainer_counts_gpt2_first_labels(example, examples, padded_step, tmp_path, monkeypatch):
    """Trainer counts labels[..., 0] for GPT-2 (loss_type None): the padded step's loss is then
    divided by one token too many per example and no longer equals the packed one."""
    fixed_loss, _, fixed_count = padded_step
    monkeypatch.setattr(example, "count_shifted_labels", lambda model: model)
    loss, _, count = _first_step(example, examples, tmp_path, "padded", "sdpa")
    assert count == fixed_count + NUM_EXAMPLES
    assert math.isclose(loss * count, fixed_loss * fixed_count, rel_tol=1e-5)  # same sum, other divisor
    assert not math.isclose(loss, fixed_loss, rel_tol=1e-3)


def test_trainer_replans_packed_rows_every_epoch(example, examples, tmp_path):
    """Trainer calls set_epoch on the loader each epoch; the sampler then trains a new plan of the same
    tokens."""
    from padless.batching.samplers import DistributedPackedBatchSampler
    from padless.models.factory import build_model

    model = build_model("gpt2-2layer", attn_implementation="sdpa", seed=0)
    rows = len(DistributedPackedBatchSampler([len(e["input_ids"]) for e in examples], MAX_LENGTH, 1))
    trainer = example.make_trainer(
        model,
        examples,
        mode="packed",
        output_dir=str(tmp_path),
        max_length=MAX_LENGTH,
        rows_per_batch=1,
        steps=2 * rows,
    )  # one row per step, two epochs
    seen = []
    training_step = trainer.training_step

    def record(model, inputs, num_items_in_batch=None):
        seen.append((trainer.batch_sampler.epoch, tuple(inputs["input_ids"][0].tolist())))
        return training_step(model, inputs, num_items_in_batch)

    trainer.training_step = record
    trainer.train()
    assert [epoch for epoch, _ in seen] == [0] * rows + [1] * rows
    first, second = [row for _, row in seen[:rows]], [row for _, row in seen[rows:]]
    assert first != second
    assert sorted(t for row in first for t in row) == sorted(t for row in second for t in row)


@pytest.mark.slow
def test_example_script_runs_offline(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--steps",
            "2",
            "--limit",
            "32",
            "--grad-accum",
            "1",
            "--max-length",
            "128",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step\s+\d+\s+loss (\S+)$", out.stdout, flags=re.M)]
    assert len(losses) == 2 and all(math.isfinite(x) and 0 < x < 20 for x in losses), out.stdout
    assert "packed: 2 optimiser steps" in out.stdout
    # the start line reaches a user who set up no logging (stderr, as transformers' own warnings)
    starts = re.findall(r"^padless: .*$", out.stderr, flags=re.M)
    assert len(starts) == 2 and re.fullmatch(
        r"padless: GPT2LMHeadModel, attention padless, layout varlen, exact \(padless rule\), 128-token rows, "
        r"\d+\.\d documents per row \(planned rows\), rows \d+\.\d% full, isolation guard on step 1",
        starts[0],
    ), out.stderr[-3000:]
    assert re.fullmatch(support.GUARD_LINE, starts[1]), starts[1]  # the first step checked, and its cost
