"""``padless verify``'s model line names the attention backends it checks, not only the one the model
was built with (eager, then each backend switched on in turn)."""

from __future__ import annotations

from padless.cli import main


def test_the_model_line_names_what_is_checked(capsys):
    assert main(["verify", "--model", "tiny-llama", "--backends", "sdpa,padless", "--max-length", "64"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert "attention checked: sdpa, padless (built eager, each switched on in turn)" in first
    assert "attention 'eager'" not in first and "; loaded in " in first
