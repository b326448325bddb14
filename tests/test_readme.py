"""The README's own-data walkthrough runs as written: its two ```python blocks, in order, as one script
in a scratch directory (the packaged SmolLM2, LoRA, two steps each), and every record of its ```json
block loads as the format it shows."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import integrations_support as support  # noqa: E402

README = (support.ROOT / "README.md").read_text()
WALKTHROUGH = README.split("## Fine-tune on your own data", 1)[1].split("\n## ", 1)[0]


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", WALKTHROUGH, flags=re.S | re.M)


def test_the_walkthrough_comes_first():
    """The own-data example starts within the README's first 60 lines, right after the set-up."""
    start = README.splitlines().index("## Fine-tune on your own data")
    setup = README.splitlines().index("## Set-up: two commands")
    assert setup < start < 60
    assert len(blocks("python")) == 2


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_the_walkthrough_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    support.offline_hub()
    monkeypatch.chdir(tmp_path)
    source = "\n".join(blocks("python"))
    assert '"smollm2-135m"' in source and "LoraConfig" in source and "with_lora" in source
    exec(compile(source, "README.md", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert re.search(r"^2 steps$", out, flags=re.M), out
    assert re.search(r"^step 2: loss \d+\.\d+$", out, flags=re.M), out
    written = [json.loads(line) for line in (tmp_path / "chats.jsonl").read_text().splitlines()]
    assert len(written) == 16 and all(set(r) == {"messages"} for r in written)


@pytest.mark.parametrize("line", blocks("json")[0].splitlines())
def test_each_shown_record_loads(line, tmp_path):
    import padless

    path = tmp_path / "one.jsonl"
    path.write_text(line + "\n")
    corpus = padless.load_corpus(path, "gpt2", cache=False)
    assert len(corpus.input_ids) == 1
    record = json.loads(line)
    if "input_ids" in record:  # pre-tokenized ids are taken as given
        assert corpus.input_ids[0] == record["input_ids"] and corpus.labels[0] == record["labels"]
