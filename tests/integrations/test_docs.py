"""Every page under docs/integrations/ runs: its ```python blocks, in order, as one script (tiny models,
offline, a couple of steps), in a scratch directory."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

DOCS = support.ROOT / "docs" / "integrations"
PAGES = ("trainer.md", "trl.md", "trl_rl.md", "accelerate.md", "pytorch.md", "exactness.md", "fsdp.md")
UNDER_TORCHRUN = ("fsdp.md",)
"""Pages whose snippet needs a process group: tests/integrations/test_fsdp.py runs them under torchrun."""
RUN_ELSEWHERE = ("trl_rl.md",)
"""Pages whose snippet another test runs with what it needs: tests/integrations/test_trl_grpo.py (a
tiny tokenizer built in code, HF generate)."""


def code_of(page: Path) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    assert blocks, f"{page} has no python block"
    return "\n".join(blocks)


def test_every_page_is_listed():
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(PAGES)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("page", [p for p in PAGES if p not in UNDER_TORCHRUN + RUN_ELSEWHERE])
def test_page_snippet_runs(page, tmp_path, monkeypatch, capsys):
    if page in ("trl.md", "exactness.md"):
        pytest.importorskip("trl")
    if page in ("trainer.md", "accelerate.md"):
        pytest.importorskip("accelerate")
    support.offline_hub()
    monkeypatch.chdir(tmp_path)
    source = code_of(DOCS / page)
    assert support.TINY_MODEL in source or "tiny-" in source  # tiny models only: the snippets run in CI
    exec(compile(source, str(DOCS / page), "exec"), {"__name__": "__doc_snippet__"})
    out = capsys.readouterr().out
    if page in ("trainer.md", "trl.md"):
        assert re.search(r"^2 steps, loss \d+\.\d+$", out, flags=re.M), out
    if page in ("accelerate.md", "pytorch.md"):
        assert re.search(r"^step 2: \d+ trained tokens$", out, flags=re.M), out
