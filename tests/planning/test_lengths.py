"""Padding baselines, length summaries and the ``padless stats`` / ``padless plan`` commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.cli import main
from padless.planning.lengths import (
    bucketed_order,
    compare_batching,
    draw_lengths,
    load_lengths,
    padding_fraction_bucketed,
    padding_fraction_pad_to_longest,
    summarize_lengths,
    synthetic_lengths,
)
from padless.planning.plan import PackPlan, plan_packs

# ------------------------------------------------------------------------------ library functions


@pytest.mark.parametrize(
    ("lengths", "batch", "multiple", "expected"),
    [
        ([2, 4, 1, 1], 2, None, 1 - 8 / 10),  # [2,4] -> 2x4, [1,1] -> 2x1
        ([2, 4, 1, 1], 2, 4, 1 - 8 / 16),  # both batches rounded up to 4
        ([3, 1, 2], 2, None, 1 - 6 / 8),  # last batch has one sequence: 2x3 + 1x2
        ([5, 5, 5], 3, None, 0.0),
        ([7], 8, None, 0.0),
        ([], 8, None, 0.0),
    ],
)
def test_pad_to_longest_literal(lengths, batch, multiple, expected):
    assert padding_fraction_pad_to_longest(lengths, batch, pad_to_multiple_of=multiple) == pytest.approx(expected)


def test_bucketed_literal():
    # one chunk of two batches: sorted longest first -> [9, 9] and [1, 1], no padding
    assert padding_fraction_bucketed([1, 9, 1, 9], 2, mega_batch_mult=2) == 0.0
    # chunks of one batch keep the shuffled pairs: padding unless the pairs happen to match
    fractions = {padding_fraction_bucketed([1, 9, 1, 9], 2, seed, mega_batch_mult=1) for seed in range(20)}
    assert fractions == {0.0, 1 - 20 / 36}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(1, 9), st.integers(0, 5))
def test_bucketed_order_sorts_inside_chunks(lengths, batch, seed):
    arr = np.asarray(lengths)
    order = bucketed_order(arr, batch, seed, mega_batch_mult=3)
    assert sorted(order.tolist()) == list(range(arr.size))  # a permutation
    for start in range(0, arr.size, 3 * batch):
        chunk = arr[order[start : start + 3 * batch]]
        assert np.all(np.diff(chunk) <= 0)
    assert np.array_equal(order, bucketed_order(arr, batch, seed, mega_batch_mult=3))


def test_bucketing_beats_consecutive_batches_on_skewed_lengths():
    lengths = synthetic_lengths("lognormal", 20_000, seed=1)
    assert padding_fraction_bucketed(lengths, 8) < padding_fraction_pad_to_longest(lengths, 8) / 2


def test_summarize_literal():
    s = summarize_lengths([1, 2, 3, 4, 100])
    assert (s.count, s.total, s.min, s.median, s.mean, s.max) == (5, 110, 1, 3.0, 22.0, 100)
    assert s.p90 == pytest.approx(61.6) and s.p99 == pytest.approx(96.16)
    assert s.as_dict()["total"] == 110


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: summarize_lengths([]), "no lengths"),
        (lambda: padding_fraction_pad_to_longest([3], 0), "batch_size must be an integer >= 1"),
        (lambda: padding_fraction_bucketed([3], 2, pad_to_multiple_of=0), "pad_to_multiple_of"),
        (lambda: padding_fraction_pad_to_longest([3, 0], 2), "sequence 1 has length 0"),
        (lambda: synthetic_lengths("zipf"), "unknown distribution 'zipf'; choose one of lognormal, uniform"),
        (
            lambda: draw_lengths("uniform", 3, np.random.default_rng(), (5, 2)),
            "uniform needs integers 1 <= low <= high",
        ),
        (lambda: draw_lengths("lognormal", 3, np.random.default_rng(), (60, 1, 2048, 4)), "at most 3 parameters"),
    ],
)
def test_library_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_synthetic_distributions():
    ln = synthetic_lengths("lognormal", 50_000, seed=0)
    assert 57 <= np.median(ln) <= 63 and ln.min() >= 1 and ln.max() <= 2048
    un = synthetic_lengths("uniform", 50_000, seed=0)
    assert un.min() == 10 and un.max() == 500
    assert np.array_equal(ln, synthetic_lengths("lognormal", 50_000, seed=0))


def test_compare_batching_literal():
    lengths = np.array([6, 2, 3, 5])  # max_length 8: packs into [6,2] and [5,3]
    plan = plan_packs(lengths, 8)
    out = compare_batching(lengths, plan, batch_size=2)
    assert out["pad_to_longest"] == {"padding_fraction": pytest.approx(1 - 16 / 22), "tokens_computed": 22}
    assert out["packed"] == {"padding_fraction": 0.0, "tokens_computed": 16}


# --------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("6\n2\n\n3\n5\n")
    return path


def test_stats_cli_text(lengths_file, capsys):
    assert main(["stats", "--lengths", str(lengths_file), "--max-length", "8", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 sequences, 16 tokens" in out
    assert "2 rows (lower bound 2, gap 0" in out
    assert "pad to longest" in out and "bucketed" in out and "packed (best_fit_decreasing)" in out


def test_stats_cli_json_matches_the_library(lengths_file, capsys):
    argv = ["stats", "--lengths", str(lengths_file), "--max-length", "8", "--batch-size", "2", "--json"]
    assert main([*argv, "--strategy", "next_fit"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["lengths"]["total"] == 16
    assert doc["plan"]["num_rows"] == plan_packs([6, 2, 3, 5], 8, strategy="next_fit").num_rows == 2
    assert doc["batching"]["pad_to_longest"]["tokens_computed"] == 22


@pytest.mark.parametrize("suffix", [".npy", ".json"])
def test_lengths_files(tmp_path, suffix):
    path = tmp_path / f"l{suffix}"
    if suffix == ".npy":
        np.save(path, np.array([4, 5, 6]))
    else:
        path.write_text("[4, 5, 6]")
    assert load_lengths(path).tolist() == [4, 5, 6]


def test_stats_cli_defaults_and_histogram(tmp_path, capsys):
    assert main(["stats"]) == 0  # no arguments: the built-in lognormal distribution
    assert "lognormal" in capsys.readouterr().out
    png = tmp_path / "hist.png"
    assert main(["stats", "--dist", "uniform", "--num", "3000", "--hist", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_cli_writes_the_plan(tmp_path, lengths_file, capsys):
    out = tmp_path / "sub" / "plan.npz"
    argv = ["plan", "--lengths", str(lengths_file), "--max-length", "4", "--overlong", "split", "--out", str(out)]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    saved = PackPlan.load(str(out))
    expected = plan_packs([6, 2, 3, 5], 4, overlong="split")
    for name in ("index", "start", "length", "row_offsets"):
        assert np.array_equal(getattr(saved, name), getattr(expected, name))
    saved.check([6, 2, 3, 5])


def test_data_flag_uses_load_corpus(monkeypatch, capsys):
    import padless.data.load
    from padless.data.load import CorpusReport, TokenizedCorpus

    def fake(name, tokenizer, **options):
        ids = [[1] * 3, [1] * 4, [1] * 5]
        report = CorpusReport(
            read=3,
            selected=3,
            kept=3,
            skipped={},
            truncated_examples=0,
            truncated_tokens=0,
            boundary_mismatches=0,
            tokens=12,
            trained_tokens=12,
        )
        return TokenizedCorpus(name, ids, ids, report)

    monkeypatch.setattr(padless.data.load, "load_corpus", fake)
    assert main(["stats", "--data", "tweets", "--max-length", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "corpus tweets" and doc["lengths"]["count"] == 3 and doc["data"]["train_on"] == "all"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "missing.txt"], "no such file"),
        (["--lengths", "{bad_txt}"], "line 2: 'abc' is not an integer"),
        (["--lengths", "{zero_txt}"], "sequence 1 has length 0"),
        (["--lengths", "{csv}"], "unsupported file type '.csv'"),
        (
            ["--lengths", "{long_txt}", "--max-length", "8", "--overlong", "error"],
            "1 sequence is over --max-length 8 and --overlong is error",
        ),
        (["--max-length", "0", "--num", "10"], "argument --max-length: must be between 1 and"),
        (["--batch-size", "0", "--num", "10"], "argument --batch-size: must be between 1 and"),
        (["--max-per-row", "0", "--num", "10"], "argument --max-per-row: must be between 1 and"),
        (["--num", "0"], "argument --num: must be between 1 and"),
    ],
)
def test_stats_cli_bad_input_exits_2(tmp_path, capsys, args, message):
    files = {"bad_txt": "3\nabc\n", "zero_txt": "3\n0\n", "csv": "3\n", "long_txt": "30\n2\n"}
    paths = {}
    for key, text in files.items():
        paths[key] = tmp_path / (f"{key}.csv" if key == "csv" else f"{key}.txt")
        paths[key].write_text(text)
    argv = ["stats", *(a.format(**paths) for a in args)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_plan_cli_bad_out_and_unknown_strategy(tmp_path, lengths_file, capsys):
    assert main(["plan", "--lengths", str(lengths_file), "--out", str(tmp_path / "plan.txt")]) == 2
    assert "--out must end in .npz" in capsys.readouterr().err
    # argparse rejects an unknown choice with status 2
    assert main(["plan", "--strategy", "magic", "--out", str(tmp_path / "p.npz")]) == 2
