"""Every form of record padless reads trains through padless' SFTTrainer (one step, tiny GPT-2): Alpaca,
ShareGPT, TRL's prompt / completion (text and conversational) and chats, from a list of records and from
``load_dataset("json")`` (whose chat columns are typed Json). The trainer trains what load_corpus gives
(padless renders the records), a typo in each is named before TRL reads the data, and the README's
tool-call chats, which TRL's own chat template cannot render, train."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402
from formats_support import FORMS, TYPOS, with_typo, write  # noqa: E402

pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(autouse=True, scope="module")
def _offline():
    support.offline_hub()


@pytest.fixture(scope="module")
def gpt2():
    return support.model("sdpa")


def config(tmp_path, **kw):
    import trl

    return trl.SFTConfig(output_dir=str(tmp_path), max_length=support.MAX_LENGTH, per_device_train_batch_size=2,
                         max_steps=1, report_to="none", use_cpu=True, bf16=False, **kw)  # fmt: skip


def json_dataset(path: Path, cache: Path):
    from datasets import load_dataset

    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))


@pytest.mark.parametrize("source", ["list", "load_dataset"])
@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_trains_what_load_corpus_gives(tmp_path, gpt2, form, source):
    from padless.data.load import load_corpus
    from padless.integrations.sft_records import sft_train_on
    from padless.integrations.trl import SFTTrainer

    path = write(tmp_path / "d.jsonl", FORMS[form])
    data = FORMS[form] if source == "list" else json_dataset(path, tmp_path / "ds")
    args = config(tmp_path, packing=True)
    trainer = SFTTrainer(model=gpt2, args=args, train_dataset=data, processing_class=support.tokenizer())
    want = load_corpus(path, support.tokenizer(), train_on=sft_train_on(form, args), cache=False)
    assert trainer.train_dataset["input_ids"] == want.input_ids
    assert trainer.train_dataset["labels"] == want.labels
    assert math.isfinite(trainer.train().training_loss)


def test_padded_batches_take_padless_rendering_too(tmp_path, gpt2):
    """Without packing, TRL's padded batches train the rendered records: a chat trains every token, as in TRL."""
    from padless.data.load import load_corpus
    from padless.integrations.trl import SFTTrainer

    path = write(tmp_path / "d.jsonl", FORMS["sharegpt"])
    trainer = SFTTrainer(model=gpt2, args=config(tmp_path), train_dataset=FORMS["sharegpt"],
                         processing_class=support.tokenizer())  # fmt: skip
    assert trainer.train_dataset["labels"] == load_corpus(path, support.tokenizer(), train_on="all").labels
    assert math.isfinite(trainer.train().training_loss)


@pytest.mark.parametrize("source", ["list", "load_dataset"])
@pytest.mark.parametrize("form", list(TYPOS))
def test_a_typo_in_each_form_is_named_before_trl_reads_the_data(tmp_path, gpt2, form, source):
    from padless.data.records import RecordError
    from padless.integrations.trl import SFTTrainer

    rows = with_typo(form)
    data = rows if source == "list" else json_dataset(write(tmp_path / "d.jsonl", rows), tmp_path / "ds")
    with pytest.raises(RecordError) as refused:
        SFTTrainer(model=gpt2, args=config(tmp_path), train_dataset=data, processing_class=support.tokenizer())
    message = str(refused.value)
    assert message.startswith("train_dataset: record 2: "), message
    for part in TYPOS[form][1]:  # the fix for another field name: the dataset's own rename, not --columns
        fix = re.match(r"--columns (\w+)=NAME", part)
        assert (f"Dataset.rename_column(FIELD, {fix.group(1)!r})" if fix else part) in message, message


def test_the_readme_tool_call_chats_train_from_a_dataset_and_from_json(tmp_path, gpt2):
    """The README's chats (an assistant turn with tool_calls and no content): TRL's chat template fails on
    them ("'dict object' has no attribute 'content'"); load_dataset("json") types them List(Json), which
    padless reads decoded (not "message 0 is a str")."""
    import json

    from datasets import Dataset

    from padless.data.tokenizer import load_tokenizer
    from padless.integrations.trl import SFTTrainer

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"weather = (\[.*?\])\ncapital = (\[.*?\])\n", readme, re.S)
    assert block is not None
    weather, capital = (eval(block.group(k)) for k in (1, 2))  # the README's literals, as written
    assert "content" not in weather[1] and "tool_calls" in weather[1]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in [weather, capital] * 4))
    smol = load_tokenizer("smollm2-135m")  # the README's tokenizer and chat template; ids fit GPT-2's vocabulary
    listed = Dataset.from_list([{"messages": m} for m in [weather, capital] * 4])
    for data in (listed, json_dataset(path, tmp_path / "ds")):
        trainer = SFTTrainer(model=gpt2, args=config(tmp_path, packing=True), train_dataset=data, processing_class=smol)
        text = smol.decode(trainer.train_dataset[0]["input_ids"])
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
        assert math.isfinite(trainer.train().training_loss)
