"""The public face: ``padless.__all__`` holds what a user needs (about 30 names), each resolves without a
warning, every 0.1.0 name still resolves (a moved one with a ``DeprecationWarning`` naming its home),
and ``import padless`` is light."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import padless
from padless._lazy import lazy_exports

_OLD_BY_MODULE = {
    # the 0.1.0 names (the top level of padless 0.1.0, before it shrank), frozen here: module -> the names
    # it gave ``padless``
    "padless.planning.buffered": "compare_stream_to_offline StreamOptions",
    "padless.planning.lengths": (
        "LengthSummary padding_fraction_bucketed padding_fraction_pad_to_longest summarize_lengths "
        "synthetic_lengths"
    ),
    "padless.planning.plan": "OVERLONG_POLICIES PackPlan plan_packs PlanStats STRATEGIES validate_lengths",
    "padless.planning.schedule": "schedule_epoch",
    "padless.layout": (
        "cu_seqlens_from_lengths document_ids_from_lengths IGNORE_INDEX lengths_from_position_ids "
        "position_ids_from_lengths"
    ),
    "padless.attention.backend": "packed_documents padless_attention register_padless_attention",
    "padless.attention.mixers": (
        "enable_per_document_mixers disable_per_document_mixers mixer_layers mixer_refusal MixerInfo"
    ),
    "padless.attention.masks": "additive_block_causal_mask block_causal_mask",
    "padless.attention.select": "backend_inputs BACKENDS check_exact resolve_backend",
    "padless.attention.accept": "check_batch",
    "padless.attention.tree": "additive_tree_mask shared_prompt_refusal tree_attention",
    "padless.attention.varlen": "reference_varlen_attention varlen_attention",
    "padless.batching.collate": "PackingCollator PaddingCollator",
    "padless.batching.preference": "PreferenceCollator RolloutCollator share_prompt",
    "padless.batching.rowformat": "check_collator FeatureSpec RowFormat",
    "padless.batching.rows": "PackedRows PackedRowView",
    "padless.batching.samplers": "DistributedPackedBatchSampler LengthGroupedBatchSampler world_info",
    "padless.batching.stream": "PackedIterableDataset PackedStream",
    "padless.objectives.dpo": "dpo_loss",
    "padless.objectives.evaluation": "EvalLoss packed_eval_loss",
    "padless.objectives.grpo": "grpo_loss GRPOLossConfig GRPOLossResult",
    "padless.objectives.logprobs": "sequence_logprobs",
    "padless.objectives.loss": "causal_lm_loss model_loss step_num_items trained_tokens",
    "padless.isolation.guard": "IsolationError IsolationGuard",
    "padless.isolation.verify": "TOLERANCES verify_isolation VerifyReport",
    "padless.data.corpora": "CORPORA",
    "padless.data.load": "corpus_lengths CorpusReport load_corpus TokenizedCorpus",
    "padless.data.records": "RecordError",
    "padless.data.tokenizer": "load_tokenizer",
    "padless.export.parquet": "pack_to_parquet",
    "padless.integrations.datasets": "pack_dataset",
    "padless.models.compile": "compile_layers",
    "padless.models.factory": "build_model load_tokenizer_for tokenizer_name_for",
    "padless.models.fsdp": "full_tensors init_distributed shard_model sync_gradients",
    "padless.bench.report": "write_report",
    "padless.bench.results": "BenchResults load_results",

}  # fmt: skip
OLD_TABLE = {name: module for module, names in _OLD_BY_MODULE.items() for name in names.split()}
"""0.1.0 top-level name -> the module that defines it (90 names)."""

CHECKED_FROM_OUTSIDE = ("pack_dataset", "sequence_logprobs", "PreferenceCollator", "grpo_loss", "RolloutCollator",
                        "check_batch", "verify_isolation")  # fmt: skip
"""Names outside checks call as ``padless.X``: they stay at the top."""


def _home_object(name: str, module: str):
    return getattr(importlib.import_module(module), name)


def test_the_top_level_is_small_and_keeps_what_outside_checks_call():
    assert len(OLD_TABLE) == 90
    assert 25 <= len(padless._EXPORTS) <= 35, len(padless._EXPORTS)
    assert set(CHECKED_FROM_OUTSIDE) <= set(padless._EXPORTS)
    assert padless.__all__ == sorted([*padless._EXPORTS, "__version__"])


def test_the_tables_split_the_0_1_0_names():
    """Every 0.1.0 name is kept or moved (not both, none lost), and keeps the module that defines it."""
    assert set(padless._EXPORTS).isdisjoint(padless._MOVED)
    assert {**padless._EXPORTS, **padless._MOVED} == OLD_TABLE


def test_every_kept_name_resolves_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, module in padless._EXPORTS.items():
            assert getattr(padless, name) is _home_object(name, module), name


@pytest.mark.parametrize("name", sorted(OLD_TABLE))
def test_every_0_1_0_name_resolves(name):
    """A kept name resolves silently; a moved one warns naming its home, from the caller's line
    (stacklevel), on every access, and gives the home's object."""
    module = OLD_TABLE[name]
    if name in padless.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert getattr(padless, name) is _home_object(name, module)
        return
    assert padless._MOVED[name] == module
    for _ in range(2):  # not cached: the second use is told too
        with pytest.warns(DeprecationWarning) as record:
            value = getattr(padless, name)
        assert [str(w.message) for w in record] == [
            f"padless.{name} moved: import it from {module} (padless.{name} is deprecated)"
        ]
        assert record[0].filename == __file__
        assert value is _home_object(name, module)


def test_from_padless_import_a_moved_name_warns_at_the_import_line():
    home = r"padless\.shard_model moved: import it from padless\.models\.fsdp"
    with pytest.warns(DeprecationWarning, match=home) as record:
        from padless import shard_model
    from padless.models.fsdp import shard_model as home

    assert shard_model is home
    assert {w.filename for w in record} == {__file__}


def test_dir_and_all_list_only_the_kept_names():
    assert dir(padless) == padless.__all__
    assert not set(padless.__all__) & set(padless._MOVED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict = {}
        exec("from padless import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(padless.__all__)


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="module 'padless' has no attribute 'nope'"):
        padless.nope  # noqa: B018
    with pytest.raises(AttributeError, match="module 'padless.data' has no attribute 'nope'"):
        padless.data.nope  # noqa: B018


def test_the_data_package_uses_the_same_mechanism():
    import padless.data

    assert padless.data.__all__ == sorted(padless.data._EXPORTS) == dir(padless.data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, module in padless.data._EXPORTS.items():
            assert getattr(padless.data, name) is _home_object(name, module), name
    assert padless.data.__getattr__.__module__ == padless.__getattr__.__module__ == "padless._lazy"


def test_lazy_exports_refuses_a_name_both_public_and_moved():
    with pytest.raises(ValueError, match=r"moved: \['x'\] are also in table"):
        lazy_exports("pkg", {"x": "pkg.a"}, moved={"x": "pkg.b"})
    getattr_, dir_, all_ = lazy_exports("pkg", {"y": "pkg.a"}, moved={"x": "pkg.b"}, extra=["__version__"])
    assert all_ == dir_() == ["__version__", "y"]
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'z'"):
        getattr_("z")


def test_import_does_not_load_torch():
    code = "import sys, padless; padless.plan_packs([3, 4], 8); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_help_lists_every_command():
    from padless.cli import COMMANDS, build_parser

    text = build_parser([]).format_help()
    assert all(name in text for name in COMMANDS)


@pytest.mark.parametrize("package", [padless, "padless.data"])
def test_the_static_imports_name_the_same_table(package):
    """The ``TYPE_CHECKING`` imports (what type checkers and editors see) and ``_EXPORTS`` (what
    ``padless.X`` resolves at run time) list the same names from the same modules; the moved names
    are not there, so an editor does not offer them."""
    import ast

    package = importlib.import_module(package) if isinstance(package, str) else package
    tree = ast.parse(Path(package.__file__).read_text())
    static = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for stmt in node.body:
                static.update({alias.name: stmt.module for alias in stmt.names})
    assert static == package._EXPORTS


PAGE = Path(__file__).resolve().parents[1] / "docs" / "packed-rows.md"


def _page_blocks() -> list[str]:
    import re

    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def test_the_packed_rows_page_is_linked_from_the_readme_and_shows_only_public_names():
    import re

    readme = (PAGE.parents[1] / "README.md").read_text()
    read_on = readme.split("## Read on", 1)[1]
    assert len([line for line in read_on.splitlines() if "(docs/packed-rows.md)" in line]) == 1
    ways = ("PackingCollator", "PackedRows", "PackedRowView", "DistributedPackedBatchSampler", "PackedStream",
            "PackedIterableDataset", "pack_dataset", "pack_to_parquet", "PackedTrainer", "SFTTrainer")  # fmt: skip
    table = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    assert all(any(f"`{way}`" in row for row in table) for way in ways)
    used = set(re.findall(r"\bpadless\.(\w+)", "\n".join(_page_blocks())))
    assert used and used - {"integrations"} <= set(padless.__all__), used - set(padless.__all__)


def test_the_packed_rows_page_snippets_run(tmp_path, monkeypatch):
    """The page's snippets, in order, as one script (the trainers' apart: their pages run them); each
    way's loader gives a batch the model's exactness check accepts."""
    pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    namespace: dict = {"__name__": "__packed_rows_page__"}
    shapes = []
    for block in _page_blocks():
        if "Trainer(" in block:
            continue
        exec(compile(block, str(PAGE), "exec"), namespace)
        if "loader" in namespace:
            batch = next(iter(namespace.pop("loader")))
            padless.check_batch(namespace["model"], batch)
            shapes.append(tuple(batch["input_ids"].shape))
    assert len(shapes) == 6 and all(width <= 256 for _, width in shapes), shapes
