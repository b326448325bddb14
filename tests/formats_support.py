"""One small example of every form of record padless reads (padless.data.formats), the chat each
stands for, and a typo of each: shared by the data, command-line and trainer tests of the formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CALL = {"name": "get_weather", "arguments": {"city": "Oslo"}}
FORMS: dict[str, list[dict[str, Any]]] = {
    "alpaca": [
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},
        {"instruction": "Say hi.", "output": "Hi!", "system": "Be brief."},
    ],
    "sharegpt": [
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Weather in Oslo?"},
                           {"from": "function_call", "value": json.dumps(CALL)},
                           {"from": "observation", "value": "4 C, rain"},
                           {"from": "gpt", "value": "4 degrees and raining."}]},
        {"conversations": [{"from": "human", "value": "Capital of France?"}, {"from": "gpt", "value": "Paris."}]},
        {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
    ],
    "prompt_completion": [
        {"prompt": "The sky is", "completion": " blue."},
        {"prompt": "Grass is", "completion": " green."},
        {"prompt": "Snow is", "completion": " white."},
    ],
    "conversational_prompt_completion": [
        {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "completion": [{"role": "assistant", "content": "Hello."}]},
        {"prompt": [{"role": "user", "content": "Capital of France?"}],
         "completion": [{"role": "assistant", "content": "Paris."}]},
    ],
    "messages": [
        {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                      {"role": "assistant", "tool_calls": [{"type": "function", "function": CALL}]},
                      {"role": "tool", "content": "4 C, rain"},
                      {"role": "assistant", "content": "4 degrees and raining."}]},
        {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    ],
}  # fmt: skip
"""Three records of each form, the name of the form (``padless.data.formats.FORMATS``) as key."""

TYPOS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "alpaca": ({"instruction": "Name a colour.", "ouput": "Blue."},
               ["no 'output'", "did you mean 'output'?", "--columns output=NAME"]),
    "sharegpt": ({"conversations": [{"from": "humna", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
                 ["conversations turn 0", "unknown 'from' value 'humna'", "did you mean 'human'?",
                  "human, gpt, system, function_call and observation"]),
    "prompt_completion": ({"prompt": "The sky is", "completoin": " blue."},
                          ["'prompt' without 'completion'", "did you mean 'completion'?", "--columns completion=NAME"]),
    "conversational_prompt_completion": (
        {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "asistant", "content": "Hello"}]},
        ["message 1: unknown role 'asistant'"]),
    "messages": ({"messages": [{"role": "user", "contnt": "Hi"}, {"role": "assistant", "content": "Hello"}]},
                 ["message 0 has no 'content'", "did you mean 'content'?"]),
}  # fmt: skip
"""Form -> (a record with a typo, what its error says besides where it is)."""


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    """``records`` as JSON lines (``.jsonl``) or one JSON array (``.json``)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def with_typo(form: str) -> list[dict[str, Any]]:
    """The form's records with its typo as the second record."""
    return [FORMS[form][0], TYPOS[form][0], *FORMS[form][1:]]
