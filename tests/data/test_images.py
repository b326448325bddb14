"""Chat records with images (padless.data.images): every image form loads, every bad one is named by
record, message, part and field, and a chat rendered through a real Qwen2VLProcessor (built offline)
has each image expanded into its placeholder tokens and the assistant turns alone trained."""

import base64
import io
import json

import pytest
import torch

from padless.data.images import load_image, offline_processor, read_image_chats, render_image_chat, sample_images


@pytest.fixture(scope="module")
def processor():
    return offline_processor()


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_image_form_loads(tmp_path):
    image = sample_images(1, seed=1)[0]
    (tmp_path / "a.png").write_bytes(_png(image))
    uri = "data:image/png;base64," + base64.b64encode(_png(image)).decode()
    for value in ("a.png", str(tmp_path / "a.png"), _png(image), uri, image, {"bytes": _png(image), "path": None}):
        loaded = load_image(value, where="x", base_dir=tmp_path)
        assert loaded.size == image.size and loaded.mode == "RGB"


@pytest.mark.parametrize(
    "value, message",
    [
        ("missing.png", r"line 3: message 0, part 1: image file .*missing.png' does not exist"),
        (b"not an image", r"line 3: message 0, part 1: the image cannot be read"),
        ("https://example.com/a.png", r"is a URL; padless reads no network"),
        (3, r"an image is a path, bytes"),
    ],
)
def test_bad_images_name_the_record_and_part(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        load_image(value, where="line 3: message 0, part 1", base_dir=tmp_path)


def test_bad_parts_are_named(processor):
    bad = [{"role": "user", "content": [{"type": "imgae", "image": "a.png"}]}]
    with pytest.raises(ValueError, match=r"record: message 0, part 0: content parts of type 'imgae'"):
        render_image_chat(bad, processor)
    typo = [{"role": "user", "content": [{"type": "image", "imgae": "a.png"}]}]
    with pytest.raises(
        ValueError, match=r"message 0, part 0: an image part needs 'image', 'path' or 'url' \(it has \['imgae'\]\)"
    ):
        render_image_chat(typo, processor)


def test_a_chat_with_images_renders_through_the_processor(processor):
    """Two turns, two images of different sizes: each image becomes (h/28)*(w/28) placeholder tokens
    as its image_grid_thw says (the processor expands them), and only the assistant turns are trained."""
    a, b = sample_images(2, seed=3, sizes=(56, 112))
    chat = [
        {"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A photo."},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": b}}, {"type": "text", "text": "And this?"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Squares."}]},
    ]
    f = render_image_chat(chat, processor)
    grid = f["image_grid_thw"]
    assert grid.shape == (2, 3)
    image_id = processor.image_token_id
    assert f["input_ids"].count(image_id) == int((grid.prod(dim=1) // 4).sum())
    assert f["mm_token_type_ids"] == [int(i == image_id) for i in f["input_ids"]]
    assert f["pixel_values"].shape[0] == int(grid.prod(dim=1).sum())
    trained = [t for t, lab in zip(f["input_ids"], f["labels"]) if lab != -100]
    text = processor.tokenizer.decode(trained)
    assert text.replace("<|im_end|>", "|").split("|")[:2] == ["A photo.", "\nSquares."]


def test_jsonl_with_relative_image_paths_and_a_tool_turn(tmp_path, processor):
    sample_images(1, seed=5)[0].save(tmp_path / "pic.png")
    records = [
        {"messages": [{"role": "user", "content": [{"type": "image", "path": "pic.png"}, {"type": "text", "text": "Caption?"}]},
                      {"role": "assistant", "content": "A face."}]},
        {"messages": [{"role": "user", "content": "Weather?"}, {"role": "tool", "content": "sunny"},
                      {"role": "assistant", "content": "Sunny."}]},
    ]  # fmt: skip
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n" + '{"mesages": []}\n')
    with pytest.raises(
        ValueError, match=r"chats.jsonl line 3: a chat record needs a 'messages' list \(fields: \['mesages'\]\)"
    ):
        read_image_chats(path, processor)
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    features = read_image_chats(path, processor)
    assert "pixel_values" in features[0] and "pixel_values" not in features[1]
    tool = processor.tokenizer.decode(features[1]["input_ids"])
    assert "<|im_start|>tool\nsunny" in tool
    assert torch.is_tensor(features[0]["image_grid_thw"])
