"""`padless pack`: Parquet shards of packed rows, read back by datasets and the collator; resume; errors."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import check_documents, row_documents
from padless.batching.collate import PackingCollator
from padless.cli import main
from padless.data.inputs import SyntheticTokens


def write_tokens_jsonl(path, lengths, seed=0):
    """Sequence i: ids all equal to i (so a document names its source); labels mask a prefix."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            cut = int(rng.integers(0, n))
            f.write(json.dumps({"input_ids": [i] * int(n), "labels": [-100] * cut + [i] * (int(n) - cut)}) + "\n")
            if i % 7 == 0:
                f.write("\n")  # blank lines are skipped
    return path


def shard_files(out):
    return sorted(Path(out).glob("shard-*.parquet"))


def read_rows(out):
    table = pa.concat_tables([pq.read_table(p) for p in shard_files(out)])
    return table.to_pylist()


def pack(*argv):
    return main(["pack", *map(str, argv), "--no-progress"])


def test_pack_jsonl_reads_back_with_datasets_and_the_collator(tmp_path):
    lengths = np.random.default_rng(0).integers(1, 60, 300).tolist()
    src = write_tokens_jsonl(tmp_path / "data.jsonl", lengths)
    out = tmp_path / "out"
    assert pack(src, "--out", out, "--max-length", 64, "--rows-per-shard", 50, "--shard-rows", 64) == 0
    assert len(shard_files(out)) >= 3
    schema = pq.read_schema(shard_files(out)[0])
    assert schema.names == ["input_ids", "labels", "seq_lengths"]
    assert all(pa.types.is_list(f.type) and f.type.value_type == pa.int32() for f in schema)

    from datasets import load_dataset

    ds = load_dataset(
        "parquet", data_files=[str(p) for p in shard_files(out)], split="train", cache_dir=str(tmp_path / "hf")
    )
    rows = [dict(r) for r in ds]
    check_documents(rows, lengths, 64)
    assert rows == read_rows(out)

    # labels are stored as given (unmasked): the collator masks each document's first label itself
    originals = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    batch = PackingCollator(model_free=True, max_length=64, pad_token_id=7)(rows[:5])
    for r, row in enumerate(rows[:5]):
        at = 0
        for n in row["seq_lengths"]:
            i = row["input_ids"][at]
            assert row["labels"][at : at + n] == originals[i]["labels"]
            assert batch["labels"][r, at].item() == -100
            assert batch["labels"][r, at + 1 : at + n].tolist() == originals[i]["labels"][1:]
            at += n

    summary = json.loads((out / "summary.json").read_text())
    s = summary["stats"]
    assert summary["complete"] and summary["tokens_accounted"]
    assert summary["tokens_in"] == summary["tokens_out"] == sum(lengths)
    assert s["num_rows"] == len(rows) and s["num_sequences"] == len(lengths)
    assert s["efficiency"] == pytest.approx(sum(lengths) / (64 * len(rows)))
    assert [sh["rows"] for sh in summary["shards"]] == [pq.read_metadata(p).num_rows for p in shard_files(out)]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_pretokenized_files_stream_and_resume_identically(tmp_path, fmt):
    lengths = np.random.default_rng(1).integers(1, 40, 300).tolist()
    if fmt == "jsonl":
        src = write_tokens_jsonl(tmp_path / "in.jsonl", lengths)
    else:  # no labels column: every token is trained
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"input_ids": [[i] * n for i, n in enumerate(lengths)]}), src, row_group_size=64)
    args = [src, "--max-length", 48, "--rows-per-shard", 20, "--shard-rows", 50]
    assert pack(*args, "--out", tmp_path / "ref") == 0
    for _ in range(3):  # three interrupted runs of 2 shards, then one to the end
        assert pack(*args, "--out", tmp_path / "out", "--max-shards", 2) == 0
    assert pack(*args, "--out", tmp_path / "out") == 0
    ref, out = shard_files(tmp_path / "ref"), shard_files(tmp_path / "out")
    assert [p.name for p in out] == [p.name for p in ref] and len(ref) > 6
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(out, ref))
    rows = read_rows(tmp_path / "out")
    check_documents(rows, lengths, 48)
    if fmt == "parquet":
        assert all(row["labels"] == row["input_ids"] for row in rows)


def test_pack_text_is_tokenized_by_padless_data(tmp_path, monkeypatch):
    monkeypatch.setenv("PADLESS_CACHE", str(tmp_path / "cache"))
    texts = ["hello world", "packing short sequences", "a third, slightly longer line of text to tokenize"]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    assert pack(tmp_path / "t.jsonl", "--out", out, "--max-length", 32) == 0
    from padless.data import load_corpus

    corpus = load_corpus(str(tmp_path / "t.jsonl"), "gpt2")
    rows = read_rows(out)
    docs = row_documents(rows)
    assert sorted(docs) == sorted(corpus.input_ids)
    assert all(d[-1] == 50256 for d in docs)  # padless.data ends every example with EOS


@pytest.mark.parametrize("overlong", ["truncate", "split", "drop"])
def test_summary_accounts_for_every_token(tmp_path, overlong):
    out = tmp_path / overlong
    assert (
        pack(
            "--synthetic",
            "lognormal:3000:40:1.0",
            "--out",
            out,
            "--max-length",
            128,
            "--overlong",
            overlong,
            "--rows-per-shard",
            200,
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    s = summary["stats"]
    lengths = SyntheticTokens("lognormal:3000:40:1.0").lengths()
    long = lengths[lengths > 128]
    assert long.size > 0 and summary["tokens_in"] == int(lengths.sum()) and summary["tokens_accounted"]
    assert summary["tokens_out"] == sum(len(r["input_ids"]) for r in read_rows(out))
    assert s["truncated_tokens"] == (int((long - 128).sum()) if overlong == "truncate" else 0)
    assert s["dropped_sequences"] == (long.size if overlong == "drop" else 0)
    assert s["split_sequences"] == (long.size if overlong == "split" else 0)


@pytest.mark.parametrize("spec", ["lognormal:5000", "lognormal:5000:30:0.5:100", "uniform:5000", "uniform:5000:3:9"])
def test_synthetic_lengths_come_from_the_one_generator(spec):
    """``--synthetic`` and ``padless stats --dist`` draw lengths with one generator and one set of
    defaults (planning.lengths.draw_lengths): block b of 4096 from the seed (seed, b)."""
    from padless.planning.lengths import draw_lengths

    name, _, rest = spec.partition(":")
    params = [float(p) for p in rest.split(":")[1:]]
    lengths = SyntheticTokens(spec, seed=7).lengths()
    expected = [draw_lengths(name, n, np.random.default_rng([7, b]), params) for b, n in enumerate((4096, 904))]
    assert np.array_equal(lengths, np.concatenate(expected))


def test_synthetic_items_are_stable_under_random_access():
    a, b = (SyntheticTokens("uniform:10000:5:50", vocab_size=100, seed=3) for _ in range(2))
    seq = [a[i]["input_ids"].tolist() for i in range(9000, 9100)]
    rnd = [b[i]["input_ids"].tolist() for i in (9050, 17, 9000, 4095, 4096)]
    assert rnd[0] == seq[50] and rnd[2] == seq[0]
    assert [len(x) for x in seq] == a.lengths()[9000:9100].tolist()
    assert all(5 <= len(x) <= 50 and max(x) < 100 for x in seq)


def test_interrupted_runs_resume_to_identical_shards(tmp_path, monkeypatch):
    args = ["--synthetic", "lognormal:4000", "--max-length", 256, "--rows-per-shard", 100, "--overlong", "truncate"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert pack(*args, "--out", ref) == 0
    assert pack(*args, "--out", out, "--max-shards", 2) == 0  # stopped cleanly after 2 shards
    assert len(shard_files(out)) == 2 and not (out / "summary.json").exists()

    # then a crash in the middle of writing shard 4: nothing named like a shard is half-written
    real, calls = pq.write_table, []

    def crash_on_second(table, where, **kw):
        calls.append(1)
        if len(calls) == 2:
            where.write(b"PAR1 half a shard")
            raise KeyboardInterrupt
        return real(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", crash_on_second)
    assert pack(*args, "--out", out) == 130  # Ctrl-C: a message and 128 + SIGINT, no traceback
    monkeypatch.setattr(pq, "write_table", real)
    assert [p.name for p in shard_files(out)] == [f"shard-{i:05d}.parquet" for i in range(3)]
    assert sorted(json.loads((out / "state.json").read_text())["shards"]) == [p.name for p in shard_files(out)]

    assert pack(*args, "--out", out) == 0  # resumes from shard 3
    assert [p.name for p in shard_files(out)] == [p.name for p in shard_files(ref)]
    for a, b in zip(shard_files(out), shard_files(ref)):
        assert a.read_bytes() == b.read_bytes()
    assert not list(out.glob(".*.tmp"))
    s_out, s_ref = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert s_out["stats"] == s_ref["stats"] and s_out["shards"] == s_ref["shards"]
    assert pack(*args, "--out", out) == 0  # already complete: nothing changes


def bad_jsonl(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"input_ids": [1, 2]}\n{"input_ids": [3\n')
    return p


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (lambda t: [t / "missing.jsonl"], "neither an existing file or folder nor a built-in corpus"),
        (lambda t: [], "exactly one of INPUT and --synthetic"),
        (lambda t: [t / "x.jsonl", "--synthetic", "lognormal:10"], "exactly one of INPUT and --synthetic"),
        (lambda t: ["--synthetic", "gauss:10"], "--synthetic 'gauss:10'"),
        (lambda t: ["--synthetic", "lognormal:ten"], "must be numbers"),
        (lambda t: ["--synthetic", "lognormal:10", "--max-length", 0], "argument --max-length: must be between 1"),
        (lambda t: ["--synthetic", "lognormal:10", "--rows-per-shard", 0], "argument --rows-per-shard: must be"),
        (
            lambda t: ["--synthetic", "lognormal:10", "--num-workers", 2],
            "--num-workers and --ray-address need --engine ray",
        ),
        (lambda t: ["--synthetic", "lognormal:500:300", "--max-length", 64], "longer than --max-length 64"),
        (lambda t: [bad_jsonl(t)], "line 2 is not valid JSON"),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, argv, message):
    (tmp_path / "x.jsonl").write_text('{"input_ids": [1]}\n')
    args = argv(tmp_path)
    if "--max-length" not in args:
        args += ["--max-length", 16]
    assert pack(*args, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("padless pack: error:") and message in err


def test_rerun_with_other_flags_or_a_foreign_folder_exits_2(tmp_path, capsys):
    out = tmp_path / "out"
    assert pack("--synthetic", "lognormal:200", "--out", out, "--max-length", 512) == 0
    assert pack("--synthetic", "lognormal:200", "--out", out, "--max-length", 256, "--overlong", "drop") == 2
    assert capsys.readouterr().err.strip() == (
        f"padless pack: error: --out {out} holds a packing made with other flags: --max-length was 512, now 256; "
        "--overlong was error, now drop; rerun with the same flags, choose another --out, or pass --overwrite to "
        "start over"
    )
    assert pack("--synthetic", "lognormal:300", "--out", out, "--max-length", 512) == 2
    assert "--synthetic was lognormal:200, now lognormal:300" in capsys.readouterr().err
    (out / "state.json").unlink()
    assert pack("--synthetic", "lognormal:200", "--out", out, "--max-length", 512) == 2
    assert f"--out {out} is not empty and has no state.json" in capsys.readouterr().err


def test_resume_refuses_an_input_whose_bytes_changed(tmp_path, capsys):
    """The resume key is the input's content: same size and modification time, other ids -> refused."""
    import os

    src = write_tokens_jsonl(tmp_path / "in.jsonl", [5] * 40)
    stat = src.stat()
    args = [src, "--out", tmp_path / "out", "--max-length", 16, "--rows-per-shard", 2]
    assert pack(*args, "--max-shards", 1) == 0
    before = src.read_text()
    src.write_text(before.replace("[0, 0, 0, 0, 0]", "[1, 1, 1, 1, 1]", 1))
    assert src.read_text() != before
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert src.stat().st_size == stat.st_size
    assert pack(*args) == 2
    assert "made with other flags: INPUT is not the input packed there (other content)" in capsys.readouterr().err


def test_a_jsonl_mixing_text_and_token_rows_exits_2_naming_the_line(tmp_path, capsys):
    rows = [{"text": "a b c"}, {"text": "d e"}, {"input_ids": [1, 2, 3]}, {"text": "f"}]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pack(tmp_path / "mixed.jsonl", "--out", tmp_path / "out", "--max-length", 32) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "mixed.jsonl, line 3 has 'input_ids', but the input's first record has 'text'" in err
    )
    assert not (tmp_path / "out").exists()
