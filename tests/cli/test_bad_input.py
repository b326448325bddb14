"""Every bad input to the CLI: one line naming the problem, a non-zero exit, no traceback, nothing written.

Each row of :data:`CASES` is ``(id, argv, files to create, exit status, regex of the one-line message)``.
``{tmp}`` in argv is the test's folder; a file's content is text or a function that writes the path.
Every row also checks that the outputs it names (``OUT`` below) are not left behind. Most rows run
in-process through ``padless.cli.main``; a few run ``python -m padless`` to see a real process's output
(tracebacks, Ctrl-C).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import row_documents
from padless.cli import COMMANDS, main, plain

SRC = Path(__file__).resolve().parents[2] / "src"
OUT = ("out", "o.npz", "bench")  # names under {tmp} that a failed command must not create


def _parquet(rows: list[list[int]]):
    def write(path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"input_ids": rows}), path)

    return write


def _npy_empty(path: Path) -> None:
    np.save(path, np.zeros(0, dtype=np.int64))


CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
BAD_IDS = [1, 2, 99999999]
VOCAB = r"token id 99999999 is outside the vocabulary \[0, 50257\).*--vocab-size or --tokenizer"

CASES = [
    # pre-tokenized data: one rule (ids checked against the vocabulary) in every format
    ("ids-jsonl", ["pack", "{tmp}/d.jsonl"], {"d.jsonl": json.dumps({"input_ids": BAD_IDS})}, 2, VOCAB),
    ("ids-json", ["pack", "{tmp}/d.json"], {"d.json": json.dumps([{"input_ids": BAD_IDS}])}, 2, VOCAB),
    ("ids-csv", ["pack", "{tmp}/d.csv"], {"d.csv": 'input_ids\n"[1, 2, 99999999]"\n'}, 2, VOCAB),
    ("ids-parquet", ["pack", "{tmp}/d.parquet"], {"d.parquet": _parquet([BAD_IDS])}, 2, VOCAB),
    ("null-ids", ["pack", "{tmp}/d.jsonl"], {"d.jsonl": '{"input_ids": null}\n'}, 2, r"input_ids is null"),
    ("null-parquet", ["pack", "{tmp}/d.parquet"], {"d.parquet": _parquet([[1, 2], None])}, 2, r"null list"),
    (
        "label-negative",
        ["pack", "{tmp}/d.jsonl"],
        {"d.jsonl": json.dumps({"input_ids": [1, 2], "labels": [-5, 2]})},
        2,
        r"label -5 .*neither -100",
    ),
    (
        "label-past-vocab",
        ["pack", "{tmp}/d.jsonl"],
        {"d.jsonl": json.dumps({"input_ids": [1, 2], "labels": [1, 60000]})},
        2,
        r"label 60000 .*\[0, 50257\)",
    ),
    (
        "readme-in-folder",
        ["pack", "{tmp}/dir"],
        {"dir/a.jsonl": '{"text": "hi"}\n', "dir/README.txt": "notes"},
        2,
        r"holds files that are not data \(README\.txt\)",
    ),
    # output places
    ("out-empty", ["pack", "{tmp}/d.jsonl", "--out", ""], {"d.jsonl": '{"input_ids": [1]}\n'}, 2, r"--out is empty"),
    (
        "out-is-file",
        ["pack", "{tmp}/d.jsonl", "--out", "{tmp}/d.jsonl"],
        {"d.jsonl": '{"input_ids": [1]}\n'},
        2,
        r"--out .*d\.jsonl is a file, not a folder",
    ),
    (
        "out-under-file",
        ["pack", "{tmp}/d.jsonl", "--out", "{tmp}/d.jsonl/out"],
        {"d.jsonl": '{"input_ids": [1]}\n'},
        2,
        r"Not a directory: .*d\.jsonl/out \(a path component is a file",
    ),
    # sizes and numbers
    (
        "huge-max-length",
        ["pack", "{tmp}/d.jsonl", "--max-length", "2000000000"],
        {"d.jsonl": '{"input_ids": [1]}\n'},
        2,
        r"--max-length 2000000000 is above 16777216 tokens per row",
    ),
    (
        "int-overflow",
        ["stats", "--max-length", "99999999999999999999"],
        {},
        2,
        r"argument --max-length: must be between 1 and 2,147,483,647",
    ),
    (
        "json-huge-int",
        ["stats", "--lengths", "{tmp}/l.json"],
        {"l.json": "[3, 99999999999999999999999]"},
        2,
        r"does not fit in 64 bits",
    ),
    ("json-broken", ["stats", "--lengths", "{tmp}/l.json"], {"l.json": "[3, 4"}, 2, r"l\.json is not valid JSON"),
    (
        "npy-empty",
        ["stats", "--lengths", "{tmp}/l.npy"],
        {"l.npy": _npy_empty},
        2,
        r"--lengths: .*l\.npy holds no lengths",
    ),
    ("npy-broken", ["stats", "--lengths", "{tmp}/l.npy"], {"l.npy": "not numpy"}, 2, r"not a readable \.npy"),
    # silent nonsense that is now refused
    (
        "stats-data-unknown-offline",
        ["stats", "--data", "no-such-dataset"],
        {},
        2,
        r"not a built-in corpus \(tweets, .*the model hub cannot be reached",
    ),
    ("stats-data-empty", ["stats", "--data", ""], {}, 2, r"--data needs a corpus name or a data file, got ''"),
    # an unknown --model is named as a model (with the built-in model names), not as an unknown tokenizer
    (
        "stats-model-unknown",
        ["stats", "--data", "{tmp}/t.jsonl", "--model", "no-such-model"],
        {"t.jsonl": '{"text": "hi"}\n'},
        2,
        r"--model no-such-model: unknown model 'no-such-model': .*tiny-qwen2-vl",
    ),
    ("stats-lengths-empty", ["stats", "--lengths", ""], {}, 2, r"--lengths needs a file name"),
    ("plan-no-source", ["plan", "--out", "{tmp}/o.npz"], {}, 2, r"no lengths given: pass --lengths FILE, --data"),
    ("verify-negative-length", ["verify", "--max-length", "-5"], {}, 2, r"--max-length must be >= 1 \(or 0"),
    ("verify-bad-lengths", ["verify", "--lengths", "3,x"], {}, 2, r"--lengths must be comma-separated integers"),
    ("verify-empty-lengths", ["verify", "--lengths", ""], {}, 2, r"--lengths must be positive integers, got ''"),
    ("verify-no-backends", ["verify", "--backends", ","], {}, 2, r"--backends names no backend"),
    (
        "verify-past-positions",
        ["verify", "--lengths", "600", "--backends", "eager"],
        {},
        2,
        r"rows of 600 tokens exceed the model's 512 positions",
    ),
    ("verify-bad-device", ["verify", "--device", "gpu0"], {}, 2, r"--device 'gpu0' is not a device name"),
    ("bench-grad-accumulation-0", ["bench", "--grad-accumulation", "0"], {}, 2, r"--grad-accumulation 0 must be >= 1"),
    ("bench-steps-0", ["bench", "--steps", "0"], {}, 2, r"--steps 0 must be >= 1"),
    (
        "bench-warmup-past-run",
        ["bench", "--steps", "5", "--warmup-steps", "5"],
        {},
        2,
        r"--warmup-steps 5 must be >= 0 and less than --steps 5",
    ),
    # names
    ("model-renamed", ["verify", "--model", "gpt2-tiny"], {}, 2, r"'gpt2-tiny' is now called 'gpt2-2layer'"),
    (
        "model-unknown-path",
        ["verify", "--model", "./no/such/model"],
        {},
        2,
        r"no such folder; a model name is one of the built-in names \(tiny-gpt2, .*gpt2-2layer",
    ),
    (
        "tokenizer-and-model-disagree",
        ["stats", "--data", "{tmp}/c.jsonl", "--tokenizer", "gpt2", "--model", "smollm2-135m"],
        {"c.jsonl": CHAT},
        2,
        r"--tokenizer gpt2 is not the tokenizer of --model smollm2-135m \(smollm2-135m\); pass one of them",
    ),
    (
        "model-without-tokenizer",
        ["pack", "{tmp}/c.jsonl", "--model", "tiny-gpt2"],
        {"c.jsonl": CHAT},
        2,
        r"--model tiny-gpt2: 'tiny-gpt2' has a 512-token test vocabulary and no tokenizer",
    ),
    (
        "tokenizer-without-data",
        ["stats", "--tokenizer", "smollm2-135m"],
        {},
        2,
        r"--tokenizer applies to --data \(the data to tokenize\), not to --lengths or --dist",
    ),
    (
        "tokenizer-with-synthetic",
        ["pack", "--synthetic", "lognormal:10", "--model", "smollm2-135m"],
        {},
        2,
        r"--model applies to an INPUT to tokenize; --synthetic draws random token ids",
    ),
    (
        "train-on-pretokenized",
        ["pack", "{tmp}/d.jsonl", "--train-on", "assistant"],
        {"d.jsonl": '{"input_ids": [1]}\n'},
        2,
        r"--train-on assistant applies to text and chats; pre-tokenized records \('input_ids'\) are trained as their",
    ),
    (
        "train-on-assistant-text",
        ["stats", "--data", "{tmp}/t.jsonl", "--train-on", "assistant"],
        {"t.jsonl": '{"text": "hi"}\n'},
        2,
        r"t\.jsonl.*line 1 is plain text; --train-on 'assistant' needs chats",
    ),
    (
        "system-prompt-text",
        ["pack", "{tmp}/t.jsonl", "--system-prompt", "none"],
        {"t.jsonl": '{"text": "hi"}\n'},
        2,
        r"--system-prompt none applies to chats; .*t\.jsonl holds text",
    ),
    # one overlong default (error) in plan and pack: refused with the count and the flag that changes it;
    # stats reports (it splits by default) and refuses only when told --overlong error
    (
        "stats-overlong-error",
        ["stats", "--lengths", "{tmp}/l.txt", "--max-length", "16", "--overlong", "error"],
        {"l.txt": "30\n2\n45\n"},
        2,
        r"2 sequences are over --max-length 16 and --overlong is error; pass --overlong truncate",
    ),
    (
        "plan-overlong-default",
        ["plan", "--lengths", "{tmp}/l.txt", "--max-length", "16", "--out", "{tmp}/o.npz"],
        {"l.txt": "30\n2\n"},
        2,
        r"1 sequence is over --max-length 16 and --overlong is error \(the default\)",
    ),
    (
        "pack-overlong-default",
        ["pack", "{tmp}/d.jsonl", "--max-length", "2"],
        {"d.jsonl": '{"input_ids": [1, 2, 3]}\n'},
        2,
        r"d\.jsonl, line 1 has length 3, longer than --max-length 2; choose --overlong 'truncate', 'split' or 'drop'",
    ),
    (
        "pack-overlong-line-number",
        ["pack", "{tmp}/d.jsonl", "--max-length", "2"],
        {"d.jsonl": '{"input_ids": [1]}\n\n{"input_ids": [1, 2, 3]}\n'},
        2,
        r"d\.jsonl, line 3 has length 3",
    ),
    (
        "pack-foreign-folder",
        ["pack", "{tmp}/d.jsonl", "--out", "{tmp}/mine"],
        {"d.jsonl": '{"input_ids": [1]}\n', "mine/notes.txt": "x"},
        2,
        r"--out .*mine is not empty and has no state\.json, so padless pack did not write it \(it holds notes\.txt\); "
        r"choose a new or empty folder, or --overwrite",
    ),
    (
        "tokenizer-unknown-path",
        ["pack", "{tmp}/t.jsonl", "--tokenizer", "/no/such/tok"],
        {"t.jsonl": '{"text": "hi"}\n'},
        2,
        r"tokenizer '/no/such/tok': no such folder",
    ),
]


def _make(tmp: Path, files: dict) -> None:
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        else:
            path.write_text(content)


def _argv(argv: list[str], tmp: Path) -> list[str]:
    args = [a.replace("{tmp}", str(tmp)) for a in argv]
    if args[0] == "pack":
        args += [a for a in ("--out", str(tmp / "out")) if "--out" not in args]
        args += ["--max-length", "16"] if "--max-length" not in args else []
        args += ["--no-progress"]
    if args[0] == "bench":
        args += ["--out", str(tmp / "bench"), "--no-progress"]
    return args


@pytest.mark.parametrize(("argv", "files", "status", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, argv, files, status, message):
    monkeypatch.setenv("PADLESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("padless.hub.hub_reachable", lambda timeout=None: False)  # as offline, on any machine
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the unreachable hub, not the env flag a trainer test set
    _make(tmp_path, files)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(_argv(argv, tmp_path)) == status
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.out + captured.err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"padless {argv[0]}: error: ") and re.search(message, err), err
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "cache")
    assert after == [b for b in before if b != "cache"] and not any((tmp_path / o).exists() for o in OUT)


@pytest.mark.skipif("torch" in sys.modules and __import__("torch").cuda.is_available(), reason="has a GPU")
def test_verify_on_a_cuda_device_without_one(capsys):
    assert main(["verify", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device 'cuda': this machine has no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_pretokenized_formats_pack_alike_without_eos(tmp_path):
    """The same ids as .jsonl, .json, .csv and .parquet give byte-identical shards, packed as given."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50257, int(n)).tolist() for n in rng.integers(1, 30, 40)]
    recs = [{"input_ids": s} for s in seqs]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "d.json").write_text(json.dumps(recs))
    (tmp_path / "d.csv").write_text("input_ids\n" + "".join(f'"{s}"\n' for s in seqs))
    _parquet(seqs)(tmp_path / "d.parquet")
    shards = {}
    for fmt in ("jsonl", "json", "csv", "parquet"):
        out = tmp_path / f"out-{fmt}"
        assert main(["pack", str(tmp_path / f"d.{fmt}"), "--out", str(out), "--max-length", "64", "--no-progress"]) == 0
        shards[fmt] = (out / "shard-00000.parquet").read_bytes()
        rows = pq.read_table(out / "shard-00000.parquet").to_pylist()
        assert sorted(row_documents(rows)) == sorted(seqs)  # nothing appended, nothing lost
    assert len(set(shards.values())) == 1, "the file format changed the packed rows"
    # a bigger vocabulary, given explicitly, lets ids past GPT-2's through
    (tmp_path / "big.jsonl").write_text(json.dumps({"input_ids": [1, 99999999]}) + "\n")
    argv = ["pack", str(tmp_path / "big.jsonl"), "--max-length", "8", "--no-progress", "--vocab-size", "100000000"]
    assert main([*argv, "--out", str(tmp_path / "big")]) == 0


def test_stats_reports_overlong_sequences_and_what_each_policy_costs(tmp_path, capsys):
    from padless.planning.lengths import overlong_costs

    lengths = [30, 2, 17, 8, 45]
    path = tmp_path / "l.txt"
    path.write_text("\n".join(map(str, lengths)))
    argv = ["stats", "--lengths", str(path), "--max-length", "16"]
    assert main([*argv, "--overlong", "truncate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    over = [n for n in lengths if n > 16]
    assert doc["overlong"]["policy_used"] == "truncate" and doc["overlong"]["overlong"]["sequences"] == len(over)
    assert doc["overlong"]["truncate"]["tokens_lost"] == sum(n - 16 for n in over)
    assert doc["overlong"]["split"]["pieces"] == sum(-(-n // 16) for n in over)
    assert doc["overlong"]["drop"]["tokens_lost"] == sum(over)
    assert doc["plan"]["truncated_sequences"] == len(over)
    assert main([*argv, "--overlong", "split"]) == 0
    text = capsys.readouterr().out
    assert "overlong: split (3 sequences over --max-length 16; pass --overlong error|truncate|drop)" in text
    assert "split: 7 pieces" in text and "plan: best_fit_decreasing, max_length 16, overlong split" in text
    assert overlong_costs([5, 6], 16)["overlong"] == {"sequences": 0, "tokens": 0}
    # stats' default reports rather than stops: it splits (every token kept) and says that packing would not
    assert main(argv) == 0
    default = capsys.readouterr().out
    assert "overlong: split (3 sequences over --max-length 16" in default and "split is stats' default" in default
    assert "the same 102 tokens, overlong split for every way" in default
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overlong"]["policy_used"] == "split" and doc["overlong"]["policy_given"] is False
    # --overlong error, as packing by default: what is known is printed, then the plan is refused
    assert main([*argv, "--overlong", "error"]) == 2
    captured = capsys.readouterr()
    assert "overlong: error (3 sequences over --max-length 16; pass --overlong truncate|split|drop)" in captured.out
    assert "lengths: file l.txt" in captured.out and "plan:" not in captured.out
    assert captured.err.strip() == (
        "padless stats: error: 3 sequences are over --max-length 16 and --overlong is "
        "error; pass --overlong truncate, split or drop to plan them, or a larger --max-length"
    )
    assert main([*argv, "--overlong", "error", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"] is None and doc["overlong"]["policy_used"] == "error"


def test_stats_hist_prints_the_file_it_wrote(tmp_path, capsys):
    name = tmp_path / "name"
    assert main(["stats", "--num", "200", "--hist", str(name)]) == 0
    assert (tmp_path / "name.png").is_file() and not name.exists()
    assert f"histogram: {name}.png" in capsys.readouterr().out
    assert main(["stats", "--num", "200", "--hist", str(tmp_path / "h.svg")]) == 0
    assert (tmp_path / "h.svg").read_text().lstrip().startswith("<?xml")


def _tiny_bloom(path: Path) -> None:
    from transformers import AutoModelForCausalLM, BloomConfig

    AutoModelForCausalLM.from_config(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2)).save_pretrained(
        path
    )


def test_verify_exit_status_tells_nothing_ran_from_contaminated(tmp_path, capsys, monkeypatch):
    import padless.cli.verify as cli_verify
    from padless.isolation.verify import BackendResult, VerifyReport

    _tiny_bloom(tmp_path / "bloom")
    assert main(["verify", "--model", str(tmp_path / "bloom")]) == cli_verify.EXIT_NOTHING_RAN == 3
    out = capsys.readouterr().out
    assert "NOTHING RAN" in out and "takes no position_ids" in out and "scaled_dot_product" not in out

    def fake(model, sequences, **kw):  # a backend that ran and was contaminated
        return VerifyReport(
            "m",
            "float32",
            "cpu",
            [3],
            32,
            [BackendResult("sdpa", "fail", 1.0, 1e-5, 0.0, 1e-5), BackendResult("eager", "refused", detail="x")],
        )

    monkeypatch.setattr(cli_verify, "verify_isolation", fake)
    assert main(["verify"]) == cli_verify.EXIT_CONTAMINATED == 1
    assert "FAIL: packed rows are contaminated or train differently on sdpa" in capsys.readouterr().out
    assert main(["verify", "--help"]) == 0
    assert "3  NOTHING RAN" in capsys.readouterr().out


def test_help_is_plain_text(capsys):
    for command in COMMANDS:
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert not re.search(r"``|:(func|class|mod|meth|data|attr):", text), command
    assert main(["--help"]) == 0
    assert "``" not in capsys.readouterr().out
    assert plain(":func:`padless.plan_packs` and ``x``") == "padless.plan_packs and x"


def test_library_errors_name_arguments_not_flags():
    """Raise statements outside cli/ never word a message with a command-line flag (``--max-length``)."""
    flag = re.compile(r"(^|[\s(])--[a-z]")
    owned_elsewhere = {"bench/run.py"}  # the bench's own messages are being regenerated with its flags
    found = []
    for path in (SRC / "padless").rglob("*.py"):
        rel = path.relative_to(SRC / "padless").as_posix()
        if rel.startswith("cli/") or rel in owned_elsewhere:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = "".join(
                    c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
                text = re.sub(r"`[^`]*`", "", text)  # a quoted shell command may carry flags
                if flag.search(text):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, found


def test_unknown_hub_name_offline_asks_only_the_disk(monkeypatch):
    """Offline, an unknown name is looked up in the local cache only (no network retries) and the error
    lists the built-in names and how to pass a folder."""
    import padless.hub as hub

    calls = []

    def load(name, **kw):
        calls.append(kw)
        raise OSError("not cached")

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=hub.CONNECT_TIMEOUT_S: False)
    with pytest.raises(ValueError, match=r"unknown model 'org/none'.*cannot be reached; .*\(a, b\).*local folder"):
        hub.from_pretrained(load, "org/none", "model", ["a", "b"])
    assert calls == [{"local_files_only": True}]
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=hub.CONNECT_TIMEOUT_S: True)
    assert hub.from_pretrained(lambda name, **kw: (name, kw), "org/model", "model", ["a"]) == (
        "org/model",
        {"local_files_only": True},
    )


def _run(*argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "padless", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_a_real_process_prints_one_line_not_a_traceback(tmp_path):
    _npy_empty(tmp_path / "l.npy")
    proc = _run("stats", "--lengths", str(tmp_path / "l.npy"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in out + err
    assert err.strip().splitlines() == [f"padless stats: error: {err.strip().split('error: ', 1)[1]}"]


def test_ctrl_c_during_pack_says_rerun_and_the_rerun_finishes_identically(tmp_path):
    args = [
        "--synthetic",
        "lognormal:8000",
        "--max-length",
        "512",
        "--overlong",
        "split",
        "--rows-per-shard",
        "25",
        "--no-progress",
    ]
    out, ref = tmp_path / "out", tmp_path / "ref"
    proc = _run("pack", *args, "--out", str(out))
    deadline = time.monotonic() + 120
    while not (out / "state.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the packing finished before the signal arrived")
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr
    assert stderr.strip() == "padless pack: interrupted, rerun to resume (finished shards are kept)"
    assert main(["pack", *args, "--out", str(out)]) == 0
    assert main(["pack", *args, "--out", str(ref)]) == 0
    got, want = sorted(out.glob("shard-*.parquet")), sorted(ref.glob("shard-*.parquet"))
    assert [p.name for p in got] == [p.name for p in want]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(got, want))


def test_an_out_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only place (simulated: the tests may run as root, who can write anywhere)."""
    import errno

    def refuse(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
    argv = [
        "pack",
        str(tmp_path / "d.jsonl"),
        "--out",
        str(tmp_path / "ro" / "out"),
        "--max-length",
        "8",
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.fullmatch(r"padless pack: error: Permission denied: .*ro/out \(no permission: choose a folder .*\)", err)


def test_a_deprecated_strategy_says_so_and_plans_as_its_replacement(capsys):
    argv = ["stats", "--num", "300", "--max-length", "64", "--overlong", "split", "--json"]
    assert main([*argv, "--strategy", "best_fit_decreasing"]) == 0
    replacement = capsys.readouterr()
    assert main([*argv, "--strategy", "first_fit_decreasing"]) == 0
    deprecated = capsys.readouterr()
    assert deprecated.out == replacement.out  # the same plan, recorded under the name it planned as
    assert json.loads(deprecated.out)["plan"]["strategy"] == "best_fit_decreasing"
    assert deprecated.err.splitlines() == [
        "padless: warning: --strategy first_fit_decreasing is deprecated: it plans as best_fit_decreasing; "
        "pass --strategy best_fit_decreasing"
    ]
    assert replacement.err == ""
