"""Streaming packing: the buffered planner on lengths, the token stream, exact resume, workers."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import row_documents
from padless.batching import stream as stream_mod
from padless.batching.collate import PackingCollator
from padless.batching.stream import PackedStream
from padless.planning.buffered import StreamOptions, StreamPlanner, compare_stream_to_offline, stream_plan


def rows_of(plan):
    return [plan.row(r)[0].tolist() for r in range(plan.num_rows)]


def indexed_features(lengths, with_labels=True):
    """Sequence i holds the token id i everywhere (so a document names its source); labels count up."""
    feats = []
    for i, n in enumerate(lengths):
        f = {"input_ids": np.full(int(n), i, dtype=np.int64)}
        if with_labels:
            f["labels"] = np.arange(int(n)) + (1000 if i % 3 == 0 else 0)  # labels differ from the ids
        feats.append(f)
    return feats


def documents(rows):
    """Every document of every row as (source index, length), in yield order."""
    for row in rows:
        assert int(row["seq_lengths"].sum()) == row["input_ids"].size == row["labels"].size
    out = []
    for doc in row_documents(rows):
        assert (doc == doc[0]).all()  # a document never mixes sequences
        out.append((int(doc[0]), int(doc.size)))
    return out


# --- the buffered planner (lengths only) -------------------------------------------------------------


def test_planner_literal_full_rows():
    # one round of 4: best fit pairs 6+2 and 5+3, both full
    plan = stream_plan([5, 3, 6, 2], 8, buffer_size=4)
    assert sorted(map(sorted, rows_of(plan))) == [[0, 1], [2, 3]]
    assert plan.stats.efficiency == 1.0


def test_planner_literal_carry_over_and_room():
    # buffer of 2, only full rows leave: [5, 6] -> rows (6) and (5), neither full, but the buffer must
    # keep at most 1, so the fullest, (6), leaves; 5 waits for 3; 2 is flushed at the end
    plan = stream_plan([5, 6, 3, 2], 8, buffer_size=2, min_fill=1.0, max_delay=100)
    assert rows_of(plan) == [[1], [0, 2], [3]]


def test_planner_aged_piece_swaps_into_a_leaving_row():
    # sequence 0 (1 token) always lands in the plan's tail row (4 + 1); by position 6 it is older than
    # max_delay / 2 = 4, so it swaps with the youngest 4 of the leaving full row (4, 4): it leaves now
    plan = stream_plan([1, 4, 4, 4, 4, 4], 8, buffer_size=4, min_fill=1.0, max_delay=8)
    assert list(map(sorted, rows_of(plan))) == [[1, 2], [0, 3], [4, 5]]
    plan = stream_plan([1, 4, 4, 4, 4, 4], 8, buffer_size=4, min_fill=1.0, max_delay=100)
    assert list(map(sorted, rows_of(plan))) == [[1, 2], [3, 4], [0, 5]]  # without aging it waits to the end


@pytest.mark.parametrize("max_delay", [4, 1000])
def test_planner_max_delay_forces_old_rows_out(max_delay):
    # sequence 0 (7 of 8 tokens) never finds a partner of 1; the 4s pair into full rows, so the buffer
    # never has to make room: only max_delay sends it out before the end
    planner = StreamPlanner(StreamOptions(8, buffer_size=4, min_fill=1.0, max_delay=max_delay))
    left_at = None
    for n in [7] + [4] * 12:
        planner.add(n)
        while planner.pending:
            row = planner.pop()
            assert all(pos >= planner.consumed - max_delay - 4 for pos, _, _ in row)
            if row == ((0, 0, 7),):
                left_at = planner.consumed
    if max_delay == 4:
        assert left_at is not None and left_at <= 0 + max_delay + 4
    else:
        assert left_at is None  # still waiting: only the final flush would emit it
        planner.finish()
        assert ((0, 0, 7),) in list(planner.pending)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=0, max_size=300),
    max_length=st.integers(1, 40),
    buffer_size=st.integers(1, 50),
    overlong=st.sampled_from(["truncate", "split", "drop"]),
    min_fill=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_planner_places_every_token_once(lengths, max_length, buffer_size, overlong, min_fill):
    plan = stream_plan(lengths, max_length, buffer_size=buffer_size, overlong=overlong, min_fill=min_fill)
    plan.check(lengths)  # rows fit, every kept token once, truncated / dropped accounted
    s = plan.stats
    assert s.num_rows >= s.lower_bound
    long = [n for n in lengths if n > max_length]
    assert s.truncated_sequences == (len(long) if overlong == "truncate" else 0)
    assert s.dropped_tokens == (sum(long) if overlong == "drop" else 0)


def test_planner_overlong_error_names_the_sequence():
    with pytest.raises(ValueError, match="sequence 3 has length 9, longer than max_length 8"):
        stream_plan([3, 4, 9], 8)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_length": 0}, "max_length"),
        ({"max_length": 8, "buffer_size": 0}, "buffer_size"),
        ({"max_length": 8, "overlong": "wrap"}, "overlong"),
        ({"max_length": 8, "min_fill": 1.5}, "min_fill"),
        ({"max_length": 8, "buffer_size": 10, "max_delay": 5}, "max_delay"),
    ],
)
def test_options_validation(options, match):
    with pytest.raises(ValueError, match=match):
        StreamOptions(**options)


@pytest.mark.parametrize(("max_length", "median"), [(512, 48), (2048, 200)])
def test_efficiency_within_one_point_of_offline(max_length, median):
    lengths = np.random.default_rng(0).lognormal(np.log(median), 0.9, 40_000).round().clip(1, max_length)
    c = compare_stream_to_offline(lengths.astype(np.int64), max_length, buffer_size=2048)
    assert c.offline.num_sequences == c.stream.num_sequences == 40_000
    assert c.stream.real_tokens == c.offline.real_tokens
    assert c.efficiency_gap < 0.01, (c.stream.efficiency, c.offline.efficiency)


# --- the token stream --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlong", ["truncate", "split", "drop"])
def test_stream_rows_follow_the_plan_and_hold_the_tokens(overlong):
    lengths = np.random.default_rng(1).integers(1, 70, 500)
    lengths[::37] = 130
    feats = indexed_features(lengths)
    rows = list(PackedStream(feats, 64, buffer_size=40, overlong=overlong))
    plan = stream_plan(lengths, 64, buffer_size=40, overlong=overlong)
    assert [r["seq_lengths"].tolist() for r in rows] == [plan.row(r)[2].tolist() for r in range(plan.num_rows)]
    starts = {}
    for row, r in zip(rows, range(plan.num_rows)):
        index, start, length = plan.row(r)
        at = 0
        for i, s, n in zip(index.tolist(), start.tolist(), length.tolist()):
            assert (row["input_ids"][at : at + n] == i).all()
            np.testing.assert_array_equal(row["labels"][at : at + n], feats[i]["labels"][s : s + n])
            starts[i] = starts.get(i, 0) + n
            at += n
        assert row["input_ids"].dtype == np.int64 and at <= 64
    kept = {
        i: (min(n, 64) if overlong == "truncate" else n) for i, n in enumerate(lengths) if overlong != "drop" or n <= 64
    }
    assert starts == kept


def test_rows_go_through_the_collator_without_replanning():
    rows = list(PackedStream(indexed_features([5, 3, 6, 2, 4], with_labels=False), 8, buffer_size=5))
    batch = PackingCollator(model_free=True, max_length=8, pad_token_id=99)(rows)
    for r, row in enumerate(rows):
        n = row["input_ids"].size
        assert batch["input_ids"][r, :n].tolist() == row["input_ids"].tolist()
        starts = np.cumsum([0, *row["seq_lengths"].tolist()[:-1]])
        assert (batch["labels"][r, starts] == -100).all()  # each document's first label is masked
        assert batch["position_ids"][r, :n].tolist() == [p for k in row["seq_lengths"].tolist() for p in range(k)]


@pytest.mark.parametrize(
    ("example", "match"),
    [
        ({"text": "hi"}, "example 1 has no 'input_ids'"),
        ({"input_ids": []}, "example 1 is an empty sequence"),
        ({"input_ids": [1, 2], "labels": [1]}, "labels has 1 tokens but input_ids has 2"),
        ({"input_ids": [[1, 2]]}, "1-D"),
        ({"input_ids": [-3, 2]}, "outside the vocabulary"),
        ({"input_ids": [1, 2], "labels": [-5, 2]}, r"label -5 \(labels\[0\]\) is neither -100"),
        ([1, 2], "a list"),
    ],
)
def test_bad_examples_raise(example, match):
    with pytest.raises(ValueError, match=match):
        list(PackedStream([{"input_ids": [1]}, example], 8))


# --- exact resume ------------------------------------------------------------------------------------


class Reiterable:
    """A plain re-iterable source: no len, no state (resume iterates again and skips)."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def make_source(kind, feats):
    if kind == "list":
        return feats
    if kind == "iterable":
        return Reiterable(feats)
    from datasets import Dataset

    ds = Dataset.from_dict(
        {"input_ids": [f["input_ids"].tolist() for f in feats], "labels": [f["labels"].tolist() for f in feats]}
    )
    return ds if kind == "hf-map" else ds.to_iterable_dataset(num_shards=3)


@pytest.mark.parametrize("kind", ["list", "iterable", "hf-map", "hf-streaming"])
@pytest.mark.parametrize("overlong", ["split", "truncate"])
def test_resume_continues_with_exactly_the_same_rows(kind, overlong):
    lengths = np.random.default_rng(2).integers(1, 50, 400)
    lengths[::41] = 90
    feats = indexed_features(lengths)
    opts = {"buffer_size": 24, "overlong": overlong, "max_delay": 48}
    full = list(PackedStream(make_source(kind, feats), 40, **opts))
    for stop in (0, 1, 17, len(full) // 2, len(full) - 1, len(full)):
        first = PackedStream(make_source(kind, feats), 40, **opts)  # a fresh source, as after a restart
        it = iter(first)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(first.state_dict()))  # JSON-serialisable
        resumed = PackedStream(make_source(kind, feats), 40, **opts)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # before iterating, the loaded state is what it reports
        tail = list(resumed)
        assert len(head) + len(tail) == len(full)
        for a, b in zip(head + tail, full):
            for key in ("input_ids", "labels", "seq_lengths"):
                np.testing.assert_array_equal(a[key], b[key])
        assert resumed.counts.tokens_in == int(lengths.sum())


def test_state_holds_positions_not_tokens():
    feats = indexed_features(np.full(300, 900))
    s = PackedStream(feats, 1000, buffer_size=64)
    it = iter(s)
    next(it)
    text = json.dumps(s.state_dict())
    assert len(s.state_dict()["planner"]["buffer"][0]) > 0  # something is buffered
    assert len(text) < 4000  # the buffered tokens alone would be > 50,000 numbers


def test_resume_refuses_other_options_and_one_shot_iterators():
    feats = indexed_features([3] * 20)
    s = PackedStream(feats, 8, buffer_size=4)
    it = iter(s)
    next(it)
    state = s.state_dict()
    with pytest.raises(ValueError, match="buffer_size=4; this stream has buffer_size=5"):
        PackedStream(feats, 8, buffer_size=5).load_state_dict(state)
    gen = PackedStream((f for f in feats), 8, buffer_size=4)
    it = iter(gen)
    next(it)
    again = PackedStream((f for f in feats), 8, buffer_size=4)
    again.load_state_dict(gen.state_dict())
    with pytest.raises(ValueError, match="one-shot iterator"):
        list(again)


# --- workers -----------------------------------------------------------------------------------------


def test_worker_packs_its_own_shard_and_state_names_it(monkeypatch):
    feats = indexed_features(np.random.default_rng(3).integers(1, 30, 90))
    monkeypatch.setattr(stream_mod, "_worker", lambda: (1, 3))
    for source in (feats, Reiterable(feats)):
        s = PackedStream(source, 32, buffer_size=8)
        docs = documents(list(s))
        assert sorted(i for i, _ in docs) == list(range(1, 90, 3))  # items 1, 4, 7, ... each once
    it = iter(s)
    next(it)
    state = s.state_dict()
    assert state["worker"] == [1, 3]
    monkeypatch.setattr(stream_mod, "_worker", lambda: (0, 3))
    other = PackedStream(Reiterable(feats), 32, buffer_size=8)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved by worker 1 of 3; this is worker 0 of 3"):
        list(other)


@pytest.mark.parametrize("kind", ["list", "hf-streaming"])
def test_dataloader_workers_pack_disjoint_shards(kind):
    from torch.utils.data import DataLoader

    lengths = np.random.default_rng(4).integers(1, 30, 200)
    feats = indexed_features(lengths)
    # two file shards, sequences 0-99 and 100-199: one per worker
    source = feats if kind == "list" else make_source("hf-map", feats).to_iterable_dataset(num_shards=2)
    ds = stream_mod.PackedIterableDataset(source, 32, buffer_size=16)
    rows = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda r: r))
    docs = documents(rows)
    assert sorted(i for i, _ in docs) == list(range(200))  # every sequence exactly once
    # a list is split by index (worker w packs items w, w + 2, ...), a datasets.IterableDataset by its
    # file shards: either way a row never mixes the two workers' items
    shard = (lambda i: i % 2) if kind == "list" else (lambda i: i // 100)
    for row in rows:
        assert len({shard(int(x)) for x in row["input_ids"].tolist()}) == 1


def test_stream_and_pack_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from padless.batching.stream import PackedStream; import padless.export.parquet; "
        "rows = list(PackedStream([{'input_ids': [1, 2]}, {'input_ids': [3]}], 4)); "
        "print(len(rows), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False"]


@pytest.mark.parametrize("overlong", ["truncate", "split", "drop"])
def test_running_counts_give_the_plan_statistics(overlong):
    """StreamCounts.plan_stats (running totals, what `padless pack` reports) equals the statistics of
    the rows as a PackPlan: one formula (PlanStats.of_rows) fed two ways."""
    lengths = np.random.default_rng(0).integers(1, 40, 500)
    plan = stream_plan(lengths, 32, buffer_size=64, overlong=overlong)
    planner = StreamPlanner(StreamOptions(32, buffer_size=64, overlong=overlong))
    for n in lengths.tolist():
        planner.add(n)
        while planner.pending:
            planner.pop()
    planner.finish()
    while planner.pending:
        planner.pop()
    assert plan.stats.num_rows > 0 and plan.stats.max_per_row > 1
    assert planner.counts.plan_stats(32) == plan.stats
