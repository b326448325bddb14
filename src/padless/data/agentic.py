"""The ``agentic-rag`` corpus: synthetic traces shaped like the logs of a retrieval agent, assembled
from the real texts of the other corpora. Reproducible: trace ``i`` depends only on ``(seed, i)``.

Every trace opens with a system turn ("You are a research assistant...") that can also list the tools
offered (``tool_schema``: ``never`` by default, ``half`` for a seeded half of the traces, ``always``):
the two BFCL web tools (``search_engine_query``, ``fetch_url_content``, real schemas from
``bfcl-eval``, ~760 GPT-2 tokens) plus, in a ``tool`` episode, the BFCL question's own functions.
Then one of three episodes:

- ``lookup`` (50%): the user asks the opening question of a chatterbot-corpus conversation. The agent
  runs 1, 2 or 3 rounds (70/20/10%) of ``search_engine_query`` (keywords: the question's first eight
  words, lower-cased); each result is a JSON list of ``1 + Poisson(1.2)`` hits (at most 10), each a
  vaderSentiment snippet (tweet, movie review, news or product review) with a title made of its first
  words and an ``example.com`` URL. After a round, with probability 0.2, it fetches the first hit
  with ``fetch_url_content``: the result is a whole document, all snippets of one NYT editorial or
  one product's reviews (3-50 sentences: the long tail). The final answer is the conversation's real
  reply.
- ``web`` (15%): a BFCL multi-hop web-search question. One search per hop, keywords = the
  sub-question; the first hit carries the hop's real answer and source URL, the others are filler
  snippets; with probability 0.15 per hop a fetch returns a random document. Final answer: "The answer
  is <ground truth>."
- ``tool`` (35%): a BFCL single-turn question; the agent makes the ground-truth call(s), each answered
  by a tool turn ``{"name": ..., "status": "success"}`` (BFCL has no recorded results; these are
  placeholders), then "Done: I called <names>."

So turns are mostly short (queries, calls, answers) with occasional long tool results, like real agent
traces. Snippet texts, questions, calls and answers are real data; the tool results' framing (titles,
URLs, status objects), the search keywords and the mix proportions are made up here.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache
from typing import Any

from padless.data import bfcl
from padless.data.raw import (
    call_message,
    chatterbot_conversations,
    chatterbot_topics,
    schema_system_turn,
    snippets,
    with_schema,
)

DEFAULT_TRACES = 2000
EPISODES: dict[str, float] = {"lookup": 0.5, "web": 0.15, "tool": 0.35}
"""Episode kind -> share of traces."""
SYSTEM_PROMPT = "You are a research assistant. Use the tools to look things up, then answer briefly."
_SOURCES = ("tweets", "movie_reviews", "news", "product_reviews")


@cache
def _documents() -> tuple[tuple[str, ...], ...]:
    """Whole documents: the snippets of one NYT editorial or one product, in order (ids ``doc_line``)."""
    docs: dict[tuple[str, str], list[str]] = {}
    for source in ("news", "product_reviews"):
        for sid, text in snippets(source):
            docs.setdefault((source, sid.split("_")[0]), []).append(text)
    return tuple(tuple(v) for v in docs.values())


@cache
def _questions() -> tuple[tuple[str, str], ...]:
    """``(question, reply)``: the first two turns of every chatterbot-corpus English conversation."""
    return tuple((c[0], c[1]) for t in chatterbot_topics() for c in chatterbot_conversations(t) if len(c) >= 2)


def _hit(rng: random.Random) -> dict[str, str]:
    source = rng.choice(_SOURCES)
    sid, text = rng.choice(snippets(source))
    title = " ".join(text.split()[:6]).rstrip(".,;:!?")
    return {"title": title, "href": f"https://example.com/{source}/{sid}", "body": text}


def _poisson(rng: random.Random, lam: float) -> int:
    k, p, limit = 0, rng.random(), pow(2.718281828459045, -lam)
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _keywords(text: str) -> str:
    return " ".join(re.findall(r"[\w'-]+", text.lower())[:8])


def _search(rng: random.Random, keywords: str, first: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A search call and its result (a JSON list of hits)."""
    hits = [_hit(rng) for _ in range(min(10, 1 + _poisson(rng, 1.2)))]
    if first is not None:
        hits[0] = first
    call = call_message([{"name": "search_engine_query", "arguments": {"keywords": keywords}}])
    return [call, {"role": "tool", "content": json.dumps(hits, ensure_ascii=False)}]


def _fetch(rng: random.Random, url: str) -> list[dict[str, Any]]:
    doc = rng.choice(_documents())
    call = call_message([{"name": "fetch_url_content", "arguments": {"url": url, "mode": "truncate"}}])
    return [call, {"role": "tool", "content": json.dumps({"content": " ".join(doc)}, ensure_ascii=False)}]


Episode = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""An episode's turns and the extra tool schemas it offers (beside the web tools)."""


def _lookup(rng: random.Random) -> Episode:
    question, reply = rng.choice(_questions())
    turns: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(rng.choices((1, 2, 3), weights=(0.7, 0.2, 0.1))[0]):
        turns += _search(rng, _keywords(question))
        if rng.random() < 0.2:
            url = json.loads(turns[-1]["content"])[0]["href"]
            turns += _fetch(rng, url)
    return [*turns, {"role": "assistant", "content": reply}], []


def _web(rng: random.Random) -> Episode:
    task = rng.choice(bfcl.web_search_tasks())
    turns: list[dict[str, Any]] = [{"role": "user", "content": task.question}]
    for sub, answer, url in task.hops:
        first = {"title": sub, "href": url, "body": f"{answer}. {_hit(rng)['body']}"}
        turns += _search(rng, sub, first)
        if rng.random() < 0.15:
            turns += _fetch(rng, url)
    return [*turns, {"role": "assistant", "content": f"The answer is {task.answer}."}], []


def _tool(rng: random.Random) -> Episode:
    ex = rng.choice(bfcl.single_turn_examples())
    turns = [*ex.messages, call_message(ex.calls)]
    for call in ex.calls:
        turns.append({"role": "tool", "content": json.dumps({"name": call["name"], "status": "success"})})
    names = ", ".join(c["name"] for c in ex.calls)
    return [*turns, {"role": "assistant", "content": f"Done: I called {names}."}], list(ex.tools)


_EPISODE_BUILDERS = {"lookup": _lookup, "web": _web, "tool": _tool}


def agentic_trace(i: int, *, seed: int = 0, tool_schema: str = "never") -> list[dict[str, Any]]:
    """Trace number ``i`` (messages), reproducible from ``(seed, i)`` alone."""
    rng = random.Random(f"agentic-rag:{seed}:{i}")
    kind = rng.choices(list(EPISODES), weights=list(EPISODES.values()))[0]
    body, extra_tools = _EPISODE_BUILDERS[kind](rng)
    system = [{"role": "system", "content": SYSTEM_PROMPT}]
    if body[0]["role"] == "system":  # a BFCL question with its own system turn
        system = [{"role": "system", "content": f"{SYSTEM_PROMPT}\n\n{body[0]['content']}"}]
        body = body[1:]
    messages = [*system, *body]
    if with_schema(tool_schema, seed, f"agentic-rag:{i}"):
        tools = [*bfcl.class_docs("WebSearchAPI"), *extra_tools]
        messages = schema_system_turn(tools, messages)
    return messages


def agentic_traces(n: int = DEFAULT_TRACES, *, seed: int = 0, tool_schema: str = "never") -> list[list[dict[str, Any]]]:
    """``n`` traces; the first ``k`` of ``n`` are the same as those of ``k``."""
    return [agentic_trace(i, seed=seed, tool_schema=tool_schema) for i in range(n)]
