"""The vision-language preset's data (``padless bench --preset vlm``): image chats built offline.

``captions`` is a JSON-lines file of chats written once into padless' cache root: a user turn with 0, 1
or 2 images (crops of the photo matplotlib ships and generated pictures, 56-168 px:
:func:`padless.data.images.sample_images`) and a request, and an assistant reply taken from the tweets
corpus (real text, the "caption"). The images are PNG files beside it; the bench reads the file through
the model's processor (``RunConfig.processor``), like any user's file of image chats.
"""

from __future__ import annotations

import json
from pathlib import Path

CAPTIONS = "captions"
"""The data name the bench builds itself (needs a processor)."""
RECORDS = 240
"""Chats in the file."""


def captions_file(seed: int = 0, records: int = RECORDS) -> Path:
    """The path of the captions file for ``seed``, written on first use (the whole folder at once: the
    strategies' processes may ask together)."""
    from padless.atomic import write_folder_atomically
    from padless.data.assets import cache_root

    folder = cache_root() / f"bench-captions-{records}-{seed}"
    if not (folder / "captions.jsonl").exists():
        write_folder_atomically(folder, lambda tmp: _write(tmp, seed, records))
    return folder / "captions.jsonl"


def _write(folder: Path, seed: int, records: int) -> None:
    from padless.data.images import sample_images
    from padless.data.raw import snippets

    replies = [text for _, text in snippets("tweets")][:records]
    for i, image in enumerate(sample_images(records, seed=seed)):
        image.save(folder / f"image{i}.png")
    lines = []
    for i, reply in enumerate(replies):
        shown = i % 3  # 0, 1 or 2 images
        parts: list[dict] = [{"type": "image", "path": f"image{(2 * i + j) % records}.png"} for j in range(shown)]
        parts.append({"type": "text", "text": "Describe the picture." if shown else "Say something."})
        chat = [{"role": "user", "content": parts}, {"role": "assistant", "content": reply}]
        lines.append(json.dumps({"messages": chat}))
    (folder / "captions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
