"""Resume that never loses or mixes: damaged or missing shards are rewritten, other inputs or flags are
refused naming the change, one run at a time (the lock), every input token exactly once."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import check_documents
from padless.data.inputs import open_input
from padless.export.parquet import pack_to_parquet
from padless.export.state import FolderLock, JobMismatch


def write_input(path, n=600, seed=0):
    """Sequence i: ids all equal to i, so a document names its source."""
    lengths = np.random.default_rng(seed).integers(1, 50, n)
    path.write_text("".join(json.dumps({"input_ids": [i] * int(k)}) + "\n" for i, k in enumerate(lengths)))
    return path, lengths


def pack(src, out, **kw):
    kw = {"rows_per_shard": 40, "shard_rows": 128, "progress": False, **kw}
    return pack_to_parquet(open_input(str(src), vocab_size=10_000, shard_rows=kw["shard_rows"]), out, 64, **kw)


def shards(out):
    return sorted(Path(out).glob("shard-*.parquet"))


def every_token_once(out, lengths):
    """Every sequence is one whole document of one row of the written shards, exactly once."""
    check_documents([row for path in shards(out) for row in pq.read_table(path).to_pylist()], lengths, 64)


def test_a_damaged_shard_is_rewritten_not_silently_lost(tmp_path):
    src, lengths = write_input(tmp_path / "in.jsonl")
    ref = pack(src, tmp_path / "ref")
    out = tmp_path / "out"
    first = pack(src, out, max_shards=3)  # a run stopped after a few shards
    assert not first["complete"] and len(shards(out)) == 3
    damaged = shards(out)[1]
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])  # cut to half its size
    (shards(out)[0]).unlink()  # and one finished shard gone
    summary = pack(src, out)
    assert summary["complete"] and summary["this_run"]["shards_written"] == len(shards(out)) - 1
    assert [p.read_bytes() for p in shards(out)] == [p.read_bytes() for p in shards(tmp_path / "ref")]
    every_token_once(out, lengths)
    assert summary["tokens_accounted"] and summary["tokens_in"] == int(lengths.sum()) == ref["tokens_out"]
    # damage after completion: the rerun notices and rewrites, still every token once
    last = shards(out)[-1]
    last.write_bytes(last.read_bytes()[:100])
    again = pack(src, out)
    assert not again.get("already_complete") and again["this_run"]["shards_written"] == 1
    every_token_once(out, lengths)
    assert pack(src, out)["already_complete"]
    assert not (out / ".work").exists() and not list(out.glob(".*.tmp")) and not (out / ".lock").exists()


def test_other_input_or_flags_are_refused_naming_the_change_and_overwrite_starts_over(tmp_path):
    src, _ = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "out"
    pack(src, out, max_shards=1)
    with pytest.raises(ValueError, match=r"other options \(rows_per_shard was 40, now 30\).*overwrite=True"):
        pack(src, out, rows_per_shard=30)
    with pytest.raises(JobMismatch) as refused:  # every difference, each named
        pack(src, out, overlong="drop", rows_per_shard=30)
    assert refused.value.changes == [("overlong", "error", "drop"), ("rows_per_shard", 40, 30)]
    other, lengths = write_input(tmp_path / "other.jsonl", seed=1)
    with pytest.raises(JobMismatch) as refused:  # the content, as one change; the options of the input by name
        pack_to_parquet(
            open_input(str(other), vocab_size=20_000, shard_rows=128), out, 64, rows_per_shard=40, progress=False
        )
    assert [name for name, _, _ in refused.value.changes] == ["input", "vocab_size"]
    assert refused.value.changes[1][1:] == (10_000, 20_000)
    assert len(shards(out)) == 1  # the refusals touched nothing
    summary = pack(other, out, overwrite=True)
    assert summary["complete"] and summary["this_run"]["shards_written"] == len(shards(out))
    every_token_once(out, lengths)


def test_a_second_run_into_the_folder_is_refused_naming_the_holder(tmp_path):
    src, _ = write_input(tmp_path / "in.jsonl", n=50)
    out = tmp_path / "out"
    out.mkdir()
    with FolderLock(out):
        with pytest.raises(
            ValueError, match=f"another padless pack \\(pid {os.getpid()} on host {socket.gethostname()}"
        ):
            pack(src, out)
    assert not (out / ".lock").exists() and not shards(out)
    # a lock left by a process that is gone (same host) is taken over
    (out / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 12345, "started": "x"}))
    assert pack(src, out)["complete"]
    # a lock held on another host is never taken over
    (out / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "x"}))
    with pytest.raises(ValueError, match="pid 1 on host elsewhere.*delete .*\\.lock if that run is gone"):
        pack(src, out)


def test_a_folder_padless_did_not_write_is_refused_and_overwrite_keeps_its_other_files(tmp_path):
    src, lengths = write_input(tmp_path / "in.jsonl", n=50)
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "shard-00000.parquet").write_text("not a shard")
    with pytest.raises(
        ValueError,
        match=r"theirs is not empty and has no state\.json.*it holds notes\.txt, "
        r"shard-00000\.parquet\).*overwrite=True",
    ):
        pack(src, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "shard-00000.parquet"]  # untouched
    assert pack(src, out, overwrite=True)["complete"]
    assert (out / "notes.txt").read_text() == "mine"  # only padless' own names are replaced
    every_token_once(out, lengths)
    (out / "README.md").write_text("a folder padless wrote stays resumable with a file added")
    assert pack(src, out)["already_complete"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pack(src, empty)["complete"]


def test_the_rows_do_not_depend_on_the_shard_size_and_markers_skip_finished_work(tmp_path, monkeypatch):
    src, lengths = write_input(tmp_path / "in.jsonl", n=500)
    pack(src, tmp_path / "a", shard_rows=1000)
    pack(src, tmp_path / "b", shard_rows=37)
    assert [p.read_bytes() for p in shards(tmp_path / "a")] == [p.read_bytes() for p in shards(tmp_path / "b")]
    # stopped, then resumed: the map and place stages are not run again for finished shards
    out = tmp_path / "c"
    pack(src, out, max_shards=2)
    import padless.export.parquet as parquet

    def fail(*args, **kwargs):
        raise AssertionError("a finished shard was tokenized again")

    monkeypatch.setattr(parquet, "map_shard", fail)
    monkeypatch.setattr(parquet, "place_shard", fail)
    assert pack(src, out)["complete"]
    assert [p.read_bytes() for p in shards(out)] == [p.read_bytes() for p in shards(tmp_path / "a")]
    every_token_once(out, lengths)


def test_a_damaged_token_shard_is_tokenized_again(tmp_path):
    src, lengths = write_input(tmp_path / "in.jsonl", n=400)
    out = tmp_path / "out"
    pack(src, out, max_shards=1)
    ids = sorted((out / ".work" / "tokens").glob("*.ids.npy"))[1]
    ids.write_bytes(ids.read_bytes()[:-8])
    assert pack(src, out)["complete"]
    every_token_once(out, lengths)


def test_a_list_of_examples_packs_too(tmp_path):
    examples = [{"input_ids": [i] * n, "labels": [-100] + [i] * (n - 1)} for i, n in enumerate([3, 9, 4, 7, 1, 8])]
    summary = pack_to_parquet(examples, tmp_path / "out", 12, rows_per_shard=2, progress=False)
    assert summary["complete"] and summary["stats"]["num_rows"] == 3 and summary["tokens_accounted"]
    rows = [r for p in shards(tmp_path / "out") for r in pq.read_table(p).to_pylist()]
    docs = sorted(
        (tuple(r["input_ids"][a : a + n]), tuple(r["labels"][a : a + n]))
        for r in rows
        for a, n in zip(np.cumsum([0, *r["seq_lengths"][:-1]]), r["seq_lengths"])
    )
    assert docs == sorted((tuple(e["input_ids"]), tuple(e["labels"])) for e in examples)


def test_the_writer_refuses_placements_that_do_not_tile_the_plan_rows(tmp_path):
    """The write stage checks the plan's promise (every slot of its rows filled once) instead of trusting it."""
    from padless.export.stages import write_shard
    from padless.planning.slots import plan_histogram

    src, lengths = write_input(tmp_path / "in.jsonl", n=300)
    out = tmp_path / "out"
    pack(src, out, max_shards=1)
    counts = np.bincount(lengths, minlength=65)
    other = plan_histogram(np.concatenate([counts, np.zeros(40, dtype=np.int64)]), 104)  # rows of another length
    with pytest.raises(AssertionError, match="do not tile its rows"):
        write_shard(out / ".work", tmp_path, other, 40, 3, 0)
    right = plan_histogram(counts, 64)
    assert (
        write_shard(out / ".work", tmp_path, right, 40, 3, 0)["blake2b"]
        == json.loads((out / "state.json").read_text())["shards"]["shard-00000.parquet"]["blake2b"]
    )
