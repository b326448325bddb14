"""The built-in corpora: counts, selectors, BFCL parsing, agent-trace reproducibility, loading."""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import numpy as np
import pytest

from padless.data import bfcl
from padless.data.agentic import EPISODES, agentic_trace, agentic_traces
from padless.data.chat import check_messages
from padless.data.corpora import CORPORA, split_corpus_name
from padless.data.load import corpus_lengths, load_corpus
from padless.data.raw import with_schema
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX


@cache
def gpt2() -> Any:
    return load_tokenizer("gpt2")


def build(name: str, seed: int = 0, tool_schema: str | None = None) -> list[dict[str, Any]]:
    recipe, selector = split_corpus_name(name)  # type: ignore[misc]
    return recipe.build(selector, seed, tool_schema or recipe.tool_schema)


def test_corpus_names() -> None:
    assert sorted(CORPORA) == ["agentic-rag", "dialogues", "toolcalls", "tweets"]
    assert split_corpus_name("data.jsonl") is None


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("tweets", 4200),
        ("tweets:all", 4200 + 10605 + 5190 + 3708),
        ("tweets:news,product_reviews", 5190 + 3708),
        ("dialogues", 2025),
        ("dialogues:ai", 105),
        ("toolcalls", 2501 + 800),
        ("toolcalls:single", 2501),
        ("toolcalls:multi", 800),
        ("agentic-rag", 2000),
        ("agentic-rag:37", 37),
    ],
)
def test_recipe_counts(name: str, count: int) -> None:
    assert len(build(name)) == count


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("tweets:tweet", "unknown snippet source 'tweet'; choose from all, tweets"),
        ("dialogues:nope", "unknown chatterbot topic 'nope'"),
        ("toolcalls:both", "unknown toolcalls part 'both'; choose from all, single, multi"),
        ("agentic-rag:many", "the part after ':' is the number of traces"),
    ],
)
def test_bad_selectors_are_named(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(name)


def test_tweets_are_clean_text() -> None:
    texts = [r["text"] for r in build("tweets")]
    assert texts[1] == "Yay. Another good phone interview."
    assert texts[2].startswith("We were 17 deep last night & the love")  # HTML entities decoded
    assert all(t and t == t.strip() for t in texts)


@pytest.mark.parametrize("name", ["dialogues", "toolcalls", "agentic-rag:300"])
def test_chat_recipes_give_valid_chats_that_end_with_a_reply(name: str) -> None:
    for i, record in enumerate(build(name), start=1):
        messages = check_messages(record["messages"], f"record {i}")
        assert messages[-1]["role"] == "assistant"


def test_dialogues_alternate_and_drop_an_unanswered_last_turn() -> None:
    chats = [r["messages"] for r in build("dialogues:conversations")]
    assert chats[0] == [
        {"role": "user", "content": "Good morning, how are you?"},
        {"role": "assistant", "content": "I am doing well, how about you?"},
        {"role": "user", "content": "I'm also good."},
        {"role": "assistant", "content": "That's good to hear."},
    ]  # the fifth turn, "Yes it is.", had no reply


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([10], 10),
        (["units", ""], "units"),
        ([[3, 5]], [3, 5]),
        ([{"size": ["large"], "milk": ["", "oat"]}], {"size": "large"}),
    ],
)
def test_first_acceptable_answer(options: Any, expected: Any) -> None:
    assert bfcl.first_acceptable(options) == expected


@pytest.mark.parametrize(
    ("source", "call"),
    [
        ("cd(folder='document')", {"name": "cd", "arguments": {"folder": "document"}}),
        ("sort('final_report.pdf')", {"name": "sort", "arguments": {"file_name": "final_report.pdf"}}),
        ("ls(a=True)", {"name": "ls", "arguments": {"a": True}}),
        ("f(1, [2, 3], k={'a': None})", {"name": "f", "arguments": {"arg0": 1, "arg1": [2, 3], "k": {"a": None}}}),
        ("api.get(x=some_var)", {"name": "api.get", "arguments": {"x": "some_var"}}),
    ],
)
def test_parse_call(source: str, call: dict[str, Any]) -> None:
    assert bfcl.parse_call(source, {"sort": ["file_name", "reverse"]}) == call


@pytest.mark.parametrize("source", ["cd(", "x = 1", "'just a string'"])
def test_parse_call_rejects_non_calls(source: str) -> None:
    with pytest.raises(ValueError, match="is not a Python call"):
        bfcl.parse_call(source, {})


def test_single_turn_examples_match_the_data() -> None:
    ex = bfcl.single_turn_examples()[0]
    assert ex.id == "simple_python_0"
    assert ex.calls == [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units"}}]
    assert Counter(len(e.calls) > 1 for e in bfcl.single_turn_examples())[True] > 300  # the parallel categories


def test_missing_function_turn_answers_the_request_before() -> None:
    trace = next(t for t in bfcl.multi_turn_traces() if t.id == "multi_turn_miss_func_46")
    assert [len(user) for user, _ in trace.turns] == [1, 0]
    assert trace.turns[0][1] == [] and trace.turns[1][1][0] == {"name": "cd", "arguments": {"folder": "Drafts"}}


def test_schema_coin_is_per_example_and_seeded() -> None:
    flips = [with_schema("half", 0, f"id{i}") for i in range(400)]
    assert 150 < sum(flips) < 250
    assert flips == [with_schema("half", 0, f"id{i}") for i in range(400)]
    assert flips != [with_schema("half", 1, f"id{i}") for i in range(400)]
    assert not with_schema("never", 0, "x") and with_schema("always", 0, "x")
    with pytest.raises(ValueError, match="tool_schema='some' is not one of half, always, never"):
        with_schema("some", 0, "x")


def test_toolcalls_schema_turn() -> None:
    always = build("toolcalls:single", tool_schema="always")
    never = build("toolcalls:single", tool_schema="never")
    assert all(r["messages"][0]["content"].startswith("You can call these functions:\n[") for r in always)
    assert not any(m["content"].startswith("You can call") for r in never for m in r["messages"])


def test_agentic_traces_are_reproducible_and_prefix_stable() -> None:
    assert agentic_traces(20, seed=3) == agentic_traces(20, seed=3)
    assert agentic_traces(20, seed=3)[:10] == agentic_traces(10, seed=3)
    assert agentic_traces(20, seed=3) != agentic_traces(20, seed=4)
    assert agentic_trace(7, seed=3) == agentic_traces(8, seed=3)[7]


def test_agentic_mix_has_every_episode_kind() -> None:
    traces = agentic_traces(400)
    calls = Counter(c["function"]["name"] for t in traces for m in t for c in m.get("tool_calls", []))
    assert calls["search_engine_query"] > 150 and calls["fetch_url_content"] > 20
    answers = Counter(t[-1]["content"].split(" ")[0] for t in traces)
    n = len(traces)
    assert abs(answers["Done:"] / n - EPISODES["tool"]) < 0.08
    assert abs(answers["The"] / n - EPISODES["web"]) < 0.08
    assert all(t[0]["role"] == "system" for t in traces)


def test_agentic_lengths_are_short_and_variable() -> None:
    lengths = corpus_lengths("agentic-rag", gpt2())
    assert len(lengths) == 2000
    q10, q50, q90 = np.percentile(lengths, [10, 50, 90])
    assert q50 < 600 and q90 > 2 * q50 and q10 < q50 / 1.3 and lengths.max() > 4 * q50


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_every_example_ends_with_eos_and_labels_align(name: str) -> None:
    c = load_corpus(name, gpt2(), limit=200)
    assert len(c) == 200 and c.report.kept == 200 and c.report.boundary_mismatches == 0
    assert all(x[-1] == 50256 for x in c.input_ids)
    assert c.lengths.tolist() == [len(x) for x in c.input_ids] == [len(y) for y in c.labels]


@pytest.mark.parametrize("name", ["dialogues", "toolcalls", "agentic-rag"])
def test_assistant_labels_on_chat_corpora(name: str) -> None:
    c = load_corpus(name, gpt2(), train_on="assistant", limit=100)
    completion = load_corpus(name, gpt2(), train_on="completion", limit=100)
    assert c.input_ids == completion.input_ids
    for ids, labels, comp in zip(c.input_ids, c.labels, completion.labels):
        trained = [i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX]
        assert 0 < len(trained) < len(ids)
        assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(ids, labels))
        # completion targets are a subset of assistant targets
        assert all(b == IGNORE_INDEX or a == b for a, b in zip(labels, comp))
    text = gpt2().decode([i for i, lab in zip(c.input_ids[0], c.labels[0]) if lab != IGNORE_INDEX])
    assert "<|im_start|>" not in text  # no header, user or tool turn is a target


def test_text_corpus_refuses_chat_labels() -> None:
    with pytest.raises(ValueError, match="corpus 'tweets' is plain text; train_on='assistant' needs chats"):
        load_corpus("tweets", gpt2(), train_on="assistant")


def test_overlong_built_in_examples() -> None:
    with pytest.raises(ValueError, match="longer than max_length 256"):
        load_corpus("toolcalls", gpt2(), max_length=256, limit=100, cache=False)
    c = load_corpus("toolcalls", gpt2(), max_length=256, overlong="truncate", limit=100, cache=False)
    assert c.lengths.max() == 256 and c.report.truncated_examples > 0


@pytest.mark.slow  # tokenizes every built-in corpus whole (toolcalls ~25 s on one core, cached after)
@pytest.mark.parametrize("name", sorted(CORPORA))
def test_every_built_in_corpus_passes_stats_with_defaults(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from padless.cli import main

    assert main(["stats", "--data", name, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overlong"]["policy_used"] == "split" and doc["overlong"]["policy_given"] is False
    # every token kept, and placed by each way of batching alike: none computes fewer than the data's own
    assert doc["plan"]["real_tokens"] == doc["lengths"]["total"]
    ways = doc["batching"]
    assert all(w["tokens_computed"] >= doc["lengths"]["total"] for w in ways.values())
    assert ways["bucketed"]["tokens_computed"] <= ways["pad_to_longest"]["tokens_computed"]
