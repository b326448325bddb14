"""padless stats --data and padless pack on the forms people's data comes in: each detected and named,
--columns for other field names, a typo named by file, record or line, field and fix (exit 2, one line),
and --on-error skip counting bad records and naming the first few."""

from __future__ import annotations

import json
import re

import pytest

from formats_support import FORMS, TYPOS, with_typo, write
from padless.cli import main
from padless.data.formats import FORMATS


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """A fresh token cache whose tokenizer folders are the real cache's."""
    from padless.data.assets import cache_root
    from padless.data.tokenizer import gpt2_tokenizer_dir

    real = cache_root()
    gpt2_tokenizer_dir(real)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tokenizers").symlink_to(real / "tokenizers")
    monkeypatch.setenv("PADLESS_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("form", list(FORMS))
def test_stats_and_pack_read_and_name_each_form(tmp_path, capsys, form, suffix):
    path = write(tmp_path / f"d{suffix}", FORMS[form])
    assert main(["stats", "--data", str(path), "--max-length", "256"]) == 0
    out = capsys.readouterr().out
    assert f"format: {FORMATS[form]}" in out and "3 sequences" in out, out
    assert main(["pack", str(path), "--out", str(tmp_path / "out"), "--max-length", "256", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"input: {path}, {FORMATS[form]}" in out and "packed 3 sequences" in out, out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stats"]["num_sequences"] == 3 and summary["skipped_records"] == {}


@pytest.mark.parametrize("command", ["stats", "pack"])
@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("form", list(TYPOS))
def test_a_typo_in_each_form_is_one_line_naming_file_record_field_and_fix(tmp_path, capsys, form, suffix, command):
    path = write(tmp_path / f"d{suffix}", with_typo(form))
    argv = ["--data", str(path)] if command == "stats" else [str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main([command, *argv, "--max-length", "256"]) == 2
    err = capsys.readouterr().err.strip()
    where = "record 2" if suffix == ".json" else "line 2"
    assert len(err.splitlines()) == 1 and err.startswith(f"padless {command}: error: {path}, {where}: "), err
    assert all(part in err for part in TYPOS[form][1]), err


@pytest.mark.parametrize("command", ["stats", "pack"])
def test_on_error_skip_counts_bad_records_and_names_the_first(tmp_path, capsys, command):
    rows = [*FORMS["sharegpt"], TYPOS["sharegpt"][0], TYPOS["sharegpt"][0], {"conversations": {"from": "human"}}]
    path = write(tmp_path / "d.jsonl", rows)
    argv = ["--data", str(path)] if command == "stats" else [str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main([command, *argv, "--max-length", "256", "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"skipped 3 bad records( of 6)? \(--on-error skip\): bad_messages 1, unknown_role 2", out), out
    named = [line.strip() for line in out.splitlines() if line.startswith(f"  {path}, line ")]
    assert [n.split(":")[0] for n in named] == [f"{path}, line {k}" for k in (4, 5, 6)], out
    assert "3 sequences" in out


def test_columns_map_other_field_names_on_both_commands(tmp_path, capsys):
    path = write(
        tmp_path / "qa.jsonl", [{"question": "Add 2 and 3.", "answer": "5"}, {"question": "Hi", "answer": "Hello"}]
    )
    assert main(["stats", "--data", str(path), "--max-length", "64"]) == 2
    assert "--columns text=NAME" in capsys.readouterr().err
    flags = ["--columns", "instruction=question", "--columns", "output=answer"]
    assert main(["stats", "--data", str(path), "--max-length", "64", *flags]) == 0
    out = capsys.readouterr().out
    assert f"format: {FORMATS['alpaca']}" in out and "2 sequences" in out
    assert main(["pack", str(path), "--out", str(tmp_path / "o"), "--max-length", "64", "--no-progress", *flags]) == 0
    assert "packed 2 sequences" in capsys.readouterr().out
    assert main(["stats", "--data", str(path), "--max-length", "64", "--columns", "instrution=question"]) == 2
    assert "--columns: 'instrution' is not a field padless reads" in capsys.readouterr().err


def test_the_overlong_refusal_of_stats_names_the_first_overlong_record(tmp_path, capsys):
    path = write(tmp_path / "d.jsonl", [{"text": "hello"}, {"text": "word " * 100}, {"text": "word " * 90}])
    assert main(["stats", "--data", str(path), "--max-length", "64", "--overlong", "error"]) == 2
    err = capsys.readouterr().err
    from padless.data.load import load_corpus

    said = re.search(
        rf"2 sequences are over --max-length 64 \(the first: {re.escape(str(path))}, line 2, (\d+) tokens\)", err
    )
    assert said is not None, err
    assert int(said.group(1)) == load_corpus(path, "gpt2").lengths[1]


def test_pack_counts_rows_skipped_while_reading_a_csv(tmp_path, capsys):
    """A CSV cell that is not JSON is skipped when the file is read, before any shard: still counted and named."""
    chat = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    path = tmp_path / "c.csv"
    path.write_text("messages\n" + '"' + chat.replace('"', '""') + '"\n' + '"not json"\n')
    argv = [
        "pack",
        str(path),
        "--out",
        str(tmp_path / "o"),
        "--max-length",
        "64",
        "--no-progress",
        "--on-error",
        "skip",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "skipped 1 bad record (--on-error skip): bad_json 1" in out, out
    assert f"  {path}, line 3: field 'messages' is a string that is not JSON" in out, out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["skipped_records"] == {"bad_json": 1} and summary["stats"]["num_sequences"] == 1
