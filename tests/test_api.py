"""The public API: every name in ``padless.__all__`` resolves, and ``import padless`` is light."""

import subprocess
import sys

import padless


def test_every_public_name_resolves():
    for name in padless.__all__:
        assert getattr(padless, name) is not None, name


def test_unknown_name_raises_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        padless.nope  # noqa: B018


def test_import_does_not_load_torch():
    code = "import sys, padless; padless.plan_packs([3, 4], 8); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_help_lists_every_command():
    from padless.cli import COMMANDS, build_parser

    text = build_parser([]).format_help()
    assert all(name in text for name in COMMANDS)


def test_the_static_imports_name_the_same_table():
    """The ``TYPE_CHECKING`` imports (what type checkers and editors see) and ``_EXPORTS`` (what
    ``padless.X`` resolves at run time) list the same names from the same modules."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(padless.__file__).read_text())
    static = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for stmt in node.body:
                static.update({alias.name: stmt.module for alias in stmt.names})
    assert static == padless._EXPORTS
