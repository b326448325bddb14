"""The benchmark figures of docs/results.md and the README's headline come from the committed runs in
docs/bench, not from memory: each headline ratio and each table row is recomputed here from that run's
results.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from padless.bench.results import load_results

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()

# run folder -> the results page's sentence for its headline, with the figures left as fields
HEADLINES = {
    "docs/bench": "**padless packing: {over_strongest}x the real tokens/s of {strongest}, the strongest baseline; "
                  "{over_padding}x padding.**",
    "docs/bench/smollm2-cpu": "**padless packing: {over_strongest}x the real tokens/s of {strongest}, the strongest "
                              "baseline; {over_padding}x padding;",
}  # fmt: skip


def _results(folder: str):
    return load_results(ROOT / folder / "results.json")


@pytest.mark.parametrize("folder", sorted(HEADLINES))
def test_headline_ratios_are_the_runs_own(folder):
    s = _results(folder).summary()
    sentence = HEADLINES[folder].format(
        over_strongest=f"{s.speedup_over_strongest:.2f}",
        strongest=s.strongest_baseline,
        over_padding=f"{s.speedup['packing']:.2f}",
    )
    assert " ".join(sentence.split()) in " ".join(RESULTS.split())


def test_the_readme_headline_is_the_smollm2_runs():
    s = _results("docs/bench/smollm2-cpu").summary()
    sentence = HEADLINES["docs/bench/smollm2-cpu"].format(
        over_strongest=f"{s.speedup_over_strongest:.2f}",
        strongest=s.strongest_baseline,
        over_padding=f"{s.speedup['packing']:.2f}",
    )
    assert " ".join(sentence.split()) in " ".join(README.split())


def test_smollm2_table_rows_are_the_runs_own():
    results = _results("docs/bench/smollm2-cpu")
    figs, s = results.figures(), results.summary()
    rows = [line for line in RESULTS.splitlines() if line.startswith("| ") and "| 3.192 -> 1.160 |" in line]
    assert len(rows) == 4
    for name in ("padding", "bucketing", "packing", "flattening"):
        row = next(r for r in rows if name in r.split("|")[1].lower())
        cells = [c.strip().strip("*") for c in row.split("|")[1:-1]]
        run = results.strategies[name]
        assert cells[2] == f"{figs[name].real_tokens_per_s:,.0f}"
        assert cells[4] == f"{100 * figs[name].mfu:.1f}%"
        assert cells[7] == f"{run.eval_loss_start:.3f} -> {run.eval_loss_end:.3f}"
        assert cells[8] == f"{s.speedup[name]:.2f}x"


def test_the_readme_quotes_the_demos_own_run():
    """`make demo` runs the default preset: the README's demo figures are docs/bench's (that preset's run)."""
    s = _results("docs/bench").summary()
    p = s.paired_over_strongest
    sentence = (
        f"packing {s.speedup_over_strongest:.2f}x the real tokens/s of {s.strongest_baseline}, "
        f"{s.speedup['packing']:.2f}x padding, faster than {s.strongest_baseline} in {p.faster} of {p.steps} steps"
    )
    assert sentence in " ".join(README.split())
