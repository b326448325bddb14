"""padless' GRPOTrainer against TRL 1.16's with TRL's multi-turn ``tools`` loop (``GRPOTrainer(tools=[add])``,
HF ``generate`` on the CPU): from one seed, a tiny Llama that calls ``add`` trains 3 optimiser steps to TRL's
parameters (relative 1e-5), with the prompt shared and not, and one or two tool-calling iterations. Both runs
called the tool, with the same arguments; the tool results TRL appended to the completions are there and
``tool_mask`` is 0 on exactly those tokens (TRL's loss mask); every log-prob pass ran on packed rows.

What makes TRL's loop run offline, with no model family's tokenizer:

* ``tool_tokenizer``: a word-level tokenizer with its own chat template (it renders tool calls and ``tool``
  turns, and is prefix-preserving: TRL's ``supports_tool_calling`` and ``is_chat_template_prefix_preserving``)
  and its own ``response_template`` (transformers >= 5.13), so TRL skips ``add_response_schema`` (which knows
  only the templates of known families) and parses the calls with ``tokenizer.parse_response``.
* ``tool_llama``: a 2-layer Llama whose embeddings and LM head make each token of a call the likely
  successor of the one before (a logit margin of 19 or more over every other token, held by
  ``test_the_tiny_model_spells_calls``: sampling at temperature 0.8 leaves the chain with probability ~1e-9 a
  token), with three branches of about even odds:
  answer or call, ``a`` in {2, 4}, ``b`` in {1, 3}. So the rollouts of one prompt differ in length and reward
  (the sum of the tool results), and after 2 SGD steps at lr 0.1 the second generation still calls the tool.
  Attention and MLP keep their random initialisation: they move the logits a little, so the log-probs
  depend on the mask and positions of the packed rows.

A rollout of two iterations, as TRL builds it (``|`` the prompt/completion split, ``[...]`` tool_mask 0)::

    <user> w6 w7 <eos> <assistant> | <call> {"name": "add", "arguments": {"a": 4, "b": 1}} </call> <eos>
        [<tool> 5 <eos> <assistant>] <call> ... </call> <eos> [<tool> 3 <eos> <assistant>] w0 <eos>
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_trl_grpo import STEPS, Passes, assert_same_training, grpo_config, parameters  # noqa: E402

import integrations_support as support  # noqa: E402

PROMPTS = ["w3 w4 w5", "w6 w7", "w8 w9 w10 w11 w12", "w13"]
CALL = ["<call>", '{"name":', '"add",', '"arguments":', '{"a":', "A", '"b":', "B", "</call>", "<eos>"]
"""The tokens of one call; ``A`` is one of ``2,`` ``4,`` and ``B`` one of ``1}}`` ``3}}``."""
WORDS = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>", "<tool>", "<call>", '{"name":', '"add",',
         '"arguments":', '{"a":', "2,", "4,", '"b":', "1}}", "3}}", "</call>", *(str(i) for i in range(10)),
         *(f"w{i}" for i in range(20))]  # fmt: skip
SUCCESSORS = {  # token -> its likely successors (even odds among them): a call, or the answer "w0"
    "<assistant>": ["<call>", "w0"], "w0": ["<eos>"], "<call>": ['{"name":'], '{"name":': ['"add",'],
    '"add",': ['"arguments":'], '"arguments":': ['{"a":'], '{"a":': ["2,", "4,"], "2,": ['"b":'], "4,": ['"b":'],
    '"b":': ["1}}", "3}}"], "1}}": ["</call>"], "3}}": ["</call>"], "</call>": ["<eos>"],
}  # fmt: skip
MARGIN = 20.0
MAX_COMPLETION = 40  # two iterations: call, result, call, result, call = 10 + 4 + 10 + 4 + 10 tokens

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<user> {{ m.content }} <eos> "
    "{% elif m.role == 'assistant' %}<assistant> {% if m.content %}{{ m.content }} {% endif %}"
    "{% for c in m.tool_calls or [] %}"
    "<call> {{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }} </call> "
    "{% endfor %}<eos> "
    "{% elif m.role == 'tool' %}<tool> {{ m.content }} <eos> "
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)
"""Every turn ends with the tokenizer's EOS (TRL's ``_get_tool_suffix_ids`` cuts the rendered conversation
after its last EOS to find the tool turn's tokens); a call is its JSON, one word a token."""
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"}, "start_anchor": "<assistant>",
    "fields": {"tool_calls": {"open": "<call>", "close_pattern": r"</call>\s*", "repeats": True, "content": "json",
                              "transform": {"type": "function", "function": "{content}"}},
               "content": {"close_pattern": r"<eos>\s*", "content": "text"}},
}  # fmt: skip
"""transformers' response parsing: a ``<call> {json} </call>`` region is one tool call, the rest is content."""


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread (see test_trl_grpo.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tool_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    inner.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        response_template=RESPONSE_TEMPLATE,
    )


def tool_llama():
    """A 2-layer, 32-wide Llama from seed 0 whose likely successors are ``SUCCESSORS``: each source token's
    embedding is a basis vector of its own (the first ``len(SUCCESSORS)`` dimensions, zero for every other
    token), and the LM head gives each successor ``MARGIN`` on it. After the final RMSNorm that basis vector
    is ``sqrt(32)`` long, so each successor's logit is ``MARGIN`` plus the attention and MLP's small share."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
        pad_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    index = {w: i for i, w in enumerate(WORDS)}
    with torch.no_grad():
        embed, head, k = model.model.embed_tokens.weight, model.lm_head.weight, len(SUCCESSORS)
        embed[:, :k] = 0
        head[:, :k] = 0
        for dim, (token, successors) in enumerate(SUCCESSORS.items()):
            embed[index[token]] = 0
            embed[index[token], dim] = 1.0
            for successor in successors:
                head[index[successor], dim] = MARGIN / config.hidden_size**0.5
    model.generation_config.eos_token_id = 1
    return model


CALLS: list[tuple[int, int]] = []
"""The arguments of every call of ``add`` in the current run."""


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    CALLS.append((a, b))
    return a + b


def reward(completions, **kwargs):
    """The sum of the tool results of each completion (0 without a call)."""
    return [float(sum(int(m["content"]) for m in c if m["role"] == "tool")) for c in completions]


def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})


@dataclass
class Run:
    before: dict[str, Any]
    after: dict[str, Any]
    rollouts: list[dict[str, Any]]  # each generation's completion_ids, completion_mask, tool_mask
    calls: list[tuple[int, int]]


def train(cls, path, out_dir, iterations, passes=None, **kwargs) -> Run:
    """``cls`` trained with the ``add`` tool: parameters before and after, the rollouts, the tool's calls."""
    support.offline_hub()
    CALLS.clear()
    args = grpo_config(out_dir, max_completion_length=MAX_COMPLETION, max_tool_calling_iterations=iterations)
    trainer = cls(
        model=path,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset(),
        processing_class=tool_tokenizer(),
        tools=[add],
        **kwargs,
    )
    if passes is not None:
        passes.watch(trainer)
    rollouts, generate = [], trainer._generate_and_score_completions

    def record(inputs):
        out = generate(inputs)
        rollouts.append({k: out[k].clone() for k in ("completion_ids", "completion_mask", "tool_mask")})
        return out

    trainer._generate_and_score_completions = record
    before = parameters(trainer)
    trainer.train()
    return Run(before, parameters(trainer), rollouts, list(CALLS))


def tool_turns(rollout) -> list[tuple[int, int, int]]:
    """``(a, b, result)`` of every tool turn of the rollouts, row by row, after checking that each result TRL
    appended (``<tool> a+b <eos> <assistant>``) follows its call and ``tool_mask`` is 0 on exactly those tokens."""
    words = tool_tokenizer().convert_ids_to_tokens
    turns = []
    for ids, mask, tool in zip(rollout["completion_ids"], rollout["completion_mask"], rollout["tool_mask"]):
        completion = words(ids[mask.bool()].tolist())
        want = [1] * len(completion)
        for j, word in enumerate(completion):
            if word != "<tool>":
                continue
            call = completion[j - len(CALL) : j]
            assert all(w == c for w, c in zip(call, CALL) if c not in ("A", "B")), call
            a, b = int(call[CALL.index("A")].rstrip(",")), int(call[CALL.index("B")].rstrip("}"))
            assert completion[j + 1 : j + 4] == [str(a + b), "<eos>", "<assistant>"], completion
            want[j : j + 4] = [0] * 4
            turns.append((a, b, a + b))
        assert tool[: len(completion)].tolist() == want, (completion, tool.tolist())
    return turns


@pytest.fixture(scope="module")
def trl_runs(tmp_path_factory):
    """TRL's GRPOTrainer with tools on the saved tiny model, one run per number of iterations (on demand)."""
    import trl

    tmp = tmp_path_factory.mktemp("trl-grpo-tools")
    path = str(tmp / "tool-llama")
    tool_llama().save_pretrained(path)  # both trainers load it and build their reference model from it
    runs: dict[int, Run] = {}

    def run(iterations: int) -> tuple[str, Run]:
        if iterations not in runs:
            runs[iterations] = train(trl.GRPOTrainer, path, tmp / f"out-{iterations}", iterations)
        return path, runs[iterations]

    return run


@pytest.mark.parametrize("iterations", [1, 2], ids=["1-iteration", "2-iterations"])
@pytest.mark.parametrize("share", [False, True], ids=["documents", "shared-prompt"])
def test_tool_calling_rollouts_train_to_trls_parameters(trl_runs, tmp_path, monkeypatch, share, iterations):
    from padless.integrations.trl import GRPOTrainer

    path, want = trl_runs(iterations)
    passes = Passes(monkeypatch)
    got = train(GRPOTrainer, path, tmp_path, iterations, passes, share_prompt=share)
    assert all(torch.equal(got.before[n], p) for n, p in want.before.items())  # one starting point
    assert_same_training(got.after, want.after, want.before)
    # the tool ran, in both runs alike: the same rollouts (same parameters => same generations)
    assert len(got.calls) > 0 and got.calls == want.calls, (got.calls, want.calls)
    assert len(got.rollouts) == len(want.rollouts) == 2  # generations at steps 0 and 2
    for mine, theirs in zip(got.rollouts, want.rollouts):
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    turns = [tool_turns(r) for r in want.rollouts]  # the results in the completions, tool_mask 0 on them
    assert all(turns)  # both generations called the tool, the one after 2 steps of training too
    assert sorted((a, b) for t in turns for a, b, _ in t) == sorted(want.calls)  # each result in its completion
    lengths = {int(n) for r in want.rollouts for n in r["completion_mask"].sum(1)}
    assert len(lengths) > 1 and max(lengths) > 10 + 4  # completions of several lengths, some past a tool turn
    if iterations == 2:
        assert any(n > 2 * (10 + 4) for n in lengths)  # a rollout called twice
    # every log-prob pass ran on packed rows in the layout asked, none through TRL's padded pass
    assert sorted(passes.calls) == sorted(["old policy", "reference"] * 2 + ["policy"] * STEPS), passes.calls
    assert passes.trl_padded == 0
    assert passes.batches and all(b == share for b in passes.batches)


def test_the_tiny_model_spells_calls():
    """Along a two-call rollout, every token of ``SUCCESSORS`` gives its successors a logit at least 19 above any
    other token's, and the two of a branch are within 0.05 of each other; the template renders that rollout."""
    tokenizer, model = tool_tokenizer(), tool_llama().eval()
    call = lambda a, b: {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}  # noqa: E731
    conversation = [{"role": "user", "content": "w8 w9 w10"},
                    {"role": "assistant", "content": "", "tool_calls": [call(4, 1)]}, {"role": "tool", "content": "5"},
                    {"role": "assistant", "content": "", "tool_calls": [call(2, 3)]}, {"role": "tool", "content": "5"},
                    {"role": "assistant", "content": "w0"}]  # fmt: skip
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
    words = tokenizer.convert_ids_to_tokens(ids)
    assert "<unk>" not in words and words.count("<call>") == 2 and words[-2:] == ["w0", "<eos>"], words
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    index = {w: i for i, w in enumerate(WORDS)}
    margins, branches = [], []
    for position, word in enumerate(words[:-1]):
        if word in SUCCESSORS:
            likely = [index[w] for w in SUCCESSORS[word]]
            others = logits[position].clone()
            others[likely] = -float("inf")
            margins.append((logits[position, likely].min() - others.max()).item())
            branches += [(logits[position, likely].max() - logits[position, likely].min()).item()] * (len(likely) > 1)
    assert len(margins) == sum(w in SUCCESSORS for w in words[:-1]) > 2 * len(CALL)
    assert min(margins) >= 19.0 and max(branches) < 0.05, (min(margins), max(branches))
