"""The transformers facts of :mod:`padless.attention.transformers_compat` hold for the installed transformers,
and the version they name is the one ``constraints.txt`` pins."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from padless.attention import transformers_compat as compat

transformers = pytest.importorskip("transformers")

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def test_the_stated_version_is_the_pinned_one() -> None:
    pins = re.findall(r"^transformers==(\S+)$", CONSTRAINTS.read_text(), re.M)
    assert pins == [compat.VERSION]
    assert compat.SERIES == "5.24"


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (compat.FLASH_UTILS, (compat.FLASH_FORWARD, compat.PACKED_SEQUENCE_CHECK)),
        (
            compat.MASKING_UTILS,
            (*compat.MASK_BUILDERS, compat.MASK_PASSTHROUGH, compat.MASK_INTERFACE, compat.PACKED_FROM_POSITIONS),
        ),
        (compat.LOSS_UTILS, compat.LOSS_NAMES),
    ],
)
def test_every_listed_function_exists(module: str, names: tuple[str, ...]) -> None:
    found = importlib.import_module(module)
    assert [n for n in names if not hasattr(found, n)] == []


def test_position_ids_sits_at_the_listed_index() -> None:
    forward = getattr(importlib.import_module(compat.FLASH_UTILS), compat.FLASH_FORWARD)
    assert list(inspect.signature(forward).parameters)[compat.FLASH_POSITION_IDS_ARG] == "position_ids"


def test_the_model_attributes_exist() -> None:
    assert hasattr(transformers.PreTrainedModel, compat.DISTRIBUTED_LOADING)
    assert compat.ADAPTER_KWARGS in inspect.getsource(transformers.PreTrainedModel.from_pretrained)


def test_every_token_mixer_class_is_defined_in_a_modeling_file() -> None:
    # read as text: importing every modeling module would build each model's torch classes
    defined = set()
    for path in (Path(transformers.__file__).parent / "models").glob("*/modeling_*.py"):
        defined.update(re.findall(r"^\s*class (\w+)\(", path.read_text(encoding="utf-8"), re.M))
    assert [name for name in compat.TOKEN_MIXER_CLASSES if name not in defined] == []


def test_the_listed_model_types_exist() -> None:
    types = compat.NO_BOUNDARY_MODEL_TYPES + compat.OWN_MASK_MODEL_TYPES
    assert [t for t in types if t not in transformers.CONFIG_MAPPING] == []
