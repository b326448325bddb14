"""padless' DPOTrainer against TRL 1.16's: from one seed, a tiny Llama (fp32, CPU) trained 3 optimiser steps
ends at TRL's parameters and logs TRL's metrics, with one prompt per pair and without, with a reference
model, with precomputed reference log-probs and LoRA; every policy and reference pass ran on packed pairs
and TRL's fused LM head kernel never ran. Also: TRL's rows become pairs, and what cannot be exact is refused."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_trl_grpo import parameters, tiny_llama, tiny_tokenizer  # noqa: E402

import integrations_support as support  # noqa: E402

STEPS = 3
PAIRS = {  # 8 pairs: prompts of 1-4 words, completions of 1-4 (TRL appends EOS); a space before each completion
    "prompt": ["w3 w4", "w5 w6 w7", "w8", "w9 w10 w11 w12", "w13 w14", "w15", "w16 w17 w18", "w19 w20"],
    "chosen": [" w21 w22", " w23", " w24 w25 w26", " w27", " w28 w29 w30 w31", " w32", " w33 w34", " w35"],
    "rejected": [" w36", " w37 w38", " w39", " w40 w41 w42", " w43", " w44 w45 w46", " w47", " w48 w49"],
}  # fmt: skip
TIMINGS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread (see test_trl_grpo.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dpo_config(out_dir, **changes):
    import trl

    options = dict(
        output_dir=str(out_dir),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=0.1,
        optim="sgd",
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        logging_steps=1,
    )
    return trl.DPOConfig(**{**options, **changes})


class Passes:
    """The packed passes (with gradients or not, shared prompt or not) and TRL's fused-head kernel calls."""

    def __init__(self, monkeypatch):
        import trl.trainer.utils as trl_utils

        import padless.objectives.rollouts as rollouts

        self.packed, self.kernel = [], 0
        stats, kernel = rollouts.completion_token_stats, trl_utils._ChunkedLogProbFunction

        def spy_stats(model, batch, **kwargs):
            pl = batch.placements
            self.packed.append((torch.is_grad_enabled(), bool((pl.prev_offset != pl.offset - 1).any())))
            return stats(model, batch, **kwargs)

        class Kernel:
            @staticmethod
            def apply(*args):
                self.kernel += 1
                return kernel.apply(*args)

        monkeypatch.setattr(rollouts, "completion_token_stats", spy_stats)
        monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Kernel)


def train(cls, args, **kwargs):
    """``cls`` trained on the pairs: the trainer and its parameters before training."""
    from datasets import Dataset

    support.offline_hub()
    kwargs.setdefault("model", tiny_llama(len(tiny_tokenizer())))
    trainer = cls(args=args, train_dataset=Dataset.from_dict(PAIRS), processing_class=tiny_tokenizer(), **kwargs)
    before = parameters(trainer)
    trainer.train()
    return trainer, before


def assert_same_parameters(got, want, initial):
    rel = max(((got[n] - want[n]).abs().max() / want[n].abs().max()).item() for n in want)
    moved = torch.stack([(want[n] - initial[n]).pow(2).sum() for n in want]).sum().sqrt()
    update = (torch.stack([(got[n] - want[n]).pow(2).sum() for n in want]).sum().sqrt() / moved).item()
    assert moved > 1e-3  # training moved the parameters
    assert rel <= 1e-5, rel
    assert update <= 1e-4, update


def assert_same_logs(got, want):
    """TRL's logged metrics (loss, rewards, log-probs, mean logits, entropy, token accuracy, grad norm) agree."""
    assert len(got) == len(want) == STEPS + 1
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key in set(w) - set(TIMINGS):
            assert math.isclose(g[key], w[key], rel_tol=1e-4, abs_tol=1e-6), (key, g[key], w[key])


@pytest.fixture(scope="module")
def trl_weighted(tmp_path_factory):
    """TRL's DPOTrainer with a reference model, two losses and WPO weighting (every per-token field it reads)."""
    import trl

    args = dpo_config(
        tmp_path_factory.mktemp("trl-dpo"), loss_type=["sigmoid", "ipo"], loss_weights=[1.0, 0.5], use_weighting=True
    )
    with pytest.MonkeyPatch.context() as patch:
        passes = Passes(patch)
        trainer, before = train(trl.DPOTrainer, args, ref_model=tiny_llama(len(tiny_tokenizer())))
    assert passes.kernel > 0 and not passes.packed  # the spies see TRL's own path
    return before, parameters(trainer), trainer.state.log_history


@pytest.mark.parametrize("share", [False, True])
def test_three_steps_end_at_trls_parameters(trl_weighted, tmp_path, monkeypatch, share):
    from padless.integrations.trl import DPOTrainer

    initial, want, logs = trl_weighted
    passes = Passes(monkeypatch)
    args = dpo_config(tmp_path, loss_type=["sigmoid", "ipo"], loss_weights=[1.0, 0.5], use_weighting=True)
    trainer, before = train(DPOTrainer, args, ref_model=tiny_llama(len(tiny_tokenizer())), share_prompt=share)
    assert all(torch.equal(before[n], p) for n, p in initial.items())
    assert_same_parameters(parameters(trainer), want, initial)
    assert_same_logs(trainer.state.log_history, logs)
    assert passes.kernel == 0  # TRL's fused LM head never ran
    assert sorted(passes.packed) == sorted([(True, share), (False, share)] * STEPS)  # policy and reference, each step


def test_lora_with_precomputed_reference_log_probs(tmp_path, monkeypatch):
    """LoRA (the reference is the adapter disabled), reference log-probs precomputed inside TRL's __init__,
    and ld_alpha; the prompt shared by default on sdpa."""
    peft = pytest.importorskip("peft")
    import trl

    from padless.integrations.trl import DPOTrainer

    config = dict(precompute_ref_log_probs=True, ld_alpha=0.5)
    lora = lambda: peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])  # noqa: E731
    reference, initial = train(trl.DPOTrainer, dpo_config(tmp_path / "trl", **config), peft_config=lora())
    passes = Passes(monkeypatch)
    trainer, before = train(DPOTrainer, dpo_config(tmp_path / "padless", **config), peft_config=lora())
    assert all(torch.equal(before[n], p) for n, p in initial.items())
    got = parameters(trainer)
    assert_same_parameters(got, parameters(reference), initial)
    assert all("lora_" in n for n, p in got.items() if not torch.equal(p, initial[n]))
    assert trainer.train_dataset["ref_chosen_logps"] == pytest.approx(
        reference.train_dataset["ref_chosen_logps"], rel=1e-5
    )
    # 8 pairs precomputed in 2 batches of 4 without gradients, then a policy pass per step
    assert passes.kernel == 0 and sorted(passes.packed) == sorted([(False, True)] * 2 + [(True, True)] * STEPS)


# ------------------------------------------------------------------ TRL's rows, refusals


def _rows(prompts, completions):
    """TRL's DataCollatorForPreference rows: ``[prompt | completion]`` right-padded (pad -8 mod 96), labels
    -100 except on the completion; ``completions`` holds every chosen, then every rejected."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    half = len(completions) // 2
    examples = [
        {"prompt_ids": p, "chosen_ids": c, "rejected_ids": r}
        for p, c, r in zip(prompts, completions[:half], completions[half:])
    ]
    batch = DataCollatorForPreference(pad_token_id=88)(examples)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    return batch["input_ids"], batch["attention_mask"], labels


def test_trls_rows_become_pairs():
    from padless.integrations.trl_rl import _preference_pairs

    features, pairs, prompt_lengths = _preference_pairs(
        *_rows([[3, 4], [5]], [[6, 7, 1], [8, 1], [9, 1], [10, 11, 12, 1]])
    )
    assert features == [
        {"prompt_ids": [3, 4], "chosen_ids": [6, 7, 1], "rejected_ids": [9, 1]},
        {"prompt_ids": [5], "chosen_ids": [8, 1], "rejected_ids": [10, 11, 12, 1]},
    ]
    assert pairs.tolist() == [0, 1] and prompt_lengths.tolist() == [2, 1]


def test_pairs_that_cannot_share_one_prompt_are_refused():
    from padless.integrations.trl_rl import _preference_pairs

    ids, mask, labels = _rows([[3, 4, 5], [6]], [[7, 1], [8, 1], [9, 1], [10, 1]])
    labels[2, 2] = ids[2, 2]  # the rejected row of pair 0 keeps one prompt token less, as keep_end cuts it
    with pytest.raises(
        ValueError,
        match=re.escape(
            "pair 0: the chosen and rejected rows hold different prompts (3 and "
            "2 tokens), as DPOConfig(truncation_mode='keep_end') cuts them"
        ),
    ):
        _preference_pairs(ids, mask, labels)
    ids, mask, labels = _rows([[3], [6]], [[7, 1], [8, 1], [9, 1], [10, 1]])
    labels[1, 0] = ids[1, 0]
    labels[3, 0] = ids[3, 0]
    with pytest.raises(ValueError, match="pair 1 has an empty prompt"):
        _preference_pairs(ids, mask, labels)
