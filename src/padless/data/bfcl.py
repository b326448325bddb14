"""Reading the Berkeley Function-Calling Leaderboard data shipped in ``bfcl-eval`` (no import of it).

Three shapes are read from ``bfcl_eval/data``:

- single-turn categories with a ground truth (:data:`SINGLE_TURN`): a user question, the function
  schemas offered, and the expected call(s). ``possible_answer`` lists every acceptable value of each
  argument; the first is taken, and an argument whose first value is ``""`` (meaning "may be omitted")
  is left out.
- multi-turn categories (:data:`MULTI_TURN`): several user turns, each answered by a list of calls
  written as Python (``"mv(source='a.pdf', destination='temp')"``), parsed with ``ast``. Positional
  arguments are named from the function's documented parameter order. The schemas offered are the
  ``multi_turn_func_doc`` files of the involved API classes, less ``excluded_function``. BFCL gets tool
  results by executing the calls; that is not done here, so these traces have no tool turns.
- web search (``web_search``): a multi-hop question, its sub-questions with their answers and source
  URLs, and the final answer; used by the ``agentic-rag`` recipe.

Categories without a ground truth (irrelevance, relevance, format sensitivity) and memory (which needs
a prerequisite conversation) are not used.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from padless.data.assets import bfcl_data_dir

SINGLE_TURN: tuple[str, ...] = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
MULTI_TURN: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
_CLASS_DOCS = {  # as bfcl_eval/constants/executable_backend_config.py maps them
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
    "WebSearchAPI": "web_search.json",
}

Call = dict[str, Any]
"""``{"name": str, "arguments": dict}``."""


@dataclass(frozen=True)
class ToolExample:
    """One single-turn question and its ground-truth call(s)."""

    id: str
    """BFCL id, e.g. ``simple_python_0``."""
    messages: list[dict[str, Any]]
    """The question (user turns, sometimes a system turn first)."""
    tools: list[dict[str, Any]]
    """Function schemas offered."""
    calls: list[Call]
    """Expected calls (several for the parallel categories)."""


@dataclass(frozen=True)
class ToolTrace:
    """One multi-turn trace: each turn's user messages and the calls that answer them."""

    id: str
    """BFCL id, e.g. ``multi_turn_base_0``."""
    turns: list[tuple[list[dict[str, Any]], list[Call]]]
    """``(user messages, calls)`` per turn; the user messages are empty where the data adds a missing
    function and the calls answer the request before."""
    tools: list[dict[str, Any]]
    """Function schemas of the involved API classes."""


@dataclass(frozen=True)
class WebSearchTask:
    """A multi-hop web-search question with its reasoning chain."""

    id: str
    """BFCL id, e.g. ``web_search_0``."""
    question: str
    """The user's question."""
    hops: list[tuple[str, str, str]]
    """``(sub-question, answer, source URL)`` in order."""
    answer: str
    """The final answer."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _category(name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Questions and ground truths (by id) of one category."""
    data = bfcl_data_dir()
    questions = _read_jsonl(data / f"BFCL_v4_{name}.json")
    answers = {a["id"]: a for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_{name}.json")}
    return questions, answers


def first_acceptable(options: Any) -> Any:
    """The first acceptable value of a ``possible_answer`` entry; nested dicts hold options per key."""
    value = options[0] if isinstance(options, list) and options else options
    if isinstance(value, dict):
        return {k: first_acceptable(v) for k, v in value.items() if not _omitted(v)}
    return value


def _omitted(options: Any) -> bool:
    return isinstance(options, list) and bool(options) and options[0] == ""


def _answer_call(answer: dict[str, Any]) -> Call:
    ((name, args),) = answer.items()
    return {"name": name, "arguments": {k: first_acceptable(v) for k, v in args.items() if not _omitted(v)}}


@cache
def single_turn_examples() -> tuple[ToolExample, ...]:
    """Every single-turn example with a ground truth, in category and file order."""
    out = []
    for cat in SINGLE_TURN:
        questions, answers = _category(cat)
        for q in questions:
            if q["id"] not in answers:
                continue
            out.append(
                ToolExample(
                    id=q["id"],
                    messages=list(q["question"][0]),
                    tools=q["function"],
                    calls=[_answer_call(a) for a in answers[q["id"]]["ground_truth"]],
                )
            )
    return tuple(out)


def parse_call(source: str, param_order: dict[str, list[str]]) -> Call:
    """A Python call string as a call; literals are evaluated, anything else is kept as source text."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"BFCL call {source!r} is not a Python call: {err}") from None
    if not isinstance(node, ast.Call):
        raise ValueError(f"BFCL call {source!r} is not a Python call")
    name = ast.unparse(node.func)

    def value(expr: ast.expr) -> Any:
        try:
            return ast.literal_eval(expr)
        except ValueError:
            return ast.unparse(expr)

    order = param_order.get(name.rsplit(".", 1)[-1], [])
    args: dict[str, Any] = {}
    for i, arg in enumerate(node.args):
        args[order[i] if i < len(order) else f"arg{i}"] = value(arg)
    for kw in node.keywords:
        args[kw.arg or "kwargs"] = value(kw.value)
    return {"name": name, "arguments": args}


@cache
def class_docs(api_class: str) -> tuple[dict[str, Any], ...]:
    """The function schemas of one multi-turn API class."""
    path = bfcl_data_dir() / "multi_turn_func_doc" / _CLASS_DOCS[api_class]
    return tuple(_read_jsonl(path))


@cache
def multi_turn_traces() -> tuple[ToolTrace, ...]:
    """Every multi-turn trace with its ground-truth calls."""
    out = []
    for cat in MULTI_TURN:
        questions, answers = _category(cat)
        for q in questions:
            excluded = set(q.get("excluded_function", []))
            tools = [d for c in q["involved_classes"] for d in class_docs(c) if d["name"] not in excluded]
            order = {d["name"]: list(d["parameters"].get("properties", {})) for d in tools}
            turns = []
            for msgs, calls in zip(q["question"], answers[q["id"]]["ground_truth"]):
                # In miss_func, a turn without a user message is where the missing function is added:
                # its calls carry out the previous request, so they are kept (after that request).
                if msgs or calls:
                    turns.append((list(msgs), [parse_call(c, order) for c in calls]))
            out.append(ToolTrace(id=q["id"], turns=turns, tools=tools))
    return tuple(out)


@cache
def web_search_tasks() -> tuple[WebSearchTask, ...]:
    """The multi-hop web-search questions with their sub-questions and answers."""
    questions, answers = _category("web_search")
    out = []
    for q in questions:
        a = answers[q["id"]]
        hops = [(h["subquestion"], str(h["answer"]), h["source"]) for h in a["source"]]
        out.append(
            WebSearchTask(
                id=q["id"], question=q["question"][0][0]["content"], hops=hops, answer=str(a["ground_truth"][0])
            )
        )
    return tuple(out)
