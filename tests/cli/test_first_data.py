"""A first try on one's own chats: defaults that follow the model, one overlong default, each choice
printed in one line, refusals that name the flag, and ``--help`` showing every default.

Small JSON lines files in ``tmp_path``; the GPT-2 tokenizer except where SmolLM2's is the point.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import row_documents
from padless.cli import build_parser, main
from padless.data.load import load_corpus
from padless.planning.checks import OVERLONG_DEFAULT

CHATS = [
    {"messages": [{"role": "user", "content": "What's the weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "content": '{"temp": 18, "sky": "cloudy"}'},
                  {"role": "assistant", "content": "It is 18 degrees and cloudy in Paris."}]},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"},
                  {"role": "assistant", "content": "Hi."}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
]  # fmt: skip
OWNED = ("stats", "plan", "pack")  # the subcommands whose modules these tests hold to the rules


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh padless cache whose tokenizer folders are the real cache's (SmolLM2's takes ~30 s to
    convert from its GGUF the first time), so token caches start empty."""
    from padless.data.assets import cache_root
    from padless.data.tokenizer import gpt2_tokenizer_dir, smollm2_tokenizer_dir

    real = cache_root()
    gpt2_tokenizer_dir(real), smollm2_tokenizer_dir(real)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tokenizers").symlink_to(real / "tokenizers")
    monkeypatch.setenv("PADLESS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_stats_prints_the_tokenizer_and_trains_chats_on_assistant_turns(tmp_path, capsys, cache):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    assert main(["stats", "--data", str(chats)]) == 0
    out = capsys.readouterr().out.splitlines()
    corpus = load_corpus(str(chats), "gpt2", train_on="assistant")
    assert out[0] == "tokenizer: gpt2, vocab 50,257 (the default; pass --tokenizer or --model for your model's)"
    assert out[1] == "format: chats ('messages') (detected from the first record)"
    assert out[2] == (
        f"train on: the assistant turns (--train-on auto, for chats; --train-on all trains every token); "
        f"{corpus.report.trained_tokens:,} of {corpus.report.tokens:,} tokens trained"
    )
    assert out[3] == f"lengths: file {chats}"  # GPT-2 has no chat template, so no system prompt is added
    assert f"  {len(CHATS)} sequences, {corpus.report.tokens:,} tokens;" in out[4]
    assert main(["stats", "--data", str(chats), "--train-on", "all", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["train_on"] == "all" and data["trained_tokens"] == data["tokens"] == corpus.report.tokens
    assert data["tokenizer"] == "gpt2" and data["vocab_size"] == 50257 and data["system_prompt_added"] == 0
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "hello there"}, {"text": "a second line"}])
    assert main(["stats", "--data", str(text)]) == 0
    assert "train on: every token (--train-on auto, for text); " in capsys.readouterr().out


@pytest.mark.slow  # ~20 s: SmolLM2's tokenizer renders and counts the chats four times
def test_model_implies_its_own_tokenizer(tmp_path, capsys, cache):
    """SmolLM2's tokenizer counts other lengths than GPT-2's, and its template adds a default system
    prompt to each chat without a system message: both are printed, and --system-prompt none drops it."""
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    assert main(["stats", "--data", str(chats), "--model", "smollm2-135m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    smol = load_corpus(str(chats), "smollm2", train_on="assistant")
    assert data["data"]["tokenizer"] == "smollm2-135m" and data["data"]["vocab_size"] == 49152
    assert data["lengths"]["total"] == smol.report.tokens != load_corpus(str(chats), "gpt2").report.tokens
    assert main(["stats", "--data", str(chats), "--model", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert "tokenizer: smollm2-135m, vocab 49,152 (the tokenizer of --model smollm2-135m)\n" in out
    assert (
        "system prompt added to 2 of 3 chats by the tokenizer's chat template (they have no system message; "
        "--system-prompt none leaves it out)" in out
    )
    argv = ["stats", "--data", str(chats), "--tokenizer", "smollm2-135m", "--system-prompt", "none", "--json"]
    assert main(argv) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["data"]["system_prompt_added"] == 0 and bare["lengths"]["total"] < data["lengths"]["total"]
    # the same choice in pack: the printed tokenizer is the one whose ids are in the rows
    assert (
        main(
            [
                "pack",
                str(chats),
                "--out",
                str(tmp_path / "out"),
                "--max-length",
                "512",
                "--model",
                "smollm2-135m",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "tokenizer: smollm2-135m, vocab 49,152 (the tokenizer of --model smollm2-135m)" in out
    rows = pq.read_table(tmp_path / "out" / "shard-00000.parquet").to_pylist()
    assert sorted(row_documents(rows)) == sorted(smol.input_ids)
    # a GPT-2 size implies GPT-2's tokenizer; --tokenizer naming the same one agrees
    assert main(["stats", "--data", str(chats), "--model", "gpt2-2layer", "--tokenizer", "gpt2"]) == 0
    assert "tokenizer: gpt2, vocab 50,257 (--tokenizer)" in capsys.readouterr().out


def test_pack_trains_chats_on_assistant_turns_by_default_and_says_so(tmp_path, capsys, cache):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    assert main(["pack", str(chats), "--out", str(tmp_path / "auto"), "--max-length", "256", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [
        f"input: {chats}, chats ('messages')",
        "tokenizer: gpt2, vocab 50,257 (the default; pass --tokenizer or --model for your model's)",
        "train on: the assistant turns (--train-on auto, for chats; --train-on all trains every token)",
        "overlong: error (the first sequence over --max-length 256 stops with an error; pass --overlong "
        "truncate|split|drop)",
    ]
    assert out[4].startswith(f"packed 3 sequences into 1 row of 256 tokens, 1 shard in {tmp_path / 'auto'}")

    def labels(out):
        rows = pq.read_table(out / "shard-00000.parquet").to_pylist()
        return sorted(row_documents([{"input_ids": r["labels"], "seq_lengths": r["seq_lengths"]} for r in rows]))

    assert labels(tmp_path / "auto") == sorted(load_corpus(str(chats), "gpt2", train_on="assistant").labels)
    assert (
        main(
            [
                "pack",
                str(chats),
                "--out",
                str(tmp_path / "all"),
                "--max-length",
                "256",
                "--no-progress",
                "--train-on",
                "all",
            ]
        )
        == 0
    )
    assert "train on: every token (--train-on all)" in capsys.readouterr().out
    assert labels(tmp_path / "all") == sorted(load_corpus(str(chats), "gpt2", train_on="all").input_ids)


def test_one_overlong_default_for_the_library_and_the_command_line():
    from padless.batching.collate import PackingCollator
    from padless.batching.rows import PackedRows
    from padless.batching.samplers import DistributedPackedBatchSampler
    from padless.data.encode import EncodeOptions
    from padless.export.parquet import pack_to_parquet
    from padless.integrations.datasets import resolve_strategy
    from padless.integrations.transformers import PackedTrainer
    from padless.planning.buffered import StreamOptions
    from padless.planning.plan import OVERLONG_POLICIES, plan_packs
    from padless.planning.schedule import schedule_epoch

    assert OVERLONG_DEFAULT == "error" and OVERLONG_DEFAULT in OVERLONG_POLICIES
    library = {
        **{cls.__name__: {f.name: f.default for f in dataclasses.fields(cls)}["overlong"]
           for cls in (PackingCollator, EncodeOptions, StreamOptions, DistributedPackedBatchSampler)},
        **{fn.__qualname__: inspect.signature(fn).parameters["overlong"].default
           for fn in (plan_packs, schedule_epoch, pack_to_parquet, load_corpus, PackedRows.__init__,
                      PackedTrainer.__init__)},
        "SFTTrainer (trl's packing, no overlong)": resolve_strategy("bfd", None)[1],
    }  # fmt: skip
    cli = {}
    for command in OWNED:
        parser = build_parser([command])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        cli[command] = sub.get_default("overlong")
    # stats reports rather than stops: its own default (None: split, said in the report), not the packing one
    assert cli.pop("stats") is None
    assert set(library.values()) == set(cli.values()) == {OVERLONG_DEFAULT}, (library, cli)


def test_stats_with_data_over_the_limit_names_the_count_and_the_way_out(tmp_path, capsys, cache):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    assert main(["stats", "--data", str(chats), "--max-length", "20"]) == 0  # stats' default splits, and says so
    assert "split is stats' default" in capsys.readouterr().out
    assert main(["stats", "--data", str(chats), "--max-length", "20", "--overlong", "error"]) == 2
    captured = capsys.readouterr()
    assert "overlong: error (3 sequences over --max-length 20; pass --overlong truncate|split|drop)" in captured.out
    assert captured.err.strip().startswith("padless stats: error: 3 sequences are over --max-length 20")
    assert main(["stats", "--data", str(chats), "--max-length", "20", "--overlong", "split"]) == 0


def test_resume_with_other_flags_names_each_flag(tmp_path, capsys, cache):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS * 4)
    args = ["pack", str(chats), "--out", str(tmp_path / "out"), "--no-progress", "--rows-per-shard", "1"]
    assert main([*args, "--max-length", "256", "--max-shards", "1"]) == 0
    capsys.readouterr()
    assert main([*args, "--max-length", "512", "--train-on", "all"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"padless pack: error: --out {tmp_path / 'out'} holds a packing made with other flags: --train-on was "
        "assistant, now all; --max-length was 256, now 512; rerun with the same flags, choose another --out, or pass "
        "--overwrite to start over"
    )
    assert main([*args, "--max-length", "512", "--train-on", "all", "--overwrite"]) == 0


def test_pack_into_a_folder_it_did_not_write_is_refused_naming_it(tmp_path, capsys, cache):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    args = ["pack", str(chats), "--out", str(out), "--max-length", "256", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"padless pack: error: --out {out} is not empty and has no state.json, so padless pack did not "
        "write it (it holds thesis.tex); choose a new or empty folder, or --overwrite to pack into it "
        "(files named like padless' own are replaced, other files are kept)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert main([*args, "--overwrite"]) == 0
    assert (out / "thesis.tex").read_text() == "years of work" and (out / "shard-00000.parquet").is_file()


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser([command])
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


@pytest.mark.parametrize("command", OWNED)
def test_help_shows_every_default(command, capsys):
    """Each flag that takes a value shows its default: ``(default: X)``, or in words where it is None
    (``default: all CPUs``); the inputs to choose one of (INPUT, --synthetic; --lengths, --dist, --data)
    and required flags have none."""
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    sources = {"input", "synthetic", "lengths", "data"} | ({"dist"} if command == "plan" else set())
    for action in _subparser(command)._actions:
        if action.nargs == 0 or action.required or action.dest in sources:
            continue
        shown = re.escape(" ".join(action.help.split()))
        said = re.search(rf"{shown}(?: \(default: ([^)]*)\))?", text)
        assert said is not None, action.dest
        if action.default is None:
            assert "default:" in action.help, f"{command} --{action.dest}: say what None means"
        else:
            assert said.group(1) == str(action.default), f"{command} --{action.dest}"


def test_help_uses_the_one_formatter():
    from padless.cli import HelpFormatter

    for command in OWNED:
        assert _subparser(command).formatter_class is HelpFormatter, command


def test_a_reader_that_stops_early_gets_no_error_message(monkeypatch, capsys):
    """``padless stats | head -1``: the output ends where the reader stopped, without a message."""
    import os

    from padless.cli import EXIT_BROKEN_PIPE

    read, write = os.pipe()
    os.close(read)  # the reader is gone: the first write fails with EPIPE
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["stats", "--num", "1000"]) == EXIT_BROKEN_PIPE
    monkeypatch.undo()
    stdout.close()
    assert capsys.readouterr().err == ""
