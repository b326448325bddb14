"""``padless.pack_dataset``: TRL's arguments and output, padless' plan over the whole dataset, every token
of every column exactly once, nothing cut or dropped without being asked and counted."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

datasets = pytest.importorskip("datasets")

import padless  # noqa: E402
from padless.integrations.datasets import plan_dataset, plan_lengths, sequence_lengths  # noqa: E402

TRL_EXAMPLE = {"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
               "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]]}  # fmt: skip


def _dataset(rows, with_doc=True):
    """A dataset whose token values say where they came from: token = 1000 * row + position."""
    ids = [[1000 * i + t for t in range(n)] for i, n in enumerate(rows)]
    cols = {"input_ids": ids, "labels": [[-x for x in r] for r in ids]}
    if with_doc:
        cols["doc"] = [[i] * n for i, n in enumerate(rows)]
    return datasets.Dataset.from_dict(cols)


def _pieces(packed):
    """Every (row, document) piece: (source row, start, tokens) read back from the token values."""
    out = []
    for row in packed.to_list() if isinstance(packed, datasets.Dataset) else list(packed):  # a stream: its rows
        offset = 0
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["labels"]) == len(row["doc"])
        for n in row["seq_lengths"]:
            ids = row["input_ids"][offset : offset + n]
            src, start = divmod(ids[0], 1000)
            assert ids == [1000 * src + start + t for t in range(n)]  # a contiguous slice of one sequence
            assert row["labels"][offset : offset + n] == [-x for x in ids]  # every column moved alike
            assert row["doc"][offset : offset + n] == [src] * n
            out.append((src, start, n))
            offset += n
    return out


def test_trl_docstring_example_gives_trl_rows():
    ds = datasets.Dataset.from_dict(TRL_EXAMPLE)
    assert padless.pack_dataset(ds, 4, overlong="truncate")[:] == {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]],
        "attention_mask": [[1, 1, 1, 0], [1, 1, 0, 1], [1, 0]],
        "seq_lengths": [[4], [3, 1], [2]],
    }
    assert padless.pack_dataset(ds, 4, "bfd_split")[:] == {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 5], [6, 7, 11]],
        "attention_mask": [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1]],
        "seq_lengths": [[4], [3, 1], [2, 1]],
    }
    # wrapped cuts at row ends but keeps each piece a document (TRL's wrapped rows have no seq_lengths)
    assert padless.pack_dataset(ds, 4, "wrapped")[:]["seq_lengths"] == [[4], [1, 2, 1], [2, 1]]


def test_an_overlong_sequence_is_refused_unless_a_policy_is_chosen(caplog):
    ds = datasets.Dataset.from_dict(TRL_EXAMPLE)
    with pytest.raises(ValueError, match=r"longer than seq_length=4: 1 .*silently cut 1 .*overlong='truncate'"):
        padless.pack_dataset(ds, 4)
    with caplog.at_level(logging.WARNING, logger="padless.integrations.datasets"):
        padless.pack_dataset(ds, 4, overlong="truncate")
    assert "truncated 1 (1 tokens lost)" in caplog.text
    stats = plan_dataset(ds, 4, overlong="drop").stats
    assert (stats.dropped_sequences, stats.dropped_tokens, stats.real_tokens) == (1, 5, 6)


@given(
    rows=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    seq_length=st.integers(1, 24),
    strategy=st.sampled_from(["bfd", "bfd_split", "wrapped", "best_fit_decreasing", "next_fit"]),
    overlong=st.sampled_from([None, "truncate", "split", "drop"]),
    batch_size=st.sampled_from([None, 7]),
)
def test_every_token_lands_once(rows, seq_length, strategy, overlong, batch_size):
    implied = {"bfd_split": "split", "wrapped": "split"}.get(strategy)
    policy = overlong or implied or "error"
    if implied and overlong not in (None, implied):
        return  # refused, tested below
    if policy == "error" and max(rows) > seq_length:
        with pytest.raises(ValueError, match="longer than seq_length"):
            padless.pack_dataset(_dataset(rows), seq_length, strategy, overlong=overlong)
        return
    ds = _dataset(rows)
    packed = padless.pack_dataset(ds, seq_length, strategy, {"batch_size": batch_size}, overlong=overlong)
    plan = plan_dataset(ds, seq_length, strategy, {"batch_size": batch_size}, overlong=overlong)
    assert packed.num_rows == plan.num_rows
    assert all(len(r) <= seq_length for r in packed["input_ids"])
    placed = {}
    for src, start, n in _pieces(packed):
        placed.setdefault(src, []).append((start, n))
    kept = {i: n for i, n in enumerate(rows) if n > 0}
    for i, n in kept.items():
        if policy == "drop" and n > seq_length:
            assert i not in placed
            continue
        expected = min(n, seq_length) if policy == "truncate" else n
        spans = sorted(placed.pop(i))
        assert spans[0][0] == 0 and sum(k for _, k in spans) == expected
        assert all(a + k == b for (a, k), (b, _) in zip(spans, spans[1:]))  # pieces tile the sequence
    assert not placed  # nothing placed twice, no empty sequence placed
    lost = sum(max(0, n - seq_length) for n in rows) if policy == "truncate" else 0
    assert plan.stats.truncated_tokens == lost
    # the same dataset streamed: by batches, the same rows; through the buffer, the same pieces
    stream = ds.to_iterable_dataset()
    if batch_size is not None or strategy == "wrapped":
        assert (
            list(padless.pack_dataset(stream, seq_length, strategy, {"batch_size": batch_size}, overlong=overlong))
            == packed.to_list()
        )
    elif strategy in ("bfd", "bfd_split"):
        streamed = padless.pack_dataset(stream, seq_length, strategy, overlong=overlong, buffer_size=5)
        assert sorted(_pieces(streamed)) == sorted(_pieces(packed))


@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=60), seq_length=st.integers(40, 64))
def test_whole_dataset_bfd_makes_as_many_rows_as_trl_bfd_without_batches(rows, seq_length):
    """Best fit decreasing is one algorithm: tie-breaking changes which row, never the remaining spaces, so
    padless and TRL (planning the whole dataset, batch_size=None) end with the same row lengths."""
    trl = pytest.importorskip("trl")
    ds = _dataset(rows, with_doc=False)
    ours = padless.pack_dataset(ds, seq_length)
    theirs = trl.pack_dataset(ds, seq_length, map_kwargs={"batch_size": None})
    assert sorted(map(sum, ours["seq_lengths"])) == sorted(map(sum, theirs["seq_lengths"]))


def test_planning_the_whole_dataset_beats_trls_default_batches():
    """TRL packs inside map batches of 1,000 rows: every batch leaves its own part-filled rows."""
    trl = pytest.importorskip("trl")
    lengths = np.random.default_rng(0).integers(10, 501, 3000)
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    ours, theirs = padless.pack_dataset(ds, 2048), trl.pack_dataset(ds, 2048)
    bound = -(-int(lengths.sum()) // 2048)
    assert bound <= ours.num_rows < theirs.num_rows
    assert ours.num_rows == plan_lengths(lengths, 2048).stats.num_rows


def test_dataset_dict_format_and_column_selection_are_kept():
    ds = _dataset([3, 5, 2, 7]).shuffle(seed=1).with_format("torch", columns=["input_ids", "labels"])
    packed = padless.pack_dataset(datasets.DatasetDict(train=ds, test=ds.select([0, 1])), 8)
    assert set(packed) == {"train", "test"}
    row = packed["train"][0]
    assert set(row) == {"input_ids", "labels", "seq_lengths"}  # the selection plus seq_lengths
    assert row["input_ids"].dtype.is_floating_point is False and int(row["seq_lengths"].sum()) == len(row["input_ids"])
    assert packed["test"].num_rows == 1
    assert packed["train"].features["seq_lengths"] == datasets.List(datasets.Value("int32"))


def test_large_list_columns_stay_large_lists():
    import pyarrow as pa

    table = pa.table({"input_ids": pa.array([[1, 2], [3], [4, 5, 6]], type=pa.large_list(pa.int64()))})
    ds = datasets.Dataset(datasets.table.InMemoryTable(table))
    packed = padless.pack_dataset(ds, 4)
    assert pa.types.is_large_list(packed.data.schema.field("input_ids").type)
    assert sorted(sum(packed["input_ids"], [])) == [1, 2, 3, 4, 5, 6]


def test_an_empty_sequence_is_refused_naming_its_row():
    ds = _dataset([3, 2, 4, 0, 5, 0]).select([0, 1, 3, 2, 5])  # row 2 of this dataset is the first empty one
    for call in (padless.pack_dataset, plan_dataset):
        with pytest.raises(
            ValueError,
            match=r"row 2 of the dataset is an empty sequence \('input_ids' has no tokens\) "
            r"\(and 1 more\)",
        ):
            call(ds, 8)
    assert padless.pack_dataset(ds.select([0, 1, 3]), 8).num_rows == 2


def test_sequence_lengths_reads_arrow_offsets_and_lists():
    ds = _dataset([3, 0, 5]).select([2, 0, 1])
    assert sequence_lengths(ds).tolist() == [5, 3, 0]
    assert sequence_lengths([{"input_ids": [1, 2]}, {"input_ids": [3]}]).tolist() == [2, 1]


@pytest.mark.parametrize(
    ("make", "kwargs", "match"),
    [
        (lambda: datasets.Dataset.from_dict({"input_ids": [[1]], "text": ["a"]}), {}, "column 'text' is string"),
        (lambda: datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1]]}), {}, "column 'labels' has 1"),
        (lambda: datasets.Dataset.from_dict({"input_ids": [[1]], "seq_lengths": [[1]]}), {}, "packed already"),
        (lambda: _dataset([2]), {"strategy": "bfd_split", "overlong": "drop"}, "cannot be combined"),
        (lambda: _dataset([2]), {"strategy": "best"}, "unknown strategy 'best'"),
        (lambda: _dataset([2]), {"overlong": "cut"}, "unknown overlong policy 'cut'"),
        (lambda: _dataset([2]), {"map_kwargs": {"num_proc": 4}}, r"num_proc'\]=4"),
        (lambda: _dataset([2]), {"map_kwargs": {"batched": True}}, r"\['batched'\] are not supported"),
        (lambda: _dataset([2]), {"map_kwargs": {"batch_size": 0}}, "batch_size'] must be a positive"),
        (lambda: _dataset([2]).to_iterable_dataset(), {"strategy": "next_fit"}, "IterableDataset pass map_kwargs"),
        (lambda: [{"input_ids": [1]}], {}, "must be a datasets.Dataset"),
        (lambda: _dataset([2]), {"seq_length": 0}, "seq_length must be a positive integer"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(make, kwargs, match):
    kwargs = {"seq_length": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        padless.pack_dataset(make(), **kwargs)


def test_the_fingerprint_follows_the_input_and_the_arguments():
    ds = _dataset([3, 5, 2, 7])
    fingerprint = padless.pack_dataset(ds, 8)._fingerprint
    assert padless.pack_dataset(ds, 8)._fingerprint == fingerprint
    assert padless.pack_dataset(ds, 9)._fingerprint != fingerprint
    assert padless.pack_dataset(ds, 8, "wrapped")._fingerprint != fingerprint
    assert padless.pack_dataset(ds.select([0, 1, 2]), 8)._fingerprint != fingerprint


ROWS = [5, 12, 3, 9, 1, 16, 7, 7, 2, 11, 4, 8, 13, 6, 3]


@pytest.mark.parametrize(("strategy", "overlong"), [("bfd", "truncate"), ("bfd_split", None), ("wrapped", None),
                                                    ("next_fit", "drop"), ("bfd", "split")])  # fmt: skip
def test_an_iterable_dataset_planned_by_batches_gives_the_datasets_rows(strategy, overlong):
    """With ``map_kwargs={"batch_size": N}`` a stream is planned as a Dataset with the same batch_size:
    the very same rows, in the same order, every column alike."""
    ds = _dataset(ROWS)
    kwargs = dict(map_kwargs={"batch_size": 4}, overlong=overlong)
    want = padless.pack_dataset(ds, 10, strategy, **kwargs)
    got = padless.pack_dataset(ds.to_iterable_dataset(), 10, strategy, **kwargs)
    assert isinstance(got, datasets.IterableDataset)
    assert list(got) == want.to_list()
    assert got.column_names == want.column_names == ["input_ids", "labels", "doc", "seq_lengths"]
    assert got.features == want.features


def test_an_iterable_dataset_streams_through_a_bounded_buffer():
    """Without a batch_size the streaming planner packs it: the same documents as the Dataset's rows
    (every token once), grouped within the buffer's reach; a buffer holding the whole stream makes
    rows of the same lengths as the offline plan; wrapped streams the offline rows exactly."""
    ds, it = _dataset(ROWS), _dataset(ROWS).to_iterable_dataset()
    offline = padless.pack_dataset(ds, 16, "bfd_split")
    for buffer_size in (3, 64):
        streamed = padless.pack_dataset(it, 16, "bfd_split", buffer_size=buffer_size)
        rows = list(streamed)
        assert sorted(_pieces(rows)) == sorted(_pieces(offline))  # every piece once, every column alike
        assert all(len(r["input_ids"]) <= 16 for r in rows)
        if buffer_size >= len(ROWS):
            assert sorted(map(sum, (r["seq_lengths"] for r in rows))) == sorted(map(sum, offline["seq_lengths"]))
    assert list(padless.pack_dataset(it, 16, "wrapped")) == padless.pack_dataset(ds, 16, "wrapped").to_list()


def test_a_stream_counts_what_it_cuts_and_refuses_what_it_must(caplog):
    it = _dataset(ROWS).to_iterable_dataset()
    with caplog.at_level(logging.INFO, logger="padless.integrations.datasets"):
        rows = list(padless.pack_dataset(it, 10, overlong="truncate", buffer_size=4))
    lost = sum(n - 10 for n in ROWS if n > 10)
    assert sum(map(sum, (r["seq_lengths"] for r in rows))) + lost == sum(ROWS)  # placed once, or counted
    assert f"pack_dataset (streaming): {len(ROWS)} sequences -> {len(rows)} rows" in caplog.text
    assert f"truncated 4 ({lost} tokens lost)" in caplog.text
    with pytest.raises(ValueError, match=r"example 1 has 12 tokens, longer than seq_length=10.*overlong='truncate'"):
        list(padless.pack_dataset(it, 10))  # a stream is read lazily: refused as it is read
    empty = datasets.Dataset.from_dict({"input_ids": [[1], []]}).to_iterable_dataset()
    with pytest.raises(ValueError, match="example 1 of the stream is an empty sequence"):
        list(padless.pack_dataset(empty, 4))
    with pytest.raises(ValueError, match="cannot take an IterableDataset"):
        plan_dataset(it, 10)


def test_a_stream_keeps_trls_columns_splits_and_format():
    trl = pytest.importorskip("trl")
    ds = datasets.Dataset.from_dict(TRL_EXAMPLE)
    it = ds.to_iterable_dataset()
    theirs = next(iter(trl.pack_dataset(it, 4)))  # TRL packs a stream by map batches
    ours = list(padless.pack_dataset(it, 4, overlong="truncate"))
    assert list(ours[0]) == list(theirs) == ["input_ids", "attention_mask", "seq_lengths"]
    assert sorted(sum((r["input_ids"] for r in ours), [])) == list(range(1, 5)) + list(range(6, 12))
    split = padless.pack_dataset(datasets.IterableDatasetDict(train=it, test=it), 4, overlong="truncate")
    assert isinstance(split, datasets.IterableDatasetDict) and list(split["test"]) == ours
    row = next(iter(padless.pack_dataset(it.with_format("torch"), 4, overlong="truncate")))
    assert row["input_ids"].dtype.is_floating_point is False and int(row["seq_lengths"].sum()) == len(row["input_ids"])
