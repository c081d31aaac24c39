"""Images in chat requests: where they come from (OpenAI ``image_url`` parts, Anthropic ``image`` blocks),
fetching them under the server's media policy, and preparing them for the served model.

``data:`` URLs (base64) and Anthropic base64 sources are always read; ``http(s)`` URLs only when
``--allow-remote-media`` is on or the host is one of ``--allowed-media-domains`` (or a subdomain of one),
each fetch limited to ``media_max_bytes`` and ``media_fetch_timeout`` seconds (in all), following redirects only
to URLs the policy allows. Every failure is a 400 naming
the request part. Fetching, decoding and preprocessing are blocking: they run in `render`'s worker thread.
"""

from __future__ import annotations

import base64
import binascii
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.client import HTTPMessage
from typing import IO, Any

from atlas_core.errors import InvalidRequestError
from atlas_core.model.images import decode_image, prepare_image
from atlas_core.model.vision import PreparedImage, VisionModel
from atlas_core.server.errors import invalid

READ_SIZE = 1 << 16
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")


@dataclass(frozen=True)
class MediaPolicy:
    """What images a request may bring: at most ``max_images``; each resized to at most ``max_pixels``
    before the encoder (None: the model's budget); remote URLs per ``allow_remote`` / ``allowed_domains``,
    read within ``max_bytes`` and ``timeout`` seconds."""

    max_images: int = 8
    max_pixels: int | None = None
    allowed_domains: tuple[str, ...] = ()
    allow_remote: bool = False
    max_bytes: int = 20 * 2**20
    timeout: float = 10.0


@dataclass(frozen=True)
class ImageRef:
    """An image of a request, not yet read: ``part`` names where it is (``messages[0].content[1]``),
    ``url`` is a ``data:`` or ``http(s)`` URL, or ``data`` holds its bytes already."""

    part: str
    url: str | None = None
    source: dict[str, Any] | None = field(default=None, repr=False)
    """An Anthropic image block's ``source``: ``{"type": "base64", "media_type", "data"}`` or
    ``{"type": "url", "url"}``."""


def openai_image(part: str, url: str) -> ImageRef:
    return ImageRef(part, url=url)


def anthropic_image(part: str, source: dict[str, Any]) -> ImageRef:
    return ImageRef(part, source=source)


def _anthropic_source(ref: ImageRef, source: dict[str, Any], policy: MediaPolicy) -> bytes:
    part, kind = ref.part, source.get("type")
    if kind == "url" and isinstance(source.get("url"), str):
        return read_image(ImageRef(part, url=source["url"]), policy)
    if kind != "base64":
        raise invalid(f"{part}: image source type {kind!r} is not supported (base64 or url)", param=part)
    media_type = str(source.get("media_type", ""))
    if media_type not in IMAGE_TYPES:
        raise invalid(f"{part}: media_type {media_type!r} is not an image type ({', '.join(IMAGE_TYPES)})", param=part)
    return _base64(str(source.get("data", "")), part)


def _base64(text: str, part: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(f"{part}: the image data is not valid base64: {exc}", param=part) from exc


def read_image(ref: ImageRef, policy: MediaPolicy) -> bytes:
    """The bytes of ``ref``'s image (`MediaPolicy` decides which URLs may be fetched)."""
    if ref.source is not None:
        return _anthropic_source(ref, ref.source, policy)
    assert ref.url is not None
    part, url = ref.part, ref.url
    if url.startswith("data:"):
        header, comma, payload = url[5:].partition(",")
        media_type, *params = header.split(";")
        if not comma or "base64" not in params:
            raise invalid(f"{part}: a data URL must be data:<image type>;base64,<data>", param=part)
        if media_type.lower() not in IMAGE_TYPES:
            raise invalid(f"{part}: data URL type {media_type!r} is not an image type", param=part)
        return _base64(payload, part)
    refusal = _refusal(url, policy)
    if refusal:
        raise invalid(f"{part}: {refusal}", param=part)
    opener = urllib.request.build_opener(_CheckedRedirects(policy))
    deadline = time.monotonic() + policy.timeout
    data = b""
    try:
        with opener.open(url, timeout=policy.timeout) as response:
            while len(data) <= policy.max_bytes:
                if time.monotonic() > deadline:
                    raise invalid(f"{part}: fetching the image took more than {policy.timeout} s", param=part)
                chunk = response.read(min(READ_SIZE, policy.max_bytes + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        raise invalid(f"{part}: the image could not be fetched: {exc}", param=part) from exc
    if len(data) > policy.max_bytes:
        raise invalid(f"{part}: the image is larger than {policy.max_bytes} bytes", param=part)
    return data


def _refusal(url: str, policy: MediaPolicy) -> str | None:
    """Why ``url`` may not be fetched under ``policy`` (None: it may)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "image URLs must be data:, http: or https: URLs"
    host = parsed.hostname.lower()
    if policy.allow_remote or any(host == d or host.endswith("." + d) for d in policy.allowed_domains):
        return None
    return (
        f"fetching images from {host} is not allowed on this server (--allowed-media-domains, --allow-remote-media); "
        "send the image as a data: URL"
    )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL the policy allows (else the fetch fails)."""

    def __init__(self, policy: MediaPolicy) -> None:
        self.policy = policy

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        refusal = _refusal(newurl, self.policy)
        if refusal:
            raise urllib.error.URLError(f"redirected to {newurl}: {refusal}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def prepare_images(vision: VisionModel | None, refs: list[ImageRef], policy: MediaPolicy) -> list[PreparedImage]:
    """Read, decode and prepare every image of a request for the served model; 400s name the part."""
    if not refs:
        return []
    if vision is None:
        raise invalid(f"{refs[0].part}: image content is not supported: the served model reads text only", refs[0].part)
    if len(refs) > policy.max_images:
        raise invalid(
            f"the request has {len(refs)} images; at most {policy.max_images} per prompt (--limit-mm-per-prompt)"
        )
    prepared = []
    for ref in refs:
        try:
            image = decode_image(read_image(ref, policy), ref.part)
            prepared.append(prepare_image(vision, image, ref.part, policy.max_pixels))
        except InvalidRequestError as exc:
            raise invalid(str(exc), param=ref.part) from exc
    return prepared
