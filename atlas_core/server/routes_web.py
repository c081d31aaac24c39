"""The built-in chat page: ``GET /`` answers ``web/index.html`` and ``/ui/*`` its scripts and styles.

The files are plain HTML, CSS and JavaScript inside the package (no build step, nothing fetched
from elsewhere); the page talks to the server's own ``/v1/models`` and ``/v1/chat/completions``.
Neither the page nor its assets hold anything secret, so they are served without an API key even
when the model routes need one: the page asks for the key and sends it with its API calls.
``--no-web-ui`` leaves these routes out (`atlas_core.server.app.create_app`).
"""

from __future__ import annotations

from pathlib import Path

from litestar import Response, Router, get
from litestar.handlers import HTTPRouteHandler
from litestar.static_files import create_static_files_router

WEB_DIR = Path(__file__).parent / "web"
"""The page's files, shipped inside the package."""

ASSETS_PATH = "/ui"
"""Where the page's scripts and styles are served from."""

PAGE_HEADERS = {
    # only this server's own scripts, styles and API; no inline script, no frames, no plugins
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@get("/", include_in_schema=False)
async def chat_page() -> Response[bytes]:
    """The chat page (read on each request, so an edited page shows on reload)."""
    return Response((WEB_DIR / "index.html").read_bytes(), media_type="text/html", headers=PAGE_HEADERS)


def web_routes() -> list[Router | HTTPRouteHandler]:
    """The page and its assets, to add to the application's route handlers."""
    assets = create_static_files_router(
        path=ASSETS_PATH,
        directories=[WEB_DIR],
        name="web_ui",
        include_in_schema=False,
    )
    return [chat_page, assets]
