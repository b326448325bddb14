"""Chat records with images, rendered through a vision-language model's processor.

A record's ``messages`` may hold content parts with images, in any of these forms::

    {"type": "image", "image": X}    {"type": "image", "path": X}    {"type": "image", "url": X}
    {"type": "image_url", "image_url": {"url": X}}                     {"type": "text", "text": "..."}

where ``X`` is a local path (relative to the JSONL file's folder), raw bytes, a base64
``data:image/...;base64,`` URI, a PIL image or a ``datasets`` Image dict (``{"bytes", "path"}``).
:func:`render_image_chat` renders the chat with the processor's chat template, lets the processor
expand each image into its placeholder tokens (``processor(text=..., images=...)``) and trains the
assistant turns only; the feature it returns is what :class:`padless.PackingCollator` packs with its
images (:mod:`padless.batching.vision`). Every problem names the record, the message, the part and the
field. :func:`offline_processor` builds a real ``Qwen2VLProcessor`` from parts that ship offline;
:func:`arrow_column` stores a processor's arrays as Arrow list columns (``padless pack``).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_PART_TYPES = ("image", "image_url")
TEXT_PART_TYPES = ("text",)
QWEN_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
CHATML_IMAGES = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template whose image parts become Qwen-VL's ``<|vision_start|><|image_pad|><|vision_end|>``."""


def load_image(value: Any, *, where: str, base_dir: str | Path | None = None) -> Any:
    """An RGB ``PIL.Image`` from a path, bytes, a base64 data URI, a PIL image or a datasets Image
    dict; ``ValueError`` naming ``where`` otherwise (a missing or unreadable file, a URL: no network)."""
    from padless._optional import require

    Image = require("PIL.Image", "padless.data.images")
    UnidentifiedImageError = Image.UnidentifiedImageError
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        value = value.get("bytes") or value.get("path")
    try:
        if isinstance(value, bytes | bytearray):
            return Image.open(io.BytesIO(value)).convert("RGB")
        if isinstance(value, str):
            if value.startswith("data:"):
                head, _, data = value.partition(",")
                if ";base64" not in head:
                    raise ValueError(f"{where}: a data URI must be base64 ('data:image/png;base64,...')")
                return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
            if value.startswith(("http://", "https://")):
                raise ValueError(
                    f"{where}: {value!r} is a URL; padless reads no network here: download it and give the path"
                )
            path = Path(value)
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise ValueError(f"{where}: image file {str(path)!r} does not exist")
            with Image.open(path) as image:
                return image.convert("RGB")
    except (UnidentifiedImageError, OSError, base64.binascii.Error) as err:
        raise ValueError(f"{where}: the image cannot be read ({type(err).__name__}: {err})") from None
    raise ValueError(
        f"{where}: an image is a path, bytes, a base64 data URI, a PIL image or a {{'bytes', 'path'}} dict, "
        f"not {type(value).__name__}"
    )


def image_of(part: Mapping[str, Any], where: str, given: Any = None) -> Any:
    """The image value of an image content part, by the forms of the module docstring; a bare
    ``{"type": "image"}`` takes the next of the record's ``images`` (``given``: an iterator), as TRL's
    vision datasets lay them out."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, Mapping) else url
    for key in ("image", "path", "url"):
        if part.get(key) is not None:
            return part[key]
    fields = sorted(
        k for k in part if k != "type" and part[k] is not None
    )  # Arrow fills a struct's other keys with None
    if not fields and given is not None:
        value = next(given, None)
        if value is not None:
            return value
        raise ValueError(f"{where}: more image parts than the record's 'images' hold")
    raise ValueError(f"{where}: an image part needs 'image', 'path' or 'url' (it has {fields})")


def image_parts(
    messages: Sequence[Mapping[str, Any]], where: str, base_dir: Any = None, images_field: Sequence[Any] | None = None
) -> tuple[list, list]:
    """``(messages for the template, images in order)``: each image part's image loaded (bare parts
    from ``images_field``, the record's ``images``), the parts checked (a part of an unknown type, a
    typo'd field: named); every image of ``images_field`` must be used."""
    out, images = [], []
    given = iter(images_field) if images_field is not None else None
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            out.append(dict(message) if isinstance(message, Mapping) else message)
            continue
        parts = []
        for p, part in enumerate(content):
            here = f"{where}: message {m}, part {p}"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in IMAGE_PART_TYPES:
                images.append(load_image(image_of(part, here, given), where=f"{here} ({kind!r})", base_dir=base_dir))
                parts.append({"type": "image"})
            elif kind in TEXT_PART_TYPES:
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"{here}: a text part needs a 'text' string (it has {sorted(part)})")
                parts.append({"type": "text", "text": part["text"]})
            else:
                raise ValueError(
                    f"{here}: content parts of type {kind!r}; padless reads "
                    f"{', '.join(map(repr, (*TEXT_PART_TYPES, *IMAGE_PART_TYPES)))}"
                )
        out.append({**message, "content": parts})
    if given is not None and next(given, None) is not None:
        raise ValueError(f"{where}: its 'images' hold more images than its messages have image parts; none is dropped")
    return out, images


def render_image_chat(
    messages: Sequence[Mapping[str, Any]],
    processor: Any,
    *,
    where: str = "record",
    base_dir: Any = None,
    images: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """One chat rendered through ``processor`` (a transformers processor with a chat template and an
    image processor): ``input_ids``, ``labels`` (the assistant turns' tokens trained, everything else
    -100) and the processor's other outputs for this one record (``pixel_values``, ``image_grid_thw``,
    ``mm_token_type_ids`` / ``token_type_ids`` as 1-D lists; ``attention_mask`` dropped: all ones).
    The assistant spans are found by rendering the chat up to each assistant turn (with the generation
    prompt) and through it, so any chat template works. ``images``: the record's ``images`` field, taken
    in order by bare ``{"type": "image"}`` parts (TRL's vision datasets)."""
    chat, images = image_parts(_calls_written(messages, processor, where), where, base_dir, images)
    if images and getattr(processor, "image_processor", None) is None:
        raise ValueError(f"{where} has {len(images)} image(s), but the processor has no image processor")

    def encode(turns: list, *, prompt: bool) -> dict[str, Any]:
        text = processor.apply_chat_template(turns, tokenize=False, add_generation_prompt=prompt)
        shown = images[: _count_images(turns)] or None
        kwargs = {"return_mm_token_type_ids": True} if "mm_token_type_ids" in _returns(processor) else {}
        return dict(processor(text=[text], images=shown, return_tensors="pt", **kwargs))

    full = encode(chat, prompt=False)
    ids = full["input_ids"][0].tolist()
    labels = [-100] * len(ids)
    for i, message in enumerate(chat):
        if message.get("role") != "assistant":
            continue
        start = len(encode(chat[:i], prompt=True)["input_ids"][0])
        end = len(encode(chat[: i + 1], prompt=False)["input_ids"][0])
        labels[start:end] = ids[start:end]
    feature: dict[str, Any] = {"input_ids": ids, "labels": labels}
    for key, value in full.items():
        if key in ("input_ids", "attention_mask"):
            continue
        feature[key] = value[0].tolist() if key in ("mm_token_type_ids", "token_type_ids") else value
    token = getattr(processor, "image_token_id", None)
    if images and token is not None and token not in ids:
        raise ValueError(
            f"{where} has {len(images)} image(s) but the rendered chat holds no image token: the chat template drops image parts"
        )
    return feature


def _calls_written(messages: Sequence[Any], processor: Any, where: str) -> list[Any]:
    """The messages with their ``tool_calls`` checked, and written into the assistant's content as
    Hermes-style blocks when the processor's chat template does not render calls itself (as
    :mod:`padless.data.chat` does for tokenizers): a call is never left out of the rendering."""
    from padless.data.chat import _tool_calls, tool_call_text

    template = getattr(processor, "chat_template", None)
    renders_calls = isinstance(template, str) and "tool_calls" in template
    out = []
    for m, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("tool_calls"):
            calls = _tool_calls(message["tool_calls"], message.get("role"), f"{where}: message {m}")
            if renders_calls:
                message = {**message, "tool_calls": calls}
            else:
                blocks = "\n".join(tool_call_text(c) for c in calls)
                content = message.get("content")
                if isinstance(content, list):
                    content = [*content, {"type": "text", "text": blocks}]
                else:
                    content = f"{content}\n{blocks}" if isinstance(content, str) and content.strip() else blocks
                message = {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}
        out.append(message)
    return out


def has_images(record: Any) -> bool:
    """A chat record that carries images (an ``images`` field, or image content parts)."""
    if not isinstance(record, Mapping):
        return False
    if record.get("images"):
        return True
    messages = record.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, Mapping) and isinstance(m.get("content"), list)
        and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PART_TYPES for p in m["content"])
        for m in messages
    )  # fmt: skip


def render_image_records(records: Any, processor: Any, *, argument: str = "train_dataset") -> list[dict[str, Any]]:
    """Every chat record of ``records`` (a list or ``datasets.Dataset`` with ``messages`` and optionally
    ``images``) rendered by :func:`render_image_chat`; a text-only record gets ``None`` image columns (as
    ``datasets`` lays out a mixed dataset); errors name the 1-based record."""
    features = []
    for number, record in enumerate(records, 1):
        where = f"{argument} record {number}"
        messages = record.get("messages") if isinstance(record, Mapping) else None
        if not isinstance(messages, list):
            fields = sorted(record) if isinstance(record, Mapping) else type(record).__name__
            raise ValueError(f"{where}: a chat record with images needs a 'messages' list (fields: {fields})")
        features.append(render_image_chat(messages, processor, where=where, images=record.get("images")))
    keys = list(dict.fromkeys(k for f in features for k in f))
    return [{k: f.get(k) for k in keys} for f in features]


def _count_images(turns: list) -> int:
    return sum(
        1
        for m in turns
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, Mapping) and p.get("type") == "image"
    )


def _returns(processor: Any) -> tuple[str, ...]:
    """Qwen-VL processors return ``mm_token_type_ids`` when asked."""
    return ("mm_token_type_ids",) if type(processor).__name__.startswith("Qwen") else ()


def read_image_chats(path: str | Path, processor: Any, *, base_dir: Any = None) -> list[dict[str, Any]]:
    """The JSONL file's records (a ``messages`` field each, images by path relative to the file's
    folder) rendered by :func:`render_image_chat`; errors name the 1-based line and the field."""
    path = Path(path)
    base_dir = path.parent if base_dir is None else base_dir
    features = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
        messages = record.get("messages") if isinstance(record, Mapping) else None
        if not isinstance(messages, list):
            fields = sorted(record) if isinstance(record, Mapping) else type(record).__name__
            raise ValueError(f"{where}: a chat record needs a 'messages' list (fields: {fields})")
        features.append(render_image_chat(messages, processor, where=where, base_dir=base_dir))
    return features


def offline_processor(*, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112) -> Any:
    """A real transformers ``Qwen2VLProcessor`` built from parts that ship offline: the GPT-2 tokenizer
    padless packages (:func:`padless.data.tokenizer.load_tokenizer`) with Qwen-VL's special tokens
    appended after GPT-2's 50,257 ids (:data:`QWEN_SPECIAL_TOKENS`: ids 50257-50262, so a model's
    vocabulary must cover ``len(processor.tokenizer)``), ``Qwen2VLImageProcessorPil`` (no torchvision
    needed; ``min_pixels``/``max_pixels`` keep images at 4-16 image tokens by default) and
    :data:`CHATML_IMAGES`; no video processor (videos are not read)."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    from padless.data.tokenizer import load_tokenizer

    class OfflineQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor without its video processor (which needs torchvision)."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **_: Any):
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    tokenizer = load_tokenizer("gpt2")
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    tokenizer.pad_token = "<|im_end|>"
    images = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    return OfflineQwen2VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=CHATML_IMAGES)


def sample_images(n: int, *, seed: int = 0, sizes: Sequence[int] = (56, 84, 112, 168)) -> list[Any]:
    """``n`` deterministic RGB images of varied sizes: crops of the photo matplotlib ships
    (``grace_hopper.jpg``) and generated gradients with rectangles, alternately."""
    from padless._optional import require

    require("PIL", "padless.data.images.sample_images")
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    photo = None
    try:
        import matplotlib.cbook

        photo = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")
    except (ImportError, OSError):
        pass
    out = []
    for i in range(n):
        h, w = (int(rng.choice(sizes)) for _ in range(2))
        if photo is not None and i % 2 == 0:
            x, y = int(rng.integers(0, photo.width - w)), int(rng.integers(0, photo.height - h))
            out.append(photo.crop((x, y, x + w, y + h)))
            continue
        grid = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3)) * rng.uniform(0.3, 1.0, 3)
        image = Image.fromarray(grid.astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            draw.rectangle((x0, y0, x0 + 8, y0 + 8), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        out.append(image)
    return out


def arrow_column(values: Sequence[Any]) -> Any:
    """One document's processor output per entry (an array, list or tensor; ``None`` without images) as
    an Arrow list column of the array's dtype (``pixel_values [P, D]`` float32 -> ``list<list<float>>``,
    as ``datasets`` stores it); every array of the column has the same rank."""
    import pyarrow as pa

    arrays = [
        None if v is None else np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for v in values
    ]
    present = [a for a in arrays if a is not None]
    if not present:
        return pa.nulls(len(arrays))
    if len({a.ndim for a in present}) != 1 or present[0].ndim == 0:
        raise ValueError(
            f"an image column holds arrays of ranks {sorted({a.ndim for a in present})}; one processor makes them all"
        )
    ndim = present[0].ndim
    child = pa.array(np.concatenate([a.ravel() for a in present]))
    for k in range(ndim - 1, 0, -1):  # the inner levels: regular lists of shape[k] values
        sizes = np.concatenate([np.full(int(np.prod(a.shape[:k])), a.shape[k], dtype=np.int64) for a in present])
        child = pa.ListArray.from_arrays(pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)), child)
    sizes = np.array([0 if a is None else a.shape[0] for a in arrays], dtype=np.int64)
    missing = np.array([a is None for a in arrays])
    offsets = pa.array(np.concatenate(([0], np.cumsum(sizes))).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, child, mask=pa.array(missing) if missing.any() else None)
