"""padless' GRPOTrainer against TRL 1.16's: from one seed, a tiny Llama (fp32, CPU, HF generate) trained
3 optimiser steps ends at TRL's parameters, with the prompt shared and not, and with LoRA (the reference
being the adapter disabled); every log-prob pass (policy, old policy, reference) ran on packed rows and
none through TRL's padded pass. Also: TRL's rows become groups, refusals name the argument, the start
line, and the snippet of docs/integrations/trl_rl.md runs. With balance="cost" the forward chunks are dealt by
cost (groups reordered, written back to TRL's rows) and training still ends at TRL's parameters."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

PROMPTS = ["w3 w4 w5", "w6 w7", "w8 w9 w10 w11 w12", "w13"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread: these tiny models run many small ops, which two threads on a shared 2-core
    machine slow down several times over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


NUM_GENERATIONS = 4
STEPS = 3


def tiny_tokenizer():
    """A word-level tokenizer built in code (offline, 96 ids: ``<pad>``, ``<eos>``, ``w0``..``w93``), so
    the LM head is tiny; a real one (GPT-2's, from padless' assets) only makes each step slower."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", *(f"w{i}" for i in range(94))]
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    inner.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>")


def tiny_llama(vocab_size: int, attn: str = "sdpa"):
    """A 2-layer, 32-wide Llama (RoPE, grouped KV heads) from seed 0. TRL's padded rows shift a left-padded
    prompt's positions; RoPE attention is unchanged by that shift, so TRL's log-probs are the sequence's
    and the comparison is exact. Every 9th id ends a completion (generation config), so completions have
    different lengths and the masks matter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attn,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = list(range(1, vocab_size, 9))
    return model


def reward(completions, completion_ids, **kwargs):
    """Deterministic: the completion's ids divisible by 3."""
    return [float(sum(i % 3 == 0 for i in ids)) for ids in completion_ids]


def grpo_config(out_dir, **changes):
    import trl

    options = dict(
        output_dir=str(out_dir),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        num_generations=NUM_GENERATIONS,
        max_completion_length=8,
        temperature=0.8,
        learning_rate=0.1,
        optim="sgd",
        beta=0.1,
        steps_per_generation=2,  # 2 micro-batches per generation: TRL computes old log-probs
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        logging_steps=1,
    )
    return trl.GRPOConfig(**{**options, **changes})


class Passes:
    """Every log-prob pass of a trainer: which model, with gradients or not, adapters disabled or not,
    and the layout of each packed batch (shared prompt or not); plus TRL's own padded passes."""

    def __init__(self, monkeypatch):
        import trl

        import padless.objectives.rollouts as rollouts

        self.calls, self.batches, self.trl_padded = [], [], 0
        stats, padded = rollouts.completion_token_stats, trl.GRPOTrainer._get_per_token_logps_and_entropies

        def spy_stats(model, batch, **kwargs):
            pl = batch.placements
            self.batches.append(bool((pl.prev_offset != pl.offset - 1).any()))
            return stats(model, batch, **kwargs)

        def spy_padded(trainer, *args, **kwargs):
            self.trl_padded += 1
            return padded(trainer, *args, **kwargs)

        monkeypatch.setattr(rollouts, "completion_token_stats", spy_stats)
        monkeypatch.setattr(trl.GRPOTrainer, "_get_per_token_logps_and_entropies", spy_padded)

    def watch(self, trainer):
        """Record each of ``trainer``'s passes (its own override of TRL's method)."""
        method = trainer._get_per_token_logps_and_entropies

        def record(model, *args, **kwargs):
            kind = (
                "reference"
                if model is trainer.ref_model or adapters_disabled(model)
                else ("policy" if torch.is_grad_enabled() else "old policy")
            )
            self.calls.append(kind)
            return method(model, *args, **kwargs)

        trainer._get_per_token_logps_and_entropies = record
        return trainer


def adapters_disabled(model):
    """Whether the PEFT adapters of ``model`` are off (TRL's reference pass under LoRA)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    return any(m.disable_adapters for m in model.modules() if isinstance(m, BaseTunerLayer))


def train(cls, args, model, passes=None, **kwargs):
    """``cls`` trained on the prompts: the trainer and its parameters before training."""
    support.offline_hub()
    trainer = cls(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset(),
        processing_class=tiny_tokenizer(),
        **kwargs,
    )
    if passes is not None:
        passes.watch(trainer)
    before = parameters(trainer)
    trainer.train()
    return trainer, before


def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS})


def saved_model(tmp_path):
    """The tiny model saved, so that both trainers load it and build their reference model from it."""
    path = tmp_path / "tiny-llama"
    if not path.exists():
        tiny_llama(len(tiny_tokenizer())).save_pretrained(path)
    return str(path)


def parameters(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def assert_same_training(got, want, initial):
    """Parameters equal to 1e-5 relative to each tensor's size, and the update itself to 1e-4 (the update is
    what a wrong log-prob would change); returns the two measured figures."""
    rel = max(((got[n] - want[n]).abs().max() / want[n].abs().max()).item() for n in want)
    moved = torch.stack([(want[n] - initial[n]).pow(2).sum() for n in want]).sum().sqrt()
    update = (torch.stack([(got[n] - want[n]).pow(2).sum() for n in want]).sum().sqrt() / moved).item()
    assert moved > 1e-3  # training moved the parameters
    assert rel <= 1e-5, rel
    assert update <= 1e-4, update
    return rel, update


@pytest.fixture(scope="module")
def trl_full(tmp_path_factory):
    """TRL's GRPOTrainer on the saved model (its reference model loaded from it): parameters before and after."""
    import trl

    tmp = tmp_path_factory.mktemp("trl-grpo")
    path = saved_model(tmp)
    trainer, before = train(trl.GRPOTrainer, grpo_config(tmp / "out"), path)
    return path, before, parameters(trainer)


@pytest.mark.parametrize("share", [False, True])
def test_three_steps_end_at_trls_parameters(trl_full, tmp_path, monkeypatch, caplog, share):
    from padless.integrations.trl import GRPOTrainer

    path, initial, want = trl_full
    passes = Passes(monkeypatch)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    trainer, before = train(GRPOTrainer, grpo_config(tmp_path), path, passes, share_prompt=share)
    assert all(torch.equal(before[n], p) for n, p in initial.items())  # one starting point
    assert_same_training(parameters(trainer), want, initial)
    # generations at steps 0 and 2 (steps_per_generation=2): old policy and reference passes; a loss pass a step
    assert sorted(passes.calls) == sorted(["old policy", "reference"] * 2 + ["policy"] * STEPS), passes.calls
    assert passes.trl_padded == 0  # TRL's padded pass never ran
    assert passes.batches and all(b == share for b in passes.batches)  # every packed batch in the layout asked
    layout = "one prompt per group (share_prompt=True)" if share else "one document per completion (share_prompt=False)"
    said = [r.getMessage() for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert said[0] == (
        "padless: LlamaForCausalLM, attention sdpa, layout 4d-mask, exact (padless rule), GRPO log-probs "
        f"on packed rows, one row per forward chunk, {layout}, isolation guard on step 1"
    )
    assert len(said) == 3 and re.fullmatch(support.GUARD_LINE, said[1]), said  # the guard's line after step 1
    assert re.fullmatch(r"padless: GRPO rows were \d+\.\d% full, \d+ groups packed", said[2]), said  # after training


@pytest.fixture(scope="module")
def trl_pairs(tmp_path_factory):
    """TRL's GRPOTrainer with 2 generations a prompt: a generation batch of 8 rollouts is 4 groups, which
    the old-policy and reference passes (chunks of 4 completions) can deal in more than one way."""
    import trl

    tmp = tmp_path_factory.mktemp("trl-grpo-pairs")
    path = saved_model(tmp)
    trainer, before = train(trl.GRPOTrainer, grpo_config(tmp / "out", num_generations=2), path)
    return path, before, parameters(trainer)


def test_chunks_balanced_by_cost_end_at_trls_parameters(trl_pairs, tmp_path, monkeypatch, caplog):
    """balance="cost" deals the groups to the forward chunks by cost, in another order than TRL's; the
    log-probs go back to TRL's rows, so the old-policy and reference log-probs (importance ratio and KL of
    the loss) are TRL's and the parameters end where TRL's do. Every pass's chunks: max/mean cost no higher
    than the order-preserving chunks'."""
    import padless.integrations.trl_grpo as trl_grpo
    from padless.integrations.trl import GRPOTrainer
    from padless.planning.balance import group_loads

    path, initial, want = trl_pairs
    seen, forward_chunks = [], trl_grpo._forward_chunks

    def spy(features, size, **kwargs):
        chunks = forward_chunks(features, size, **kwargs)
        seen.append((features, size, kwargs, chunks))
        return chunks

    monkeypatch.setattr(trl_grpo, "_forward_chunks", spy)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    trainer, before = train(GRPOTrainer, grpo_config(tmp_path, num_generations=2), path, balance="cost")
    assert all(torch.equal(before[n], p) for n, p in initial.items())
    assert_same_training(parameters(trainer), want, initial)
    reordered = 0
    for features, size, kwargs, chunks in seen:
        assert kwargs["balance"] == "cost" and kwargs["cost_a"] == 12 * 32  # the policy's hidden_size
        in_order = forward_chunks(features, size)
        assert len(chunks) == len(in_order)  # as many chunks as TRL's order makes
        assert sorted(i for c in chunks for i in c) == list(range(len(features)))  # every group once, whole
        _, costs = group_loads(
            [len(f["prompt_ids"]) for f in features],
            [[len(c) for c in f["completion_ids"]] for f in features],
            share_prompt=kwargs["share_prompt"],
            cost_a=kwargs["cost_a"],
        )
        spread = {
            k: max(costs[c].sum() for c in v) / costs.sum() * len(v)
            for k, v in (("cost", chunks), ("tokens", in_order))
        }
        assert spread["cost"] <= spread["tokens"] + 1e-12, spread
        reordered += chunks != in_order
    assert reordered  # some pass ran its groups in another order than TRL's
    said = [r.getMessage() for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert len(said) == 3 and said[0].endswith(", forward chunks balanced by cost a*l + l**2 (a=384)"), said


def test_forward_chunks_by_cost_are_as_many_and_no_less_even():
    """A long-tailed generation batch: TRL's order puts the long groups together; by cost they spread."""
    from padless.integrations.trl_rl import _forward_chunks
    from padless.planning.balance import group_loads

    rng = np.random.default_rng(0)
    prompts = [int(p) for p in np.clip(rng.lognormal(np.log(20), 1.0, 24), 1, 200)]
    completions = [[int(c) for c in np.clip(rng.lognormal(np.log(30), 1.2, 4), 1, 400)] for _ in prompts]
    features = [{"prompt_ids": [5] * p, "completion_ids": [[6] * c for c in cs]} for p, cs in zip(prompts, completions)]
    in_order = _forward_chunks(features, 8)
    assert in_order == [[2 * k, 2 * k + 1] for k in range(12)]  # 2 groups of 4 completions a chunk, in order
    assert _forward_chunks(features[:1], 2) == [[0]]  # a group of more than size completions: a chunk of its own
    for share in (False, True):
        by_cost = _forward_chunks(features, 8, balance="cost", share_prompt=share, cost_a=768.0)
        assert len(by_cost) == 12 and sorted(i for c in by_cost for i in c) == list(range(24))
        _, costs = group_loads(prompts, completions, share_prompt=share, cost_a=768.0)
        ratio = {
            k: max(costs[c].sum() for c in v) * len(v) / costs.sum()
            for k, v in (("cost", by_cost), ("tokens", in_order))
        }
        assert ratio["cost"] < ratio["tokens"], ratio


def test_with_lora_the_reference_is_the_adapter_disabled(tmp_path, monkeypatch):
    peft = pytest.importorskip("peft")
    import trl

    from padless.integrations.trl import GRPOTrainer

    lora = lambda: peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])  # noqa: E731
    vocab = len(tiny_tokenizer())
    reference, initial = train(trl.GRPOTrainer, grpo_config(tmp_path / "trl"), tiny_llama(vocab), peft_config=lora())
    passes = Passes(monkeypatch)
    trainer, before = train(
        GRPOTrainer, grpo_config(tmp_path / "padless"), tiny_llama(vocab), passes, peft_config=lora()
    )
    assert type(trainer.model).__name__.startswith("PeftModel") and trainer.ref_model is None
    assert all(torch.equal(before[n], p) for n, p in initial.items())  # one starting point, adapter included
    got = parameters(trainer)
    assert_same_training(got, parameters(reference), initial)
    changed = {n for n, p in got.items() if not torch.equal(p, initial[n])}
    assert changed and all("lora_" in n for n in changed)  # the adapter alone trained
    assert sorted(passes.calls) == sorted(["old policy", "reference"] * 2 + ["policy"] * STEPS), passes.calls
    assert passes.trl_padded == 0 and all(passes.batches)  # sdpa runs the shared-prompt tree: the default


# ------------------------------------------------------------------ TRL's rows, refusals


def test_trls_rows_become_groups_of_one_prompt():
    from padless.integrations.trl_rl import _rollout_groups

    t = torch.tensor
    prompt_ids = t([[0, 7, 8], [9, 9, 5], [0, 7, 8], [0, 0, 4], [9, 9, 5]])  # left-padded; rows 0 and 2 share one
    prompt_mask = t([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]])
    completion_ids = t([[1, 2, 0], [3, 0, 0], [4, 5, 6], [7, 0, 0], [0, 0, 0]])
    completion_mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]])  # row 4: masked out (truncated)
    features, rows = _rollout_groups(prompt_ids, prompt_mask, completion_ids, completion_mask)
    assert features == [
        {"prompt_ids": [7, 8], "completion_ids": [[1, 2], [4, 5, 6]]},
        {"prompt_ids": [9, 9, 5], "completion_ids": [[3]]},
        {"prompt_ids": [4], "completion_ids": [[7]]},
    ]
    assert rows.tolist() == [0, 2, 1, 3]
    holed = prompt_mask.clone()
    holed[1, 1] = 0
    with pytest.raises(ValueError, match=r"prompt_mask row 1 is not left-padded \(a 0 between its tokens\)"):
        _rollout_groups(prompt_ids, holed, completion_ids, completion_mask)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A padless GRPOTrainer that has not trained (for the passes called directly)."""
    from padless.integrations.trl import GRPOTrainer

    support.offline_hub()
    args = grpo_config(tmp_path_factory.mktemp("grpo") / "out", beta=0.0)
    return GRPOTrainer(
        model=tiny_llama(len(tiny_tokenizer())),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset(),
        processing_class=tiny_tokenizer(),
        max_length=12,
    )


def _rows():
    ids = torch.tensor([[0, 3, 4, 5, 6, 1], [7, 8, 9, 2, 0, 0]])  # [prompt 3 | completion 3]
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    return ids, mask


def test_a_pass_called_directly_returns_trls_layout(trainer):
    ids, mask = _rows()
    with torch.no_grad():
        logps, entropies, aux = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, 3, compute_entropy=True
        )
        for b, (p, c) in enumerate([([3, 4], [5, 6, 1]), ([7, 8, 9], [2])]):
            logits = trainer.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1] / 0.8
            want = logits.log_softmax(-1).gather(1, torch.tensor(c)[:, None])[:, 0]
            torch.testing.assert_close(logps[b, : len(c)], want, atol=1e-5, rtol=1e-5)
    assert logps.shape == entropies.shape == (2, 3) and aux is None
    assert logps[1, 1:].abs().sum() == 0 and entropies[1, 1:].abs().sum() == 0


def test_what_cannot_be_exact_is_refused_naming_the_argument(trainer):
    ids, mask = _rows()
    with pytest.raises(ValueError, match=re.escape("GRPOTrainer: multimodal inputs (pixel_values) are not packed yet")):
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 3, pixel_values=torch.zeros(2, 3, 4, 4))
    long_ids = torch.cat([torch.tensor([[9] * 10, [8] * 10]), ids[:, 3:]], dim=1)  # two prompts of 10 tokens
    long_mask = torch.cat([torch.ones(2, 10, dtype=torch.long), mask[:, 3:]], dim=1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "a group (a prompt and 1 completion) needs 13 tokens in one row "
            "(share_prompt=True), more than GRPOTrainer(max_length=12); a group "
            "never splits"
        ),
    ):
        trainer._get_per_token_logps_and_entropies(trainer.model, long_ids, long_mask, 3)


def test_a_shared_prompt_the_backend_cannot_run_is_refused_or_left_out(tmp_path):
    """A Mistral with a 4-token sliding window on sdpa: the 4D tree mask carries no window, so
    share_prompt=True is refused naming the backend that can; the default packs documents and says why."""
    from transformers import MistralConfig, MistralForCausalLM

    from padless.integrations.trl import GRPOTrainer

    support.offline_hub()
    config = MistralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
        attn_implementation="sdpa",
    )
    kwargs = dict(
        reward_funcs=reward,
        args=grpo_config(tmp_path, beta=0.0),
        train_dataset=dataset(),
        processing_class=tiny_tokenizer(),
    )
    with pytest.raises(
        ValueError,
        match=r"the 4D tree mask of a shared prompt carries no sliding window; use backend "
        r"'padless' \(attn_implementation='padless' when loading the model, or in "
        r"GRPOConfig.model_init_kwargs\)",
    ):
        GRPOTrainer(model=MistralForCausalLM(config), share_prompt=True, **kwargs)
    trainer = GRPOTrainer(model=MistralForCausalLM(config), **kwargs)
    assert re.search(
        r"layout 4d-mask with sliding window 4, exact \(padless rule\), .* one document per completion "
        r"\(share_prompt=False\); shared prompt refused: .* carries no sliding window",
        trainer.start_line(),
    )
    with pytest.raises(
        ValueError,
        match=re.escape(
            "GRPOTrainer(share_prompt=...) must be True, False or None (shared where the backend can), got 'yes'"
        ),
    ):
        GRPOTrainer(model=MistralForCausalLM(config), share_prompt="yes", **kwargs)
    with pytest.raises(ValueError, match=r"GRPOTrainer\(max_length=...\) must be"):
        GRPOTrainer(model=MistralForCausalLM(config), max_length=0, **kwargs)
    with pytest.raises(ValueError, match=re.escape("unknown GRPOTrainer(balance='flops'); choose one of tokens, cost")):
        GRPOTrainer(model=MistralForCausalLM(config), balance="flops", **kwargs)
    with pytest.raises(ValueError, match=re.escape("cost_a is used only with GRPOTrainer(balance='cost')")):
        GRPOTrainer(model=MistralForCausalLM(config), cost_a=100, **kwargs)


# ------------------------------------------------------------------ the docs page


def test_the_docs_snippet_runs(tmp_path, monkeypatch, capsys):
    page = support.ROOT / "docs" / "integrations" / "trl_rl.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    assert blocks
    support.offline_hub()
    monkeypatch.chdir(tmp_path)
    exec(compile("\n".join(blocks), str(page), "exec"), {"__name__": "__doc_snippet__"})
    out = capsys.readouterr().out
    assert re.search(r"^GRPO: 2 steps, loss -?\d+\.\d+$", out, flags=re.M), out
    assert re.search(r"^DPO: 2 steps, loss \d+\.\d+$", out, flags=re.M), out


def test_the_rl_trainers_import_beside_sft_trainer():
    import trl

    from padless.integrations import trl as padless_trl

    assert issubclass(padless_trl.GRPOTrainer, trl.GRPOTrainer) and issubclass(padless_trl.DPOTrainer, trl.DPOTrainer)
    assert padless_trl.SFTTrainer is padless_trl.PackedSFTTrainer
