"""Images from requests: decoded with Pillow, checked and prepared by the served model, every error an
`InvalidRequestError` naming the request part that holds the image; and the checkpoint's image processor
settings that the families' processors read (`read_preprocessor_config`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas_core.errors import InvalidRequestError
from atlas_core.model.resolve import read_json_object
from atlas_core.model.vision import PreparedImage, VisionModel

if TYPE_CHECKING:
    from PIL.Image import Image

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
"""The image formats requests may carry."""
DEFAULT_MAX_PIXELS = 25_000_000
"""The largest image (width x height, before resizing) accepted unless the server says otherwise."""
MIN_SIDE = 2
"""Images narrower or lower than this many pixels are refused (nothing to see in them)."""


PREPROCESSOR_CONFIG = "preprocessor_config.json"
"""Where a vision-language checkpoint keeps its image processor's settings."""


def read_preprocessor_config(folder: Path) -> dict[str, Any]:
    """The JSON object in ``folder``'s `PREPROCESSOR_CONFIG` ({} when there is no such file: the processor's
    defaults); `ModelLoadError` naming the file when it cannot be read or is not an object."""
    path = folder / PREPROCESSOR_CONFIG
    return read_json_object(path) if path.is_file() else {}


def decode_image(data: bytes, part: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image:
    """The RGB image in ``data`` (a PNG, JPEG, WebP, GIF (first frame) or BMP file); `InvalidRequestError`
    naming ``part`` when it is not one, cannot be decoded (e.g. truncated), has a side under `MIN_SIDE`
    pixels, or has more than ``max_pixels`` pixels (checked from the header, before decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:  # Pillow's own limit, far above any sensible max_pixels
        raise InvalidRequestError(f"{part}: the image is too large: {exc}") from exc
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequestError(f"{part}: not an image in a supported format ({', '.join(FORMATS)}): {exc}") from exc
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidRequestError(
            f"{part}: the image is too large: {width}x{height} = {width * height} pixels, more than the "
            f"{max_pixels} allowed"
        )
    if min(width, height) < MIN_SIDE:
        raise InvalidRequestError(f"{part}: the image is {width}x{height}; each side needs at least {MIN_SIDE} pixels")
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequestError(f"{part}: the {image.format} image cannot be decoded: {exc}") from exc


def prepare_image(vision: VisionModel, image: Image, part: str, max_pixels: int | None = None) -> PreparedImage:
    """``vision.prepare(image, max_pixels)``, its `InvalidRequestError` naming ``part``."""
    try:
        return vision.prepare(image, max_pixels)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{part}: {exc}") from exc
