"""The raw readers of the offline assets and the chat builders that every built-in corpus shares.

Readers (cached: each file is parsed once per process): :func:`snippets` (vaderSentiment's tweets,
reviews and news snippets), :func:`chatterbot_conversations` and :func:`chatterbot_topics` (the
chatterbot-corpus English YAML files). Builders: :func:`as_chat` (turns -> user / assistant messages),
:func:`call_message` (an assistant turn making tool calls), :func:`with_schema` and
:func:`schema_system_turn` (whether and how an example shows its tool schemas).

:mod:`padless.data.corpora` (the recipes) and :mod:`padless.data.agentic` (the agent traces) both
build on this module and not on each other.
"""

from __future__ import annotations

import html
import json
import random
from functools import cache
from typing import Any, Literal

from padless.data.assets import chatterbot_dir, vader_file

ToolSchema = Literal["half", "always", "never"]
TOOL_SCHEMA: tuple[str, ...] = ("half", "always", "never")


# -- vaderSentiment snippets ---------------------------------------------------------------------


@cache
def snippets(source: str) -> tuple[tuple[str, str], ...]:
    """``(id, text)`` of every snippet of one vaderSentiment source (a key of ``VADER_FILES``)."""
    out = []
    with vader_file(source).open(encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) == 3 and parts[2].strip():
                out.append((parts[0], html.unescape(parts[2]).strip()))
    return tuple(out)


# -- chatterbot-corpus conversations -------------------------------------------------------------


@cache
def chatterbot_conversations(topic: str) -> tuple[tuple[str, ...], ...]:
    """The conversations (lists of turns) of one chatterbot-corpus English YAML file."""
    import yaml

    path = chatterbot_dir() / f"{topic}.yml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as f:
        data = yaml.load(f, Loader=loader) or {}
    # One entry of trivia.yml is a bare string (a question without its answer), not a list of turns:
    # it is left out here, by name, rather than rendered as one turn per character.
    convs = data.get("conversations", [])
    return tuple(tuple(str(t).strip() for t in conv) for conv in convs if isinstance(conv, list) and conv)


def chatterbot_topics() -> list[str]:
    return sorted(p.stem for p in chatterbot_dir().glob("*.yml"))


def as_chat(turns: tuple[str, ...]) -> list[dict[str, str]]:
    """Alternate user / assistant, starting with the user; an unanswered last user turn is dropped,
    so every chat ends with a reply (and ``train_on="completion"`` has one to train on)."""
    turns = turns[: len(turns) - len(turns) % 2] if len(turns) > 1 else turns
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


# -- tool calls ----------------------------------------------------------------------------------


def with_schema(tool_schema: str, seed: int, key: str) -> bool:
    """Whether an example offers its schemas in a system turn; a coin seeded by ``(seed, key)`` for
    ``half``, so the choice does not depend on order, ``limit`` or the other examples."""
    if tool_schema not in TOOL_SCHEMA:
        raise ValueError(f"tool_schema={tool_schema!r} is not one of {', '.join(TOOL_SCHEMA)}")
    if tool_schema != "half":
        return tool_schema == "always"
    return random.Random(f"{seed}:{key}").random() < 0.5


def schema_system_turn(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put the tool schemas in a system turn (merged into the chat's own system turn, if it has one)."""
    text = "You can call these functions:\n" + json.dumps(tools, ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{text}\n\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def call_message(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant turn making ``calls`` (``{"name", "arguments"}`` each)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": dict(c)} for c in calls],
    }
