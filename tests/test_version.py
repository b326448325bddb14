"""``padless.__version__`` comes from the package metadata, with the source tree's pyproject.toml as
the fallback, and every module reads it from ``padless._version``."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import padless
from padless import _version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_version_is_the_metadata_one_and_the_pyprojects() -> None:
    assert padless.__version__ == _version.__version__ == metadata.version("padless")
    if PYPROJECT.is_file():  # a source checkout: metadata and pyproject.toml agree
        assert _version.source_tree_version(PYPROJECT) == padless.__version__


def test_without_metadata_the_source_trees_pyproject_gives_it(tmp_path: Path) -> None:
    toml = tmp_path / "pyproject.toml"
    toml.write_text(
        '[build-system]\nrequires = ["x"]\n\n[project]\nname = "p"\nversion = "9.8.7rc1"\n\n[tool.y]\nversion = "1"\n'
    )
    assert _version.read_version("no-such-distribution-padless", toml) == "9.8.7rc1"
    toml.write_text('[tool.y]\nversion = "1"\n')  # a version outside [project] is not the package's
    assert _version.read_version("no-such-distribution-padless", toml) == _version.UNKNOWN
    assert _version.read_version("no-such-distribution-padless", tmp_path / "absent.toml") == _version.UNKNOWN


def test_the_cli_prints_it(capsys) -> None:
    from padless.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"padless {padless.__version__}"


def test_it_is_read_on_first_use_not_at_import() -> None:
    code = (
        "import sys, padless; before = 'importlib.metadata' in sys.modules; v = padless.__version__; "
        "print(before, 'importlib.metadata' in sys.modules, v)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", padless.__version__]
