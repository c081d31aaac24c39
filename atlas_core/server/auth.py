"""API-key authentication of the model routes (``/v1/*``, ``/tokenize``, ``/detokenize``).

A request presents its key as ``Authorization: Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY``
(Anthropic clients). Keys are compared with `hmac.compare_digest`, against every configured key,
so the time taken does not reveal how much of a key matched or which key it was.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from atlas_core.errors import AtlasError
from atlas_core.server.errors import APIError

Guard = Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], None]


def presented_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    authorization = connection.headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return connection.headers.get("x-api-key") or None


def api_key_guard(keys: Sequence[str]) -> Guard:
    """A Litestar guard admitting requests that present one of ``keys`` (401 otherwise)."""
    expected = [key.encode() for key in keys]

    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        key = presented_key(connection)
        if key is None:
            raise APIError(
                401,
                "missing API key: send 'Authorization: Bearer KEY' (OpenAI clients) or 'x-api-key: KEY' "
                "(Anthropic clients)",
            )
        candidate = key.encode()
        if not any([hmac.compare_digest(candidate, k) for k in expected]):  # noqa: C419 (compare every key)
            raise APIError(401, "invalid API key")

    return guard


def read_keys_file(path: str | Path) -> list[str]:
    """One key per line; blank lines and lines starting with ``#`` are skipped."""
    file = Path(path).expanduser()
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AtlasError(f"--api-keys-file {file}: cannot read it: {exc.strerror or exc}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise AtlasError(f"--api-keys-file {file}: the file holds no keys (one per line)")
    return keys
