"""Real data, offline: the GPT-2 and SmolLM2 tokenizers, built-in corpora (tweets, dialogues, tool
calls, agent traces), the user's files, chat templates with assistant-only labels, a token cache.

    >>> from padless.data import load_corpus, load_tokenizer
    >>> tok = load_tokenizer("gpt2")
    >>> corpus = load_corpus("toolcalls", tok, train_on="assistant", max_length=1024, overlong="drop")

- ``assets``: where the offline assets live; ``raw``: their raw readers; ``bfcl``: the BFCL data.
- ``corpora``: the built-in corpora as named recipes; ``agentic``: the synthetic agentic-RAG traces.
- ``files``: the user's JSONL / CSV / Parquet / ``datasets`` inputs; ``records``: the record kinds.
- ``formats``: the forms a record comes in (chats, ShareGPT, Alpaca, TRL's prompt / completion, text,
  token ids), detected, named and read into one document; a ``columns`` mapping for other field names.
- ``inputs``: the inputs of ``padless pack``, one reader per form (JSON lines, Parquet, records held
  whole), chosen by ``open_input``; ``shards``: what every reader shares (the shard, its tokens, the
  base class, records -> tokens); ``synthetic``: random token sequences (``--synthetic DIST:N``).
- ``chat``: chats and agent traces rendered with trained / untrained pieces; ``images``: chats with
  images rendered through a vision-language model's processor (and an offline Qwen2-VL processor).
- ``tokenizer``: tokenizers by name, offline; ``encode``: records -> token ids and labels.
- ``load``: ``load_corpus``, the cached tokenized corpus; ``cache``: the on-disk token cache.

Names are resolved lazily from their modules (:mod:`padless._lazy`, as at the top level), so
importing this package loads nothing heavy (and ``python -m padless.cli.assets`` runs without
importing the others first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from padless._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "load_tokenizer": "padless.data.tokenizer",
    "tokenizer_fingerprint": "padless.data.tokenizer",
    "CORPORA": "padless.data.corpora",
    "CorpusRecipe": "padless.data.corpora",
    "load_corpus": "padless.data.load",
    "corpus_lengths": "padless.data.load",
    "TokenizedCorpus": "padless.data.load",
    "CorpusReport": "padless.data.load",
    "RecordError": "padless.data.records",
    "TRAIN_ON": "padless.data.chat",
    "SYSTEM_PROMPT": "padless.data.chat",
    "DEFAULT_CHAT_TEMPLATE": "padless.data.chat",
    "chat_pieces": "padless.data.chat",
    "render_chat": "padless.data.chat",
    "check_messages": "padless.data.chat",
    "agentic_traces": "padless.data.agentic",
    "cache_root": "padless.data.assets",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - static view of the lazy exports
    from padless.data.agentic import agentic_traces
    from padless.data.assets import cache_root
    from padless.data.chat import (
        DEFAULT_CHAT_TEMPLATE,
        SYSTEM_PROMPT,
        TRAIN_ON,
        chat_pieces,
        check_messages,
        render_chat,
    )
    from padless.data.corpora import CORPORA, CorpusRecipe
    from padless.data.load import CorpusReport, TokenizedCorpus, corpus_lengths, load_corpus
    from padless.data.records import RecordError
    from padless.data.tokenizer import load_tokenizer, tokenizer_fingerprint
