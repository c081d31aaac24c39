"""The chat page's files over HTTP: served at ``/`` and ``/ui/*`` with their content types and a
strict content security policy, open even when the API needs a key, and absent under
``--no-web-ui`` / ``ATLAS_NO_WEB_UI`` (the page in a real browser: `test_web_ui_browser.py`)."""

from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient

from atlas_core.cli import build_parser
from atlas_core.server.app import create_app
from atlas_core.server.cli_serve import serve_settings, server_config
from atlas_core.server.routes_web import WEB_DIR
from atlas_core.server.state import ServerConfig, ServerState

ASSETS = {
    "/ui/app.js": "javascript",
    "/ui/stream.js": "javascript",
    "/ui/markdown.js": "javascript",
    "/ui/style.css": "text/css",
}


def client(**config: object) -> TestClient:  # type: ignore[type-arg]
    return TestClient(create_app(ServerState(ServerConfig(model_names=["m"], **config))))  # type: ignore[arg-type]


def test_page_and_assets_are_served_with_their_content_types() -> None:
    with client(api_keys=["secret"]) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        for path, kind in ASSETS.items():
            asset = http.get(path)
            assert asset.status_code == 200, path
            assert kind in asset.headers["content-type"], (path, asset.headers["content-type"])
            assert asset.content == (WEB_DIR / path.removeprefix("/ui/")).read_bytes()
        assert http.get("/v1/models").status_code == 401  # the page is open, the API still is not
        assert http.get("/ui/missing.js").status_code == 404


def test_page_loads_nothing_from_elsewhere() -> None:
    """Every script, stylesheet and import the page names is one of its own assets."""
    page = (WEB_DIR / "index.html").read_text(encoding="utf-8")
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sorted(referenced) == ["/ui/app.js", "/ui/style.css", "data:,"]  # data:, an empty icon (no /favicon.ico)
    for script in WEB_DIR.glob("*.js"):
        for target in re.findall(r'^import .* from "([^"]+)";$', script.read_text(encoding="utf-8"), re.M):
            assert (WEB_DIR / target.removeprefix("./")).is_file(), (script.name, target)
    assert {f"/ui/{path.name}" for path in WEB_DIR.iterdir()} == {*ASSETS, "/ui/index.html"}


@pytest.mark.parametrize(("argv", "env"), [(["--no-web-ui"], {}), ([], {"ATLAS_NO_WEB_UI": "1"})])
def test_no_web_ui_leaves_the_page_out(argv: list[str], env: dict[str, str]) -> None:
    config = server_config(serve_settings(build_parser().parse_args(["serve", *argv]), env))
    assert config.web_ui is False
    with TestClient(create_app(ServerState(config))) as http:
        for path in ["/", *ASSETS]:
            assert http.get(path).status_code == 404, path
        assert http.get("/health").status_code == 503  # the API is unaffected (no model loaded here)


def test_web_ui_is_on_by_default() -> None:
    assert server_config(serve_settings(build_parser().parse_args(["serve"]), {})).web_ui is True
