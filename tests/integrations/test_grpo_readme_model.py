"""padless' GRPOTrainer on the model the README builds (the packaged SmolLM2-135M on the padless
attention backend): TRL generates with it (left-padded prompts, a KV cache: padless attention runs
those steps as transformers' sdpa runs them) and the log-prob passes run on packed rows; two steps
train and move the weights."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

PROMPTS = ["The capital of France is", "Two plus two equals", "Rain in Oslo means", "A short poem:"]


def reward(completions, completion_ids, **kwargs):
    """Deterministic and varied across a group (so advantages are not all zero): the completion's even ids."""
    return [float(sum(i % 2 == 0 for i in ids)) for ids in completion_ids]


def test_grpo_trains_two_steps_on_the_readme_model(tmp_path):
    import trl
    from datasets import Dataset

    import padless
    from padless.integrations.trl import GRPOTrainer

    padless.register_padless_attention()
    model = padless.build_model("smollm2-135m", attn_implementation="padless")
    tokenizer = padless.load_tokenizer("smollm2-135m")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        temperature=1.0,
        beta=0.0,
        learning_rate=1e-3,
        optim="sgd",
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    before = model.lm_head.weight.detach().clone()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(log.get("reward_std", 0) > 0 for log in trainer.state.log_history)
    assert model.config._attn_implementation == "padless"  # generation ran on it, not on a swapped backend
    assert not torch.equal(model.lm_head.weight.detach(), before)
    said = trainer.rows_said()  # logged after training: how full the log-prob passes' rows were
    assert said is not None and "rows were" in said and "% full" in said and "groups packed" in said, said
