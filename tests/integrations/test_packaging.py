"""Packaging: the core needs numpy, torch and transformers; everything else is an extra that no core module
imports at import time, and a missing one is named in the error; scripts/setup.sh stops on a failed step and
installs every extra (so the TRL tests run); TRL is pinned."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUP = ROOT / "scripts" / "setup.sh"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0].lower()


def test_core_dependencies_are_what_the_core_needs():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert core == {"numpy", "torch", "transformers", "safetensors", "tqdm", "pyyaml"}


def test_every_optional_package_belongs_to_the_extra_its_error_names():
    from padless._optional import DISTRIBUTIONS, EXTRAS

    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"data", "bench", "trainer", "trl", "all", "dev"} <= set(extras)
    for package, extra in EXTRAS.items():
        assert DISTRIBUTIONS.get(package, package) in {_name(r) for r in extras[extra]}, (package, extra)
    assert set(re.search(r"\[(.*)\]", extras["all"][0]).group(1).split(",")) == set(extras) - {"all", "dev"}


def test_trl_is_pinned_and_the_pin_is_what_runs():
    import importlib.metadata

    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert pins["trl"] == "1.16.0"
    trl_range = next(r for r in PYPROJECT["project"]["optional-dependencies"]["trl"] if _name(r) == "trl")
    assert trl_range == "trl>=1.16,<1.17"
    try:
        assert importlib.metadata.version("trl") == pins["trl"]
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - setup.sh installs it
        raise AssertionError("trl is not installed: run scripts/setup.sh") from None


BLOCKED = ("datasets", "pyarrow", "matplotlib", "gguf", "accelerate", "trl")

_WITHOUT_EXTRAS = """
import importlib, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None  # any import of it now raises ImportError
import padless
skipped = {{"padless.integrations.transformers", "padless.integrations.first_step", "padless.integrations.trl",
           "padless.integrations.trl_rl", "padless.integrations.trl_logprobs", "padless.integrations.trl_grpo",
           "padless.integrations.trl_dpo", "padless.integrations.sft_records"}}  # they need their extra
for info in pkgutil.walk_packages(padless.__path__, "padless."):
    if info.name not in skipped and not info.name.endswith("__main__"):  # __main__ runs the CLI
        importlib.import_module(info.name)
for name in skipped:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        print(name, "->", exc)
try:
    padless.pack_dataset([], 8)
except ImportError as exc:
    print("pack_dataset ->", exc)
from padless.data.files import _read_datasets
try:
    _read_datasets("x", "train")
except ImportError as exc:
    print("_read_datasets ->", exc)
"""


def test_no_core_module_imports_an_extra_and_a_missing_extra_is_named():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS.format(blocked=BLOCKED)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" -> ", 1) for line in out.stdout.splitlines())
    assert "pip install 'padless[trainer]'" in lines["padless.integrations.transformers"]
    assert "'trl'" in lines["padless.integrations.trl"] or "'accelerate'" in lines["padless.integrations.trl"]
    assert "pip install 'padless[trl]'" in lines["padless.integrations.trl_rl"]
    assert "pip install 'padless[trainer]'" in lines["padless.integrations.first_step"]
    for name in ("trl_logprobs", "trl_grpo", "trl_dpo"):
        assert "pip install 'padless[trl]'" in lines[f"padless.integrations.{name}"]
    assert "pip install 'padless[data]'" in lines["pack_dataset"]
    assert "reading a datasets folder" in lines["_read_datasets"] and "padless[data]" in lines["_read_datasets"]


def _pip_wrapper(tmp_path: Path, fake_status: int) -> subprocess.CompletedProcess:
    """setup.sh's ``pip`` function, run against a fake ``.venv/bin/python`` exiting with ``fake_status``."""
    wrapper = re.search(r"^pip\(\) \{.*?^\}", SETUP.read_text(), flags=re.S | re.M).group(0)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho 'ERROR: no matching distribution'\nexit {fake_status}\n")
    fake.chmod(0o755)
    script = textwrap.dedent(f"""
        set -euo pipefail
        {wrapper}
        pip install something
        echo "reached the next step"
    """)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)


def test_setup_script_stops_when_an_install_step_fails(tmp_path):
    failed = _pip_wrapper(tmp_path / "a", 3)
    assert failed.returncode == 3 and "reached the next step" not in failed.stdout
    assert "'pip install something' failed with exit status 3" in failed.stderr
    ok = _pip_wrapper(tmp_path / "b", 0)
    assert ok.returncode == 0 and "reached the next step" in ok.stdout


def test_setup_script_installs_every_extra_under_the_constraints():
    text = SETUP.read_text()
    assert 'pip install -c constraints.txt -e ".[dev,all]"' in text
    assert "set -euo pipefail" in text
