"""Distributed packed sampling: identical plans on every rank, exact cover, equal steps, token balance,
and a 2-process gloo run showing that the token-normalised loss makes 2 ranks x B == 1 rank x 2B."""

from __future__ import annotations

import os
import socket
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_features
from padless.batching.collate import PackingCollator
from padless.batching.rows import PackedRowView
from padless.batching.samplers import DistributedPackedBatchSampler, world_info
from padless.layout import IGNORE_INDEX
from padless.planning.schedule import EMPTY_ROW, REMAINDERS, schedule_epoch

# ----------------------------------------------------------------------------- literal cases

# lengths 5 3 6 2 7 1 into rows of 8 (best fit decreasing, no shuffle):
#   row 0: seq 4 (7) + seq 5 (1)    row 1: seq 2 (6) + seq 3 (2)    row 2: seq 0 (5) + seq 1 (3)
LENGTHS = [5, 3, 6, 2, 7, 1]
ROW0, ROW1, ROW2 = ((4, 0, 7), (5, 0, 1)), ((2, 0, 6), (3, 0, 2)), ((0, 0, 5), (1, 0, 3))


def _batches(remainder, rank):
    return list(
        DistributedPackedBatchSampler(LENGTHS, 8, 1, num_replicas=2, rank=rank, shuffle=False, remainder=remainder)
    )


def test_literal_schedule_for_each_remainder():
    # 3 rows, 2 ranks x 1 row per step: one full step and one row left over.
    assert _batches("empty", 0) == [[ROW0], [ROW2]]
    assert _batches("empty", 1) == [[ROW1], [()]]  # an empty row: rank 1 still runs the step
    assert _batches("repeat", 0) == [[ROW0], [ROW2]]
    assert _batches("repeat", 1) == [[ROW1], [ROW0]]  # the first row of the epoch, trained again
    assert _batches("drop", 0) == [[ROW0]]
    assert _batches("drop", 1) == [[ROW1]]
    counts = {
        r: schedule_epoch(LENGTHS, 8, world_size=2, rows_per_batch=1, shuffle=False, remainder=r) for r in REMAINDERS
    }
    assert (counts["empty"].empty_rows, counts["repeat"].repeated_rows, counts["drop"].dropped_rows) == (1, 1, 1)
    assert (counts["repeat"].repeated_tokens, counts["drop"].dropped_tokens) == (8, 8)
    assert counts["empty"].tokens_per_rank.tolist() == [16, 8]
    assert counts["drop"].tokens_per_rank.tolist() == [8, 8]


def test_row_view_builds_prepacked_rows_and_empty_rows():
    feats = [{"input_ids": [10, 11, 12], "labels": [-100, 11, 12]}, {"input_ids": [20, 21, 22, 23]}]
    view = PackedRowView(feats, pad_token_id=7)
    row = view[((1, 1, 3), (0, 0, 3))]  # a piece of sequence 1 from offset 1, then sequence 0
    assert row["input_ids"].tolist() == [21, 22, 23, 10, 11, 12]
    assert row["labels"].tolist() == [21, 22, 23, -100, 11, 12]  # no labels: every token trained
    assert row["seq_lengths"].tolist() == [3, 3]
    empty = view[()]
    assert (empty["input_ids"].tolist(), empty["labels"].tolist(), empty["seq_lengths"].tolist()) == ([7], [-100], [1])
    assert len(view) == 2


def test_loader_trains_exactly_the_planned_rows():
    """DataLoader(PackedRowView, batch_sampler=sampler, collate_fn=PackingCollator): each batch holds the
    rank's planned rows, documents as planned (the collator does not re-plan them)."""
    from torch.utils.data import DataLoader

    lengths = [9, 30, 4, 17, 25, 3, 12, 8, 21, 6, 14, 2]
    feats = make_features(lengths, with_labels=True, seed=3)
    collator = PackingCollator(model_free=True, max_length=32, attention="varlen", pad_token_id=0)
    for rank in range(2):
        sampler = DistributedPackedBatchSampler(lengths, 32, 2, num_replicas=2, rank=rank, seed=5)
        loader = DataLoader(PackedRowView(feats), batch_sampler=sampler, collate_fn=collator)
        batches = list(loader)
        assert len(batches) == len(sampler)
        for keys, batch in zip(sampler, batches):
            assert batch["input_ids"].shape[0] == len(keys)
            for r, key in enumerate(keys):
                docs = [n for _, _, n in key] or [1]
                ids = np.concatenate([feats[i]["input_ids"][s : s + n] for i, s, n in key]) if key else [0]
                used = sum(docs)
                assert batch["input_ids"][r, :used].tolist() == list(ids)
                # positions restart at each planned document: the row holds exactly these documents
                expected_pos = np.concatenate([np.arange(n) for n in docs])
                assert batch["position_ids"][r, :used].tolist() == expected_pos.tolist()
                starts = np.cumsum([0, *docs[:-1]])
                assert (batch["labels"][r, starts] == IGNORE_INDEX).all()


def test_a_micro_batch_of_empty_rows_trains_nothing():
    """What a rank left without a row in the last step (remainder="empty") runs: a forward and backward
    with zero loss and zero gradients, so it joins DDP's all-reduce without changing the update."""
    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss

    model = build_model("tiny-gpt2", seed=0)
    view = PackedRowView([{"input_ids": [1, 2, 3]}], pad_token_id=5)
    batch = PackingCollator.for_model(model)([view[()]])
    assert batch["input_ids"].tolist() == [[5]] and batch["labels"].tolist() == [[IGNORE_INDEX]]
    loss = model_loss(model, batch, 10, world_size=2)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


# ----------------------------------------------------------------------------- properties


def _simulated_ranks(lengths, world, rows, **kwargs):
    """One sampler per rank, each built on its own as separate processes would."""
    return [
        DistributedPackedBatchSampler(lengths, 48, rows, num_replicas=world, rank=r, **kwargs) for r in range(world)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 80), min_size=1, max_size=120),
    st.integers(1, 4),
    st.integers(1, 3),
    st.sampled_from(REMAINDERS),
    st.integers(0, 3),
    st.integers(0, 3),
)
def test_every_rank_plans_alike_and_rows_cover_the_data(lengths, world, rows, remainder, seed, epoch):
    """Samplers built independently per rank agree on the plan; steps are equal; every row is trained
    once (empty), at least once (repeat) or at most once (drop), with the counts the schedule reports."""
    samplers = _simulated_ranks(lengths, world, rows, seed=seed, remainder=remainder, overlong="split")
    for s in samplers:
        s.set_epoch(epoch)
    try:
        scheds = [s.schedule() for s in samplers]
    except ValueError as err:  # "drop" with fewer rows than one step: refused, never an empty epoch
        assert remainder == "drop" and "leaves nothing" in str(err)
        return
    ref = scheds[0]
    ref.plan.check(lengths)
    for sched in scheds[1:]:
        assert sched.batches == ref.batches
        assert np.array_equal(sched.plan.index, ref.plan.index) and np.array_equal(sched.plan.start, ref.plan.start)
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1 == len({len(s) for s in samplers})
    assert all(1 <= len(batch) <= rows for batches in per_rank for batch in batches)
    trained = Counter(r for step in ref.batches for rank_rows in step for r in rank_rows if r != EMPTY_ROW)
    every = set(range(ref.plan.num_rows))
    if remainder == "empty":
        assert trained == Counter(every)
        assert sum(r == EMPTY_ROW for step in ref.batches for rr in step for r in rr) == ref.empty_rows < world
        # the pieces of the yielded keys are exactly the plan: each token of each sequence once
        pieces = sorted(p for batches in per_rank for batch in batches for key in batch for p in key)
        assert pieces == sorted(zip(ref.plan.index.tolist(), ref.plan.start.tolist(), ref.plan.length.tolist()))
    elif remainder == "repeat":
        assert set(trained) == every and sum(trained.values()) - len(every) == ref.repeated_rows < world * rows
        assert all(len(rr) == rows for step in ref.batches for rr in step)
    else:
        assert set(trained) <= every and max(trained.values()) == 1
        assert len(every - set(trained)) == ref.dropped_rows < world * rows
        assert ref.dropped_tokens == int(ref.plan.row_lengths[sorted(every - set(trained))].sum())
    assert int(ref.tokens_per_rank.sum()) == int(ref.plan.row_lengths.sum()) + ref.repeated_tokens - ref.dropped_tokens


def test_plans_are_deterministic_and_change_with_the_epoch_and_seed():
    lengths = np.random.default_rng(1).integers(5, 200, 600)

    def rows_of(**kw):
        sched = schedule_epoch(lengths, 512, world_size=2, rows_per_batch=2, **kw)
        return sched.batches, {frozenset(r.tolist()) for r in sched.plan.rows()}

    assert rows_of(epoch=0) == rows_of(epoch=0)
    batches0, rows0 = rows_of(epoch=0)
    batches1, rows1 = rows_of(epoch=1)
    assert batches0 != batches1
    assert len(rows0 & rows1) < 0.2 * len(rows0)  # most rows hold other sequences next epoch
    assert rows_of(epoch=0, seed=1)[1] != rows0
    sampler = DistributedPackedBatchSampler(lengths, 512, 2, num_replicas=2, rank=1)
    first = list(sampler)
    assert list(sampler) == first  # same epoch, same batches
    sampler.set_epoch(1)
    assert list(sampler) != first


def _balance(sched, rows):
    """(max/min tokens per rank over the epoch, worst max/min over the full steps)."""
    tokens = sched.plan.row_lengths
    full = [step for step in sched.batches if all(len(rr) == rows and EMPTY_ROW not in rr for rr in step)]
    step_ratio = max(max(t) / min(t) for t in ([int(tokens[rr].sum()) for rr in step] for step in full))
    epoch = sched.tokens_per_rank
    return epoch.max() / epoch.min(), step_ratio


@pytest.mark.parametrize("world,rows", [(2, 2), (4, 1), (8, 2)])
@pytest.mark.parametrize("source", ["lognormal", "dialogues"])
def test_tokens_are_balanced_across_ranks(source, world, rows):
    """Max/min tokens per rank within 3 % over the epoch and within every full step (rows of a step
    have similar sizes), on a synthetic long-tailed and a real corpus' lengths."""
    if source == "dialogues":
        from padless.data.load import load_corpus

        lengths, max_length = load_corpus("dialogues", "gpt2", train_on="assistant").lengths, 256
    else:
        from padless.planning.lengths import synthetic_lengths

        lengths, max_length = synthetic_lengths("lognormal", 20_000, seed=0), 2048
    sched = schedule_epoch(lengths, max_length, world_size=world, rows_per_batch=rows, overlong="truncate")
    epoch_ratio, step_ratio = _balance(sched, rows)
    assert epoch_ratio <= 1.03, epoch_ratio
    assert step_ratio <= 1.03, step_ratio


# ----------------------------------------------------------------------------- rank discovery, bad input


def test_world_info_reads_torchrun_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_info() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert world_info() == (2, 3)
    sampler = DistributedPackedBatchSampler([3, 4, 5], 8, 1)
    assert (sampler.rank, sampler.num_replicas) == (2, 3)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="RANK=3, WORLD_SIZE=3"):
        world_info()
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        world_info()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"rows_per_batch": 0}, "rows_per_batch must be"),
        ({"remainder": "pad"}, "unknown remainder 'pad'"),
        ({"strategy": "greedy"}, "unknown strategy"),
        ({"num_replicas": 2, "rank": 2}, r"rank must be in \[0, num_replicas=2\)"),
        ({"max_length": 0}, "max_length must be"),
    ],
)
def test_sampler_bad_input(kwargs, match):
    args = {"lengths": [3, 4, 5], "max_length": 8, "rows_per_batch": 1, "num_replicas": 1, "rank": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        DistributedPackedBatchSampler(**args)


def test_drop_with_too_few_rows_and_mismatched_view_are_refused():
    with pytest.raises(ValueError, match="remainder='drop' leaves nothing"):
        schedule_epoch([3, 4], 8, world_size=2, rows_per_batch=1, remainder="drop")
    with pytest.raises(ValueError, match="sequence 8 has length 9, longer than max_length 8"):
        schedule_epoch([1] * 7 + [9] + [1] * 50, 8, world_size=1, rows_per_batch=1, seed=3)  # index before shuffle
    with pytest.raises(ValueError, match="every sequence was dropped"):
        schedule_epoch([30], 8, world_size=1, rows_per_batch=1, overlong="drop")
    view = PackedRowView([{"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match="sequence 0 has 2 tokens"):
        view[((0, 0, 3),)]
    with pytest.raises(ValueError, match="row key"):
        view[0]


# ----------------------------------------------------------------------------- 2 processes, gloo

DDP_LENGTHS = [37, 12, 50, 8, 23, 41, 5, 30, 17, 44, 9, 26, 14, 33, 6, 20]
DDP_MAX_LENGTH, DDP_ROWS, DDP_SEED = 64, 2, 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _ddp_worker(rank, world_size, port, out_dir):
    """One rank: its planned rows through DataLoader + collator; the token-normalised DDP gradient and
    the naive per-rank-mean DDP gradient, saved for the parent to compare."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss, step_num_items, trained_tokens

    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on the loopback interface
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        model = build_model("tiny-gpt2", seed=0)
        ddp = DistributedDataParallel(model)
        feats = make_features(DDP_LENGTHS, with_labels=True, seed=DDP_SEED)
        sampler = DistributedPackedBatchSampler(DDP_LENGTHS, DDP_MAX_LENGTH, DDP_ROWS, seed=DDP_SEED)  # rank from dist
        loader = DataLoader(
            PackedRowView(feats),
            batch_sampler=sampler,
            collate_fn=PackingCollator.for_model(model, max_length=DDP_MAX_LENGTH),
        )
        batch = next(iter(loader))
        num_items = step_num_items([batch])  # all-reduced over both ranks
        model_loss(ddp, batch, num_items, world_size=world_size).backward()
        exact = _grads(model)
        model.zero_grad(set_to_none=True)
        local = trained_tokens(batch["labels"])
        model_loss(ddp, batch, local).backward()  # naive: each rank's own mean, then DDP averages
        torch.save(
            {
                "rank": sampler.rank,
                "world": sampler.num_replicas,
                "keys": next(iter(sampler)),
                "num_items": int(num_items),
                "local": int(local),
                "exact": exact,
                "naive": _grads(model),
            },
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_one_rank_with_twice_the_batch(tmp_path):
    import torch
    import torch.multiprocessing as mp

    from padless.models.factory import build_model
    from padless.objectives.loss import model_loss, trained_tokens

    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    # Reference: one process, one micro-batch holding both ranks' planned rows (2 x B rows).
    sched = schedule_epoch(DDP_LENGTHS, DDP_MAX_LENGTH, world_size=2, rows_per_batch=DDP_ROWS, seed=DDP_SEED)
    keys = [sched.rank_batches(r)[0] for r in range(2)]
    assert [(d["rank"], d["world"], d["keys"]) for d in ranks] == [(0, 2, keys[0]), (1, 2, keys[1])]
    model = build_model("tiny-gpt2", seed=0)
    feats = make_features(DDP_LENGTHS, with_labels=True, seed=DDP_SEED)
    collator = PackingCollator.for_model(model, max_length=DDP_MAX_LENGTH)
    batch = collator([PackedRowView(feats)[k] for k in keys[0] + keys[1]])
    total = trained_tokens(batch["labels"])
    model_loss(model, batch, total).backward()
    ref = _grads(model)

    local = [d["local"] for d in ranks]
    assert ranks[0]["num_items"] == ranks[1]["num_items"] == int(total) == sum(local)
    assert local[0] != local[1]  # the ranks hold different trained-token counts
    scale = max(g.abs().max().item() for g in ref.values())
    for name, g in ref.items():
        for d in ranks:  # DDP leaves the same averaged gradient on both ranks
            torch.testing.assert_close(d["exact"][name], g, rtol=1e-5, atol=1e-6 * scale, msg=name)
    naive_gap = max((ranks[0]["naive"][n] - g).abs().max().item() for n, g in ref.items())
    assert naive_gap > 1e-2 * scale, naive_gap  # a per-rank mean weights tokens by their rank's count
