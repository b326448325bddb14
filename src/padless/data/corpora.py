"""The built-in corpora: named recipes that turn the offline assets into records (see
:mod:`padless.data.records`). Nothing is downloaded when a recipe runs. The asset readers and chat
builders the recipes share live in :mod:`padless.data.raw`.

========== ===== ==================================================================================
name       kind  what
========== ===== ==================================================================================
tweets     text  vaderSentiment's 4,200 tweets; ``tweets:all`` adds its 10,605 movie-review, 5,190
                 news (NYT editorial) and 3,708 product-review snippets, ``tweets:news,tweets``
                 picks sources
dialogues  chat  chatterbot-corpus English: 2,025 conversations, turns alternating user / assistant
                 (the 2,026th entry is a bare string, not a conversation, and is left out; an
                 unanswered last user turn is dropped);
                 ``dialogues:ai,humor`` picks YAML files
toolcalls  chat  BFCL: 2,501 single-turn questions answered by their ground-truth call(s) and 800
                 multi-turn traces (user turns answered by call lists); ``toolcalls:single`` or
                 ``toolcalls:multi`` picks one. The function schemas go in a system turn for a
                 seeded half of the examples (``tool_schema="always" | "never"`` to change that)
agentic-rag chat agent-log-like traces built from the above (:mod:`padless.data.agentic`);
                 ``agentic-rag:5000`` sets the number of traces (default 2,000). Tool schemas are
                 not shown by default (they would add ~760 GPT-2 tokens to each trace; pass
                 ``tool_schema="half"`` or ``"always"`` to show them)
========== ===== ==================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from padless.data.assets import VADER_FILES
from padless.data.raw import (
    as_chat,
    call_message,
    chatterbot_conversations,
    chatterbot_topics,
    schema_system_turn,
    snippets,
    with_schema,
)

Record = dict[str, Any]


@dataclass(frozen=True)
class CorpusRecipe:
    """A named, reproducible way to build records from the offline assets."""

    name: str
    """The name used in ``load_corpus(name)`` and ``padless stats --data NAME``."""
    kind: Literal["text", "chat"]
    """``text`` (plain texts: only ``train_on="all"``) or ``chat`` (messages)."""
    description: str
    """One line for help texts."""
    build: Callable[[str | None, int, str], list[Record]]
    """``(selector after ':' or None, seed, tool_schema) -> records``."""
    tool_schema: str = "never"
    """Default share of examples whose tool schemas are shown in a system turn (``half`` |
    ``always`` | ``never``); meaningless for corpora without tools."""


# -- tweets and snippets -------------------------------------------------------------------------


def _pick(selector: str | None, choices: list[str], default: list[str], what: str) -> list[str]:
    if selector is None:
        return default
    if selector == "all":
        return choices
    picked = [s.strip() for s in selector.split(",") if s.strip()]
    unknown = [s for s in picked if s not in choices]
    if unknown or not picked:
        raise ValueError(
            f"unknown {what} {', '.join(map(repr, unknown)) or repr(selector)}; choose from all, {', '.join(choices)}"
        )
    return picked


def build_tweets(selector: str | None, seed: int, tool_schema: str) -> list[Record]:
    sources = _pick(selector, list(VADER_FILES), ["tweets"], "snippet source")
    return [{"text": text} for src in sources for _, text in snippets(src)]


# -- dialogues -----------------------------------------------------------------------------------


def build_dialogues(selector: str | None, seed: int, tool_schema: str) -> list[Record]:
    topics = chatterbot_topics()
    picked = _pick(selector, topics, topics, "chatterbot topic")
    return [{"messages": as_chat(conv)} for t in picked for conv in chatterbot_conversations(t)]


# -- tool calls ----------------------------------------------------------------------------------


def build_toolcalls(selector: str | None, seed: int, tool_schema: str) -> list[Record]:
    from padless.data import bfcl

    parts = _pick(selector, ["single", "multi"], ["single", "multi"], "toolcalls part")
    records: list[Record] = []
    if "single" in parts:
        for ex in bfcl.single_turn_examples():
            messages = [*ex.messages, call_message(ex.calls)]
            if with_schema(tool_schema, seed, ex.id):
                messages = schema_system_turn(ex.tools, messages)
            records.append({"messages": messages})
    if "multi" in parts:
        for tr in bfcl.multi_turn_traces():
            messages = []
            for user, calls in tr.turns:
                messages += user
                if calls:
                    messages.append(call_message(calls))
            while messages[-1]["role"] != "assistant":  # 28 traces end on a turn answered by no call
                messages.pop()
            if with_schema(tool_schema, seed, tr.id):
                messages = schema_system_turn(tr.tools, messages)
            records.append({"messages": messages})
    return records


def build_agentic(selector: str | None, seed: int, tool_schema: str) -> list[Record]:
    from padless.data.agentic import DEFAULT_TRACES, agentic_traces

    if selector is None:
        n = DEFAULT_TRACES
    elif selector.isdigit() and int(selector) > 0:
        n = int(selector)
    else:
        raise ValueError(f"agentic-rag:{selector}: the part after ':' is the number of traces, e.g. agentic-rag:5000")
    return [{"messages": m} for m in agentic_traces(n, seed=seed, tool_schema=tool_schema)]


CORPORA: dict[str, CorpusRecipe] = {
    "tweets": CorpusRecipe(
        "tweets", "text", "vaderSentiment tweets (tweets:all adds reviews and news snippets)", build_tweets
    ),
    "dialogues": CorpusRecipe("dialogues", "chat", "chatterbot-corpus English conversations", build_dialogues),
    "toolcalls": CorpusRecipe(
        "toolcalls",
        "chat",
        "BFCL function-calling questions and multi-turn traces",
        build_toolcalls,
        tool_schema="half",
    ),
    "agentic-rag": CorpusRecipe(
        "agentic-rag", "chat", "agent-log-like traces: queries, tool calls, results, answers", build_agentic
    ),
}
"""Built-in corpus name -> recipe."""


def split_corpus_name(name: str) -> tuple[CorpusRecipe, str | None] | None:
    """``"tweets:all"`` -> (the tweets recipe, ``"all"``); None if the name is no built-in corpus."""
    base, _, selector = name.partition(":")
    recipe = CORPORA.get(base)
    return None if recipe is None else (recipe, selector or None)
