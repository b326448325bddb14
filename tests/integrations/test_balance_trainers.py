"""``balance="tokens" | "cost"`` in the trainers (PackedTrainer, padless' SFTTrainer), on 2 simulated ranks:
each rank's trainer reads its share off the same schedule (the arguments say world size 2 and the rank),
every rank gets the same number of micro-batches, every document reaches a micro-batch exactly once over
the ranks, and balancing by cost leaves the ranks' costs no less even than balancing by tokens on a
long-tailed set. Bad values are refused naming the trainer argument. The RL forward chunks:
tests/integrations/test_trl_grpo.py."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

pytest.importorskip("accelerate")

MAX_LENGTH, ROWS_PER_BATCH, WIDTH = 128, 2, 64  # tiny-llama: 64 wide, so a = 12 * 64 = 768


def long_tail(n: int = 120, seed: int = 0) -> list[dict[str, list[int]]]:
    """``n`` sequences of lognormal lengths (median 12, sigma 1.2, clipped to 2..128: many short, a few
    filling a row), random ids of a 512-id vocabulary, every token trained."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(12), 1.2, n).astype(int), 2, MAX_LENGTH)
    return [{"input_ids": rng.integers(2, 512, int(k)).tolist()} for k in lengths]


def as_rank(cls, rank: int, world_size: int = 2):
    """``cls`` (TrainingArguments or SFTConfig) saying this process is ``rank`` of ``world_size``: what
    the trainers read to build their DistributedPackedBatchSampler (no process group is started)."""
    return type(
        f"Rank{rank}{cls.__name__}",
        (cls,),
        {"world_size": property(lambda self: world_size), "process_index": property(lambda self: rank)},
    )


def documents(batch) -> list[tuple[int, ...]]:
    """The documents of a collated micro-batch: each row cut where ``position_ids`` restart, a piece
    with no trained label (a row's padding) left out."""
    out = []
    for ids, pos, labels in zip(batch["input_ids"].tolist(), batch["position_ids"].tolist(), batch["labels"].tolist()):
        starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
        for a, b in zip(starts, starts[1:]):
            if any(x != -100 for x in labels[a:b]):
                out.append(tuple(ids[a:b]))
    return out


def rank_cost_spread(sampler) -> float:
    """The epoch's time over a perfectly balanced one when a step takes its costliest rank's time: the
    sum over steps of the largest rank cost over the sum of the mean rank costs (1.0: even)."""
    from padless.planning.balance import row_costs

    sched = sampler.schedule()
    loads = sched.step_loads(row_costs(sched.plan, 12.0 * WIDTH))  # [steps, ranks]
    return float(loads.max(1).sum() / loads.mean(1).sum())


def packed_trainer(tmp_path, rank, feats, **options):
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    args = as_rank(TrainingArguments, rank)(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=ROWS_PER_BATCH,
        disable_tqdm=True,
    )
    return PackedTrainer(
        model=support.model("sdpa", "tiny-llama"), args=args, train_dataset=feats, max_length=MAX_LENGTH, **options
    )


def sft_trainer(tmp_path, rank, feats, **options):
    support.offline_hub()
    from trl import SFTConfig

    from padless.integrations.trl import SFTTrainer

    args = as_rank(SFTConfig, rank)(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        bf16=False,
        packing=True,
        max_length=MAX_LENGTH,
        per_device_train_batch_size=ROWS_PER_BATCH,
        disable_tqdm=True,
    )
    return SFTTrainer(
        model=support.model("sdpa", "tiny-llama"),
        args=args,
        train_dataset=support.dataset(feats),
        processing_class=support.tokenizer(),
        **options,
    )


TRAINERS = {"PackedTrainer": packed_trainer, "SFTTrainer": sft_trainer}


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("name", list(TRAINERS))
def test_two_ranks_get_as_many_micro_batches_and_train_every_document_once(tmp_path, name):
    if name == "SFTTrainer":
        pytest.importorskip("trl")
    feats = long_tail()
    spread = {}
    for balance in ("tokens", "cost"):
        seen, steps = Counter(), []
        for rank in (0, 1):
            trainer = TRAINERS[name](tmp_path / f"{balance}{rank}", rank, feats, balance=balance)
            sampler = trainer.batch_sampler
            assert (sampler.num_replicas, sampler.rank, sampler.balance) == (2, rank, balance)
            assert sampler.cost_a == (12.0 * WIDTH if balance == "cost" else None)  # read from the model's config
            loader = trainer.get_train_dataloader()
            batches = list(loader)
            steps.append((len(loader), len(batches)))
            for batch in batches:
                assert batch["input_ids"].shape[0] <= ROWS_PER_BATCH
                seen.update(documents(batch))
        assert steps[0] == steps[1] and steps[0][0] == steps[0][1] > 1, steps  # the same micro-batches on each rank
        assert seen == Counter(tuple(f["input_ids"]) for f in feats)  # nothing dropped, nothing twice
        spread[balance] = rank_cost_spread(sampler)
    assert spread["cost"] <= spread["tokens"], spread  # measured: 1.0062 against 1.0189 (seed 42, both trainers)
    assert spread["tokens"] > 1.01  # the set is long-tailed enough for the token deal to leave ranks waiting


def test_the_start_line_says_the_ranks_are_balanced_by_cost(tmp_path):
    feats = long_tail(20)
    by_tokens = packed_trainer(tmp_path / "t", 0, feats).start_line()
    by_cost = packed_trainer(tmp_path / "c", 0, feats, balance="cost").start_line()
    assert "balanced" not in by_tokens
    assert ", 128-token rows, ranks balanced by cost a*l + l**2 (a=768), " in by_cost, by_cost
    assert (
        ", ranks balanced by cost a*l + l**2 (a=100), "
        in packed_trainer(tmp_path / "n", 0, feats, balance="cost", cost_a=100).start_line()
    )


def test_bad_balance_arguments_are_refused_naming_the_trainer_argument(tmp_path):
    feats = long_tail(20)
    for options, said in [
        ({"balance": "flops"}, "unknown PackedTrainer(balance='flops'); choose one of tokens, cost"),
        ({"cost_a": 768}, "cost_a is used only with PackedTrainer(balance='cost')"),
        ({"balance": "cost", "cost_a": -1.0}, "PackedTrainer(cost_a=...) must be a finite number >= 0, got -1.0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            packed_trainer(tmp_path, 0, feats, **options)
    import padless

    prepacked = padless.pack_dataset(support.dataset(feats), MAX_LENGTH)  # its rows are dealt whole: no documents seen
    with pytest.raises(
        ValueError,
        match=re.escape(
            "PackedTrainer(balance='cost') prices a row by its documents, and "
            "rows packed beforehand (seq_lengths) are dealt as one length each"
        ),
    ):
        packed_trainer(tmp_path, 0, prepacked, balance="cost")


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_sft_trainer_refuses_bad_balance_arguments_naming_its_own(tmp_path):
    pytest.importorskip("trl")
    support.offline_hub()
    from trl import SFTConfig

    from padless.integrations.trl import SFTTrainer

    feats = long_tail(20)
    with pytest.raises(ValueError, match=re.escape("unknown SFTTrainer(balance='flops'); choose one of tokens, cost")):
        sft_trainer(tmp_path, 0, feats, balance="flops")
    padded = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False, max_length=MAX_LENGTH)
    with pytest.raises(
        ValueError,
        match=re.escape("SFTTrainer(balance='cost') deals packed rows to the ranks; it needs SFTConfig(packing=True)"),
    ):
        SFTTrainer(
            model=support.model("sdpa", "tiny-llama"),
            args=padded,
            train_dataset=support.dataset(feats),
            processing_class=support.tokenizer(),
            balance="cost",
        )
    line = sft_trainer(tmp_path, 0, feats, balance="cost").start_line()
    assert ", 128-token rows, ranks balanced by cost a*l + l**2 (a=768), " in line, line
