"""The model factory: config-built models by name, tokenizer mapping, the packaged pretrained SmolLM2."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from padless.models import factory as models
from padless.models.factory import GPT2_SIZES, build_model, load_tokenizer_for, smollm2_dir, tokenizer_name_for

SENTENCE = "The capital of France is Paris. The capital of Germany is Berlin."


@pytest.mark.parametrize(
    ("name", "vocab", "model_type"),
    [
        ("tiny-gpt2", 512, "gpt2"),
        ("tiny-llama", 512, "llama"),
        ("tiny-qwen2", 512, "qwen2"),
        ("tiny-mistral", 512, "mistral"),
        ("gpt2-2layer", 50257, "gpt2"),
    ],
)
def test_config_built_models(name: str, vocab: int, model_type: str) -> None:
    model = build_model(name)
    assert model.config.model_type == model_type and model.config.vocab_size == vocab
    assert model.config.use_cache is False
    assert model.config._attn_implementation == "sdpa"


def test_seed_decides_the_weights() -> None:
    a, b, c = build_model("tiny-llama", seed=1), build_model("tiny-llama", seed=1), build_model("tiny-llama", seed=2)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_vocab_size_override() -> None:
    assert build_model("tiny-gpt2", vocab_size=50257).config.vocab_size == 50257


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: models.gpt2_config("gpt2-huge"), "unknown GPT-2 size 'gpt2-huge'"),
        (lambda: build_model("tiny-phi"), "unknown tiny family 'phi'"),
        (lambda: build_model("smollm2-135m", vocab_size=100), "vocab_size=100 cannot be set for the pretrained"),
        (lambda: build_model("tiny-gpt2", cache_dir="/tmp/x"), "cache_dir applies to the packaged models"),
    ],
)
def test_bad_names_and_flags(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("model", "tokenizer"),
    [*[(size, "gpt2") for size in GPT2_SIZES], ("smollm2-135m", "smollm2"), ("org/some-model", "org/some-model")],
)
def test_tokenizer_names(model: str, tokenizer: str) -> None:
    assert tokenizer_name_for(model) == tokenizer


def test_tiny_models_have_no_tokenizer() -> None:
    with pytest.raises(ValueError, match="vocab_size=50257 to use the 'gpt2' tokenizer"):
        tokenizer_name_for("tiny-gpt2")


def test_gpt2_sizes_match_the_gpt2_tokenizer() -> None:
    assert len(load_tokenizer_for("gpt2-mini")) == models.gpt2_config("gpt2-mini").vocab_size


@cache
def smollm2() -> Any:
    return build_model("smollm2-135m")  # the first run writes the checkpoint from the GGUF (~20-30 s)


def test_smollm2_is_a_real_pretrained_model() -> None:
    model, tok = smollm2(), load_tokenizer_for("smollm2-135m")
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size == len(tok) == 49152
    assert model.config.use_cache is False and model.config._attn_implementation == "sdpa"
    assert getattr(model.config, "quantization_config", None) is None
    ids = tok(SENTENCE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 3.5  # an untrained model scores about ln(49152) = 10.8
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        next_id = model(input_ids=ids).logits[0, -1].argmax().item()
    assert tok.decode([next_id]).strip() == "Paris"


def test_smollm2_checkpoint_is_a_complete_folder() -> None:
    folder = smollm2_dir()
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names


def test_cache_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = smollm2_dir()
    mine = tmp_path / "smol"
    mine.mkdir()
    for p in default.iterdir():
        (mine / p.name).symlink_to(p)
    model = build_model("smollm2-135m", cache_dir=mine)
    assert model.config.num_hidden_layers == 30
    written: list[Path] = []
    monkeypatch.setattr(models, "_write_smollm2", written.append)
    assert smollm2_dir(tmp_path / "absent") == tmp_path / "absent" and written == [tmp_path / "absent"]


@pytest.mark.slow
def test_the_conversion_checks_the_checkpoint_it_writes(tmp_path: Path) -> None:
    """The GGUF oracle runs where the checkpoint is written (set-up converts it once): a saved folder
    with exactly the reference's logits passes, one weight off by one ulp is refused."""
    from padless.models.factory import check_checkpoint

    model = build_model("tiny-llama")
    model.save_pretrained(str(tmp_path / "same"))
    check_checkpoint(model, tmp_path / "same", [1, 5, 9, 2])
    with torch.no_grad():
        weight = model.lm_head.weight  # row 0 scores token 0 at every position
        weight[0] = torch.nextafter(weight[0], torch.tensor(float("inf")))
    model.save_pretrained(str(tmp_path / "off"))
    with torch.no_grad():
        weight[0] = torch.nextafter(weight[0], torch.tensor(float("-inf")))
    with pytest.raises(RuntimeError, match="gives other logits than the model it was converted from"):
        check_checkpoint(model, tmp_path / "off", [1, 5, 9, 2])


def test_renamed_and_unknown_names_say_what_to_use() -> None:
    from padless.models.factory import builtin_models

    for call in (
        lambda: build_model("gpt2-tiny"),
        lambda: models.model_config("gpt2-tiny"),
        lambda: load_tokenizer_for("gpt2-tiny"),
    ):
        with pytest.raises(ValueError, match="'gpt2-tiny' is now called 'gpt2-2layer'"):
            call()
    assert "gpt2-2layer" in builtin_models() and "tiny-gpt2" in builtin_models() and "gpt2-tiny" not in builtin_models()
    assert build_model("gpt2-2layer").config.vocab_size == 50257 and build_model("tiny-gpt2").config.vocab_size == 512
    with pytest.raises(ValueError, match=r"no such folder; a model name is one of the built-in names \(tiny-gpt2"):
        build_model("./no/such/model")


@pytest.mark.parametrize("where", ["HF_HUB_OFFLINE=1", "no hub cache"])
def test_an_unknown_name_fails_without_any_network_call(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hub request at all, not even the adapter lookup transformers makes: offline, or on a machine
    that never used the hub (an empty HF_HOME), an unknown name fails at once, naming the built-in models."""
    import socket

    import padless.hub as hub

    attempts: list[Any] = []

    def no_network(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)  # recorded too, in case a library swallows the error
        raise AssertionError(f"a network call was attempted: {args} {kwargs}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(hub, "hub_reachable", no_network)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    if where == "HF_HUB_OFFLINE=1":  # as a process started with it: huggingface_hub read it at import
        (tmp_path / "hub").mkdir()  # a hub cache, without the name: looked up on disk only
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        match = "not in the hub cache.*HF_HUB_OFFLINE is set, and a model-hub name needs network"
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
        match = r"no model-hub cache .*a model-hub name \('org/name'\) needs network"
    for call in (lambda: build_model("no-such-model"), lambda: models.model_config("no-such-model")):
        with pytest.raises(ValueError, match=rf"unknown model 'no-such-model'.*{match}.*\(tiny-gpt2, .*smollm2-135m\)"):
            call()
    assert attempts == []


def test_a_cached_lookup_keeps_the_adapter_lookup_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers asks the hub for adapter_config.json even with local_files_only=True unless
    adapter_kwargs say so too: the cache-only load passes both."""
    import transformers

    seen: list[dict[str, Any]] = []

    def load(name: str, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise OSError("not cached")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr("padless.hub.hub_reachable", lambda timeout=None: False)
    with pytest.raises(ValueError, match="cannot be reached"):
        build_model("org/not-cached")
    assert seen and seen[0]["local_files_only"] is True and seen[0]["adapter_kwargs"] == {"local_files_only": True}


def test_the_first_smollm2_load_says_what_it_is_doing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    converted: list[Path] = []
    monkeypatch.setattr(models, "_convert_smollm2", converted.append)  # the ~30 s dequantisation, mocked
    with caplog.at_level(logging.WARNING, logger="padless.models.factory"):
        models._write_smollm2(tmp_path / "smol")
    assert converted == [tmp_path / "smol"]
    before, after = caplog.messages
    assert before == (
        f"padless: first load of smollm2-135m: converting SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised "
        f"to fp32) into the cache at {tmp_path / 'smol'} (~30 s, ~520 MB, once)"
    )
    assert after.startswith("padless: smollm2-135m converted in ")
    assert after.endswith(f" s; later loads read {tmp_path / 'smol'}")


def test_the_smollm2_progress_lines_reach_stderr_where_logging_is_not_configured(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; import padless.models.factory as f; "
        "f._convert_smollm2 = lambda target: None; f._write_smollm2(Path(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "smol")], capture_output=True, text=True, timeout=120, check=True
    )
    lines = done.stderr.strip().splitlines()
    assert done.stdout == "" and len(lines) == 2, done.stderr
    assert lines[0].startswith("padless: first load of smollm2-135m: converting") and "converted in" in lines[1]


def test_tiny_qwen2_vl_matches_the_offline_processor(recwarn):
    import padless
    from padless.data.shards import cached_processor
    from padless.models.factory import builtin_models, tokenizer_name_for

    tok = cached_processor("offline").tokenizer
    model = padless.build_model("tiny-qwen2-vl")
    text = model.config.text_config
    assert "tiny-qwen2-vl" in builtin_models() and type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert text.vocab_size == len(tok) and model.config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert text.bos_token_id == tok.bos_token_id < text.vocab_size and text.pad_token_id == tok.pad_token_id
    assert not [w for w in recwarn if "vocab" in str(w.message).lower()]  # no id outside the vocabulary
    with pytest.raises(ValueError, match="processor='offline'"):
        tokenizer_name_for("tiny-qwen2-vl")
    with pytest.raises(ValueError, match="offline processor's"):
        padless.build_model("tiny-qwen2-vl", vocab_size=600)


@pytest.mark.slow  # two SFTTrainer steps of the tiny Qwen2-VL with images (~5 s)
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_docs_vlm_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    pytest.importorskip("trl")
    page = Path(__file__).resolve().parents[2] / "docs" / "vlm.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    source = next(b for b in blocks if 'build_model("tiny-qwen2-vl")' in b)
    monkeypatch.chdir(tmp_path)
    exec(compile(source, str(page), "exec"), {"__name__": "__doc_snippet__"})
    assert re.search(r"^2 steps, images packed: [1-9]\d*$", capsys.readouterr().out, flags=re.M)
