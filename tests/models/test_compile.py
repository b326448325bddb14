"""padless.compile_layers: compiled packed training equals eager, packed equals alone under compile on
architectures padless was not tuned for, recompilations stay bounded, and the bench records them.

Graph and recompile tests use ``backend="aot_eager"`` (dynamo + AOTAutograd, no code generation):
they are about what gets traced and guarded, not about inductor's kernels; one test runs inductor.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics

import pytest
import torch

from conftest import make_features
from padless import compile_layers
from padless.attention.backend import register_padless_attention
from padless.batching.batch import batch_to, forward_inputs
from padless.batching.collate import PackingCollator
from padless.models.compile import decoder_layers

VOCAB = 64
LENGTHS = (20, 3, 13, 1, 17, 9)  # longer and shorter than the Mistral window below


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo caches compiled code per code object, across models: every test starts from none."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_layer=2,
        n_embd=32,
        n_head=4,
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return _padless(GPT2LMHeadModel(config))


def _llama_gqa():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return _padless(AutoModelForCausalLM.from_config(config))


def _mistral_window():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "mistral",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
    )
    return _padless(AutoModelForCausalLM.from_config(config))


def _padless(model):
    model.set_attn_implementation(register_padless_attention())
    return model.train()


def _batch(model, lengths, seed, row=None, multiple=None):
    feats = make_features(lengths, vocab_size=VOCAB, seed=seed, with_labels=True)
    collate = PackingCollator.for_model(model, max_length=row, pad_to_multiple_of=multiple)
    return batch_to(collate(feats), "cpu")


def _loss(model, batch):
    logits = model(**forward_inputs(batch)).logits  # [R, L, V]
    targets = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@pytest.mark.slow
def test_compiled_packed_forward_and_backward_equal_eager():
    """Inductor, the bench's backend (the cheaper aot_eager equality checks are the tests below)."""
    eager = _gpt2()
    compiled = copy.deepcopy(eager)
    counter = compile_layers(compiled, backend="inductor")
    batch = _batch(eager, LENGTHS, seed=1, row=40)
    logits_e, loss_e = _loss(eager, batch)
    logits_c, loss_c = _loss(compiled, batch)
    loss_e.backward()
    loss_c.backward()
    torch.testing.assert_close(logits_c, logits_e, atol=1e-5, rtol=1e-5)
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_c.grad, p_e.grad, atol=1e-5, rtol=1e-4, msg=name)
    stats = counter.stats()
    assert stats.frames >= 1 and stats.graphs >= 1 and stats.compile_s > 0  # it did compile
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # compiled in place, same names


@pytest.mark.parametrize("make", [_llama_gqa, _mistral_window], ids=["llama-gqa", "mistral-window"])
def test_packed_logits_under_compile_equal_each_document_alone(make):
    model = make()
    compile_layers(model, backend="aot_eager")
    batch = _batch(model, LENGTHS, seed=2, row=32, multiple=16)
    with torch.no_grad():
        packed = model(**forward_inputs(batch)).logits  # [R, L, V]
        p = batch.placements
        for row, offset, length in zip(p.row.tolist(), p.offset.tolist(), p.length.tolist()):
            ids = batch["input_ids"][row, offset : offset + length][None]
            alone = model(input_ids=ids, position_ids=torch.arange(length)[None], use_cache=False).logits[0]
            torch.testing.assert_close(packed[row, offset : offset + length], alone, atol=1e-5, rtol=1e-5)
    if make is _mistral_window:  # the window matters here: a document longer than it is in the batch
        assert max(LENGTHS) > model.config.sliding_window


def test_new_document_layouts_in_one_row_shape_compile_once():
    """Static shapes (dynamic=False): every batch below is one row of 64 tokens (rounded up), with a
    different number and length of documents; only the first batch compiles."""
    model = _gpt2()
    counter = compile_layers(model, backend="aot_eager", dynamic=False)
    layouts = [(20, 3, 13, 1, 17), (40, 9), (5, 5, 5, 5, 5, 5, 5, 5, 5), (50,)]
    seen = []
    for i, lengths in enumerate(layouts):
        batch = _batch(model, lengths, seed=i, multiple=64)
        assert batch["input_ids"].shape == (1, 64)
        _, loss = _loss(model, batch)
        loss.backward()
        seen.append(counter.stats())
    first = seen[0]  # its recompiles are frames that two callers share (transformers' deprecation wrapper)
    assert first.frames >= 1 and first.graphs >= 1
    assert all(s == dataclasses.replace(first, compile_s=s.compile_s) for s in seen[1:]), seen
    assert all(s.compile_s == first.compile_s for s in seen[1:])
    # a new row length is a new shape: static compiles again, a bounded number of frames
    _, loss = _loss(model, _batch(model, (70, 30), seed=9, multiple=64))
    loss.backward()
    again = counter.stats()
    assert again.recompiles > first.recompiles and first.frames < again.frames <= 2 * first.frames
    counter.close()


def test_boundaries_given_to_compiled_layers_are_still_checked():
    """The boundaries leave the compiled layer's arguments but not the checks: cu_seq_lens_q that
    disagree with position_ids are refused as in eager mode."""
    model = _gpt2()
    compile_layers(model, backend="aot_eager")
    batch = _batch(model, (5, 7, 4), seed=3)
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = torch.tensor([0, 6, 12, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="position_ids do not restart exactly where cu_seq_lens_q"):
        model(**forward_inputs(batch))


def test_no_decoder_layers_is_refused():
    class NoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    with pytest.raises(ValueError, match="compile_layers found no decoder layers in NoLayers"):
        compile_layers(NoLayers())
    with pytest.raises(ValueError, match="must be a torch.nn.Module"):
        compile_layers(object())
    model = _gpt2()
    assert decoder_layers(model) is model.transformer.h
    assert decoder_layers(_llama_gqa()) is not None
    compile_layers(model, backend="aot_eager")
    with pytest.raises(ValueError, match="decoder layer 0 of GPT2LMHeadModel is compiled already"):
        compile_layers(model, backend="aot_eager")


# --- the bench ----------------------------------------------------------------------------------


def test_compile_fields_round_trip_through_results_json(tmp_path):
    import dataclasses

    from conftest import make_results
    from padless.bench.report import format_summary_table
    from padless.bench.results import CompileRecord, load_results, save_results

    base = make_results(("padding", "packing"), steps=6)
    runs = {}
    for k, (name, run) in enumerate(base.strategies.items()):
        per_step = (2.5 + k, 0.0, 0.0, 0.4, 0.0, 0.0)  # compiled in steps 0 and 3
        record = CompileRecord(
            "static", "inductor", frames=4 + k, recompiles=1, backward_compiles=2, graphs=4, compile_s=sum(per_step)
        )
        runs[name] = dataclasses.replace(run, compiled=record, step_compile_s=per_step)
    results = dataclasses.replace(
        base, config=dataclasses.replace(base.config, compile="static", pad_to_multiple_of=64), strategies=runs
    )
    path = save_results(results, tmp_path / "results.json")
    loaded = load_results(path)
    assert loaded == results
    fig = loaded.figures()["packing"]
    run = loaded.strategies["packing"]
    quiet = [i for i in range(1, 6) if i != 3]  # after the 1 warm-up step, leaving out step 3 (it compiled)
    assert fig.compile_steps == 2
    assert fig.steady_real_tokens_per_s == pytest.approx(  # the median per-step rate of the quiet steps
        statistics.median(run.real_tokens[i] / run.step_time_s[i] for i in quiet)
    )
    table = format_summary_table(loaded)
    assert "steady tok/s" in table
    assert "static: 4 frames (1 recompiles), 2.9 s" in table and "static: 5 frames (1 recompiles), 3.9 s" in table
    # eager results (and files from before these fields) show no compile columns
    assert "steady tok/s" not in format_summary_table(base)
    assert load_results(save_results(base, tmp_path / "eager.json")).strategies["packing"].compiled is None


def test_compile_flags_are_checked():
    from padless.bench.config import RunConfig

    with pytest.raises(ValueError, match="compile 'fast'"):
        RunConfig(compile="fast")
    with pytest.raises(ValueError, match="pad_to_multiple_of must be set"):
        RunConfig(compile="static")
    with pytest.raises(ValueError, match="pad_to_multiple_of=0 must be >= 1"):
        RunConfig(pad_to_multiple_of=0)
    assert RunConfig(compile="static", pad_to_multiple_of=64).compile == "static"


def test_every_strategy_rounds_its_rows_the_same_way():
    from padless.bench.strategies import BENCH_STRATEGIES, BatchingOptions

    model = _gpt2()
    feats = make_features((20, 3, 13, 1, 17, 9, 30, 4), vocab_size=VOCAB, seed=4, with_labels=True)
    opts = BatchingOptions(batch_size=4, max_length=None, pad_token_id=0, vocab_size=VOCAB, pad_to_multiple_of=16)
    for name, strategy in BENCH_STRATEGIES.items():
        for batch in strategy.make_batcher(opts, model)(feats):
            assert batch["input_ids"].shape[1] % 16 == 0, name
    flat = BENCH_STRATEGIES["flattening"].make_batcher(opts, model)(feats[:4])[0]
    assert flat["input_ids"].shape == (1, 48)  # 20 + 3 + 13 + 1 = 37 tokens, then an 11-token pad document
    assert flat["position_ids"][0, 37:].tolist() == list(range(11))
    assert flat["labels"][0, 37:].tolist() == [-100] * 11


@pytest.mark.parametrize("name", ["padding", "packing"])
def test_bench_trains_the_same_compiled_and_records_the_compilations(name, monkeypatch):
    """``--compile static --pad-to-multiple-of 64``: the same losses step for step as eager (compile
    and rounding change the speed, not what is learned), and every step says what it compiled."""
    import numpy as np

    from padless.bench import train as bench_train
    from padless.bench.config import RunConfig
    from padless.bench.measure import StrategyRecorder
    from padless.bench.memory import PeakMemory
    from padless.bench.steps import same_example_steps

    monkeypatch.setattr(bench_train, "COMPILE_BACKEND", "aot_eager")  # graphs, not inductor's code
    feats = make_features(np.random.default_rng(1).integers(1, 40, 28), vocab_size=16, seed=1, with_labels=True)
    train, evals = feats[4:], feats[:4]
    base = dict(
        model="tiny-gpt2",
        data="-",
        strategies=(name,),
        steps=3,
        batch_size=6,
        max_length=64,
        warmup_steps=1,
        lr=1e-3,
        eval_examples=4,
        train_on="all",
        in_process=True,
    )
    steps = same_example_steps(len(train), 3, 6, 0)
    recs = {}
    for compiled in (False, True):
        cfg = RunConfig(**base, **({"compile": "static", "pad_to_multiple_of": 64} if compiled else {}))
        recs[compiled] = rec = StrategyRecorder()
        bench_train.train_strategy(
            name,
            cfg,
            train,
            evals,
            steps,
            device=torch.device("cpu"),
            dtype=torch.float32,
            pad_token_id=0,
            recorder=rec,
            memory=PeakMemory("cpu"),
            progress=False,
        )
    np.testing.assert_allclose(recs[True].loss, recs[False].loss, rtol=2e-5)
    np.testing.assert_allclose(
        [recs[True].eval_loss_start, recs[True].eval_loss_end],
        [recs[False].eval_loss_start, recs[False].eval_loss_end],
        rtol=2e-5,
    )
    run = recs[True].result(None, "vmhwm")
    assert run.compiled is not None and run.compiled.mode == "static" and run.compiled.frames > 0
    assert len(run.step_compile_s) == 3 and run.step_compile_s[0] > 0  # the first step compiled
    assert run.compiled.compile_s == pytest.approx(sum(run.step_compile_s))
    assert all(n % 64 == 0 for n in run.padded_tokens) and recs[False].result(None, "vmhwm").compiled is None


# ------------------------------------------------- flash_attention_2: the boundaries stay out of the graph


def _fake_flash(calls):
    """transformers' flash_attention_2 function as far as packing goes, on a CPU: attention inside the
    documents of ``cu_seq_lens_q`` (padless' varlen kernel), refusing a call that lacks them."""
    from padless.attention.varlen import varlen_attention

    def flash(module, query, key, value, attention_mask, scaling=None, **kwargs):
        calls.append(sorted(k for k in kwargs if k.startswith(("cu_seq", "max_length"))))
        if kwargs.get("cu_seq_lens_q") is None:
            raise AssertionError("flash_attention_2 was called without cu_seq_lens_q: documents would mix")
        b, h, n, d = query.shape
        flat = lambda t: t.transpose(1, 2).reshape(b * n, t.shape[1], d)  # noqa: E731
        out = varlen_attention(flat(query), flat(key), flat(value), kwargs["cu_seq_lens_q"], scale=scaling)
        return out.reshape(b, n, h, d), None

    return flash


@pytest.fixture
def fake_flash(monkeypatch):
    import padless.models.compile as compile_module

    compile_module.route_flash_attention()
    calls: list = []
    monkeypatch.setattr(compile_module, "_FLASH_ORIGINAL", [_fake_flash(calls)])
    return calls


def test_the_flash_wrapper_takes_the_boundaries_out_and_hands_them_to_flash(fake_flash):
    import types

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import padless.models.compile as compile_module

    q = torch.randn(1, 2, 6, 4)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    seen = {}

    def compiled_layer(hidden, **kwargs):  # what the compiled layer gets, and the flash call inside it
        seen.update(kwargs)
        return ALL_ATTENTION_FUNCTIONS["flash_attention_2"](None, q, q, q, None, position_ids=kwargs["position_ids"])

    call = compile_module._boundaries_out_of_graph(
        compiled_layer, types.SimpleNamespace(_attn_implementation="flash_attention_2")
    )
    pos = torch.tensor([[0, 1, 0, 1, 2, 3]])
    call(q, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    assert set(seen) == {"position_ids"}  # no boundary kwarg reaches the compiled graph
    assert fake_flash == [["cu_seq_lens_k", "cu_seq_lens_q", "max_length_k", "max_length_q"]]  # flash still gets them
    assert compile_module._FLASH_SENT == [] and compile_module._FLASH_ACTIVE == [False]
    with pytest.raises(ValueError, match="both cu_seq_lens_q and cu_seq_lens_k, or neither"):
        call(q, position_ids=pos, cu_seq_lens_q=cu)
    # outside a compiled layer's call the registered function is transformers' own, kwargs untouched
    with pytest.raises(AssertionError, match="without cu_seq_lens_q"):
        ALL_ATTENTION_FUNCTIONS["flash_attention_2"](None, q, q, q, None, position_ids=pos)


def test_flash_layers_compile_once_for_new_document_layouts(fake_flash):
    """A Llama on (faked) flash_attention_2, static shapes: batches of one 64-token row with different
    documents compile only the first time, and compute what the eager padless model computes."""
    model = _llama_gqa()
    eager = copy.deepcopy(model)
    model.config._attn_implementation = "flash_attention_2"
    counter = compile_layers(model, backend="aot_eager", dynamic=False)
    seen = []
    for i, lengths in enumerate([(20, 3, 13, 1, 17), (40, 9), (5, 5, 5, 5, 5, 5, 5, 5, 5), (50,)]):
        batch = _batch(eager, lengths, seed=i, multiple=64)
        assert batch["input_ids"].shape == (1, 64)
        with torch.no_grad():
            torch.testing.assert_close(
                model(**forward_inputs(batch)).logits, eager(**forward_inputs(batch)).logits, atol=1e-5, rtol=1e-5
            )
        seen.append(counter.stats())
    assert seen[0].frames >= 1
    assert all(s.frames == seen[0].frames and s.recompiles == seen[0].recompiles for s in seen[1:]), seen
    assert len(fake_flash) == 4 * model.config.num_hidden_layers and all(fake_flash)
    counter.close()
