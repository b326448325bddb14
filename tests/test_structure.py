"""The shape of the package: the 0.1.0 public API still imports from ``padless``, only ``padless.cli``
parses flags and prints, and no two modules import each other (directly or round a longer loop).

The checks read the source with ``ast`` (nothing is executed but the public-API imports), so a
function-level import counts as much as a module-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import padless

SRC = Path(padless.__file__).resolve().parent
PACKAGE = "padless"

PUBLIC_API_0_1_0 = (
    # the 0.1.0 names (the keys of padless 0.1.0's top-level exports), frozen here
    "plan_packs", "PackPlan", "PlanStats", "STRATEGIES", "OVERLONG_POLICIES", "validate_lengths",
    "summarize_lengths", "LengthSummary", "padding_fraction_pad_to_longest", "padding_fraction_bucketed",
    "synthetic_lengths", "IGNORE_INDEX", "position_ids_from_lengths", "cu_seqlens_from_lengths",
    "document_ids_from_lengths", "lengths_from_position_ids", "block_causal_mask", "additive_block_causal_mask",
    "PaddingCollator", "PackingCollator", "FeatureSpec", "LengthGroupedBatchSampler", "PackedRows",
    "causal_lm_loss", "model_loss", "step_num_items", "trained_tokens", "verify_isolation", "VerifyReport",
    "TOLERANCES", "register_padless_attention", "resolve_backend", "backend_inputs", "varlen_attention",
    "reference_varlen_attention", "padless_attention", "packed_documents", "BACKENDS", "load_tokenizer",
    "load_corpus", "corpus_lengths", "TokenizedCorpus", "CorpusReport", "CORPORA", "RecordError",
    "PackedStream", "PackedIterableDataset", "StreamOptions", "compare_stream_to_offline", "pack_to_parquet",
    "DistributedPackedBatchSampler", "PackedRowView", "schedule_epoch", "world_info", "build_model",
    "load_tokenizer_for", "tokenizer_name_for", "BenchResults", "load_results", "write_report",
)  # fmt: skip
PUBLIC_API_ADDED = (
    # names added after 0.1.0
    "compile_layers",
    "init_distributed",
    "shard_model",
    "sync_gradients",
    "full_tensors",
)

# Modules outside cli/ that still print, each with why; the test fails for any other, and for one of
# these that no longer prints (so the list cannot go stale).
KNOWN_PRINTERS: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its ``__init__``)."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in MODULES.items()}


def _lazy_exports(package: str) -> dict[str, str]:
    """``_EXPORTS`` (public name -> defining module) of a package with lazy re-exports, or {}."""
    for node in TREES[package].body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
                return ast.literal_eval(node.value)  # type: ignore[arg-type]
    return {}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks (never executed, so no import edge)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def _resolve(module: str, level: int, importer: str) -> str:
    if not level:
        return module
    base = importer.split(".")
    if not MODULES[importer].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _edges(name: str, *, type_checking: bool = False) -> set[str]:
    """padless modules that ``name`` imports, anywhere in its body (functions included); with
    ``type_checking``, those imported only for type checkers (``if TYPE_CHECKING:``) too.

    ``from pkg import sub`` is an edge to the submodule; ``from pkg import X`` where ``pkg`` re-exports
    ``X`` lazily is an edge to the module that defines ``X``. The implicit import of parent packages is
    not an edge (their ``__init__`` only re-exports lazily)."""
    tree, skip = TREES[name], set() if type_checking else _type_checking_nodes(TREES[name])
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, name)
            if base.split(".")[0] != PACKAGE:
                continue
            lazy = _lazy_exports(base) if base in MODULES else {}
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    out.add(f"{base}.{alias.name}")
                elif alias.name in lazy:
                    out.add(lazy[alias.name])
                else:
                    out.add(base)
    out.discard(name)
    return {m for m in out if m in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


@pytest.mark.parametrize("name", PUBLIC_API_0_1_0 + PUBLIC_API_ADDED)
def test_every_listed_public_name_imports_from_padless(name: str) -> None:
    if name in padless.__all__:
        assert getattr(padless, name) is not None
    else:  # moved to its subpackage (tests/test_api.py): still resolves, with a warning naming its home
        with pytest.warns(DeprecationWarning, match=f"padless.{name} moved: import it from padless"):
            assert getattr(padless, name) is not None


def test_only_cli_parses_flags_and_prints() -> None:
    argparse_users, printers = [], set()
    for name, tree in TREES.items():
        if name == "padless.cli" or name.startswith("padless.cli."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
                argparse_users.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
                argparse_users.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Name) and node.id == "print":  # a call, or print passed as a logger
                printers.add(name)
    assert argparse_users == [], f"argparse outside padless.cli: {argparse_users}"
    assert printers - set(KNOWN_PRINTERS) == set(), "print outside padless.cli"
    assert set(KNOWN_PRINTERS) - printers == set(), "listed in KNOWN_PRINTERS but no longer prints: drop it"


def test_the_package_has_no_import_cycle() -> None:
    """No loop of imports, counting the imports made only for type checkers: ``if TYPE_CHECKING:``
    with a function-level import back hides a cycle from Python but not from the design (planning's
    ``costs`` and ``plan`` were one such pair). The top-level package is left out of the type-checking
    edges: its ``TYPE_CHECKING`` block names every public export for static analysis only."""
    graph = {name: _edges(name, type_checking=name != PACKAGE) for name in MODULES}
    assert graph["padless.data.corpora"] and graph["padless.export.parquet"]  # the graph is not empty
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_test_sees_imports_made_for_type_checkers() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from padless.planning.plan import PackPlan\n"
    )
    TREES["padless.planning.checks"], saved = tree, TREES["padless.planning.checks"]
    try:
        assert "padless.planning.plan" not in _edges("padless.planning.checks")
        assert _edges("padless.planning.checks", type_checking=True) == {"padless.planning.plan"}
    finally:
        TREES["padless.planning.checks"] = saved


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


FLOOR = {
    "padless.layout",
    "padless.devices",
    "padless.atomic",
    "padless._optional",
    "padless.hub",
    "padless._lazy",
    "padless._version",
}
"""Top-level modules every stage may import: they import nothing of padless but each other."""

MAY_IMPORT: dict[str, set[str]] = {
    # stage -> the stages (besides the floor and itself) it may import; a stage is a folder of padless
    "planning": set(),
    "data": {"planning"},
    "attention": {"planning"},
    "batching": {"planning", "attention"},
    "models": {"attention", "data"},
    "objectives": {"planning", "attention", "batching", "models"},
    "isolation": {"planning", "attention", "batching", "objectives", "models", "data"},
    "export": {"planning", "data", "batching"},
    "integrations": {"planning", "data", "attention", "batching", "objectives", "isolation", "models", "export"},
    "bench": {
        "planning",
        "data",
        "attention",
        "batching",
        "objectives",
        "isolation",
        "models",
        "export",
        "integrations",
    },
}
"""The data flow of DESIGN.md: data and planning at the bottom, the model-facing stages above them,
bench and cli (which may import anything) on top. Nothing imports a stage above it."""

MAX_TOP_LEVEL_MODULES = 9


def _stage(module: str) -> str:
    parts = module.split(".")
    return (
        module
        if len(parts) == 2 and f"{module}" in MODULES and not MODULES[module].name == "__init__.py"
        else ".".join(parts[:2])
    )


def test_the_top_level_holds_few_modules() -> None:
    top = sorted(p.stem for p in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top of src/padless: {top}"


def test_no_stage_imports_a_stage_above_it() -> None:
    graph = {name: _edges(name) for name in MODULES}
    wrong = []
    for name, targets in graph.items():
        src = _stage(name)
        for target in targets:
            dst = _stage(target)
            if src == dst or dst in FLOOR:
                continue
            if target == PACKAGE:  # the top of the package, from below: its __version__ is padless._version's
                wrong.append(f"{name} imports {target} (the top-level package)")
                continue
            if src in FLOOR:
                wrong.append(f"{name} (floor) imports {target}")
                continue
            stage, other = src.removeprefix("padless."), dst.removeprefix("padless.")
            if stage in MAY_IMPORT and other not in MAY_IMPORT[stage]:
                wrong.append(f"{name} imports {target}")
    assert set(MAY_IMPORT) | {"cli"} >= {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert wrong == [], "imports against the data flow:\n" + "\n".join(sorted(wrong))


def test_no_module_imports_another_folders_private_names() -> None:
    wrong = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _resolve(node.module or "", node.level, name)
            if base.split(".")[0] != PACKAGE or _stage(base) == _stage(name):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private or any(p.startswith("_") and not p.startswith("__") for p in base.split(".")[1:]):
                    if base not in ("padless._optional", "padless._lazy", "padless._version"):
                        wrong.append(f"{name}:{node.lineno} imports {base}.{alias.name}")
    assert wrong == [], "private names imported across folders:\n" + "\n".join(wrong)


TEST_HOMES: dict[str, str] = {
    # module -> the test file that covers it, where the mirrored name (tests/<folder>/test_<module>.py) is not it
    "padless._optional": "integrations/test_packaging.py",
    "padless._lazy": "test_api.py",
    "padless._version": "test_version.py",
    "padless.hub": "cli/test_bad_input.py",
    "padless.attention.backend": "attention/test_varlen.py",
    "padless.attention.multimodal": "batching/test_vision.py",
    "padless.attention.backend_table": "attention/test_windows.py",
    "padless.attention.rules": "attention/test_windows.py",
    "padless.attention.select": "attention/test_windows.py",
    "padless.attention.tree": "batching/test_preference.py",
    "padless.attention.verdict": "attention/test_facts.py",
    "padless.batching.groups": "batching/test_preference.py",
    "padless.batching.rollouts": "batching/test_rollout_inputs.py",  # also test_preference.py
    "padless.batching.rows": "batching/test_distributed.py",
    "padless.batching.weights": "objectives/test_loss_weighting.py",
    "padless.bench.child": "bench/test_bench.py",
    "padless.bench.config": "bench/test_bench.py",
    "padless.bench.figures": "bench/test_report.py",
    "padless.bench.plots": "bench/test_figures.py",
    "padless.bench.captions": "bench/test_vlm_preset.py",
    "padless.bench.flops": "bench/test_bench.py",
    "padless.bench.isolate": "bench/test_bench.py",
    "padless.bench.memory": "bench/test_measure.py",
    "padless.bench.results": "bench/test_report.py",
    "padless.bench.run": "bench/test_bench.py",
    "padless.bench.schema": "bench/test_report.py",
    "padless.bench.steps": "bench/test_bench.py",
    "padless.bench.strategies": "bench/test_bench.py",
    "padless.bench.timing": "bench/test_measure.py",
    "padless.bench.train": "bench/test_bench.py",
    "padless.data.agentic": "data/test_corpora.py",
    "padless.data.bfcl": "data/test_corpora.py",
    "padless.data.cache": "data/test_files.py",
    "padless.data.encode": "data/test_chat.py",
    "padless.data.load": "data/test_corpora.py",
    "padless.data.raw": "data/test_corpora.py",
    "padless.data.records": "data/test_files.py",
    "padless.export.parquet": "cli/test_pack.py",
    "padless.export.engine": "export/test_engine.py",
    "padless.export.stages": "export/test_resume.py",
    "padless.export.state": "export/test_resume.py",
    "padless.data.inputs": "export/test_inputs.py",
    "padless.integrations.dataset_plans": "integrations/test_datasets.py",
    "padless.integrations.datasets_stream": "integrations/test_datasets.py",
    "padless.integrations.trl_rl": "integrations/test_trl_grpo.py",  # also test_trl_dpo.py, test_trl_grpo_tools.py
    "padless.isolation.audit": "integrations/test_exactness.py",
    "padless.isolation.report": "isolation/test_verify.py",
    "padless.isolation.runs": "isolation/test_verify.py",
    "padless.models.fsdp": "integrations/test_fsdp.py",
    "padless.objectives.dpo": "batching/test_preference.py",
    "padless.objectives.grpo_config": "objectives/test_grpo.py",
    "padless.planning._binpack": "planning/test_plan.py",
    "padless.planning._costpack": "planning/test_costs.py",
    "padless.planning.items": "planning/test_plan.py",
    "padless.planning.buffered": "batching/test_stream.py",
    "padless.planning.checks": "planning/test_plan.py",
    "padless.planning.schedule": "batching/test_distributed.py",
}


def test_every_module_has_a_test_home() -> None:
    tests = SRC.parents[1] / "tests"
    if not tests.is_dir():
        pytest.skip("the tests folder is not beside src (an installed package)")
    assert set(TEST_HOMES) <= set(MODULES), f"TEST_HOMES names modules that are gone: {set(TEST_HOMES) - set(MODULES)}"
    missing = []
    for name, path in MODULES.items():
        if path.name in ("__init__.py", "__main__.py") or name.startswith("padless.cli"):
            continue
        rel = path.relative_to(SRC)
        home = TEST_HOMES.get(name) or str(Path(*rel.parts[:-1], f"test_{rel.stem.lstrip('_')}.py"))
        if not (tests / home).is_file():
            missing.append(f"{name}: no {home}")
    assert missing == [], "modules without a test home (add the test file or a TEST_HOMES entry):\n" + "\n".join(
        missing
    )


def test_every_package_docstring_names_its_modules() -> None:
    """A package's docstring says in a line what each of its modules is for: a module added without
    a line there fails here, so the folder's map cannot drift from the folder."""
    unnamed = []
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name in (PACKAGE, "padless.cli"):
            continue  # the top-level API and the subcommand table describe themselves
        doc = ast.get_docstring(TREES[name]) or ""
        for module in sorted(p.stem for p in path.parent.glob("*.py") if p.stem not in ("__init__", "__main__")):
            if f"``{module}``" not in doc and f"padless.{name.split('.', 1)[1]}.{module}" not in doc:
                unnamed.append(f"{name}: {module}")
    assert unnamed == [], "modules that their package's docstring does not name (as ``module``):\n" + "\n".join(unnamed)


MAX_MODULE_LINES = 500
"""One module per concept: a module over this many lines holds more than one (split it by concept)."""

OVER_MAX_LINES_PENDING: set[str] = set()
"""Modules allowed over the limit while a split is under way (none now)."""


def test_no_module_is_over_max_lines() -> None:
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    over = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert set(over) - OVER_MAX_LINES_PENDING == set(), f"modules over {MAX_MODULE_LINES} lines: {over}"
    assert OVER_MAX_LINES_PENDING - set(over) == set(), "OVER_MAX_LINES_PENDING lists modules no longer over: drop them"
