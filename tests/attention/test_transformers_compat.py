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


MODELS = Path(transformers.__file__).parent / "models"


def _model_source(model: str) -> str:
    # read as text, as for the token mixers: importing the modeling modules would build their torch classes
    return "".join(path.read_text(encoding="utf-8") for path in sorted((MODELS / model).glob("modeling_*.py")))


MARKED_MODELS = [
    # each source mark of this release, and model modules whose verdicts the rule reads from it
    ("sliding_window_causal_mask", ("mistral", "starcoder2")),
    ("sliding_attention", ("gemma2", "qwen2")),
    ("sliding_window_mask", ("moonshine_streaming",)),  # its only sliding-window mark
    (compat.MASK_DICT_MARK, ("gemma3", "qwen2")),
    (compat.SINK_MARK, ("gpt_oss",)),
    (compat.OFFSET_POSITIONS_MARK, ("roberta",)),
    (compat.MASK4D_MARKS[0], ("llama", "mistral")),
    (compat.AUTO_DECODER_MARK, ("fuyu",)),
    (compat.DECODER_FLAG_MARK, ("bert",)),
]


@pytest.mark.parametrize(("mark", "models"), MARKED_MODELS)
def test_every_source_mark_is_in_the_models_it_is_read_from(mark: str, models: tuple[str, ...]) -> None:
    assert [m for m in models if mark not in _model_source(m)] == []


def test_every_source_mark_of_this_release_is_checked() -> None:
    marks = (*compat.SLIDING_MASK_MARKS, compat.MASK_DICT_MARK, compat.SINK_MARK, compat.OFFSET_POSITIONS_MARK)
    marks += (*compat.MASK4D_MARKS, compat.AUTO_DECODER_MARK, compat.DECODER_FLAG_MARK)
    assert sorted(mark for mark, _ in MARKED_MODELS) == sorted(marks)


@pytest.mark.parametrize("model", ["llama", "llama4"])
def test_the_position_mask_mark_matches_the_models_that_pass_position_ids(model: str) -> None:
    assert re.search(compat.POSITION_MASK_MARK, _model_source(model))


def test_the_position_mask_mark_misses_a_mask_builder_called_without_position_ids() -> None:
    call = "mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=mask)\nposition_ids = p"
    assert not re.search(compat.POSITION_MASK_MARK, call)
    assert re.search(compat.POSITION_MASK_MARK, call.replace("attention_mask=mask", "position_ids=position_ids"))


def test_the_remote_code_marks_are_in_no_model_of_this_release() -> None:
    sources = "".join(path.read_text(encoding="utf-8") for path in MODELS.glob("*/modeling_*.py"))
    assert [m for m in compat.REMOTE_SLIDING_MASK_MARKS if m in sources] == []
    assert not (Path(transformers.__file__).parent / "modeling_attn_mask_utils.py").exists()  # REMOTE_MASK4D_MARKS
