"""The chat page in a real headless Chromium (Debian's ``chromium``, driven by Playwright) against a
live server of the scripted model: the model picker (the listed models, the chosen one sent, a model
still loading), a streamed reply with reasoning, Markdown and code, tool calls, the stop button, the
conversation kept across a reload, an API-key server, and the Markdown renderer's escaping and tables.

Skipped only when no Chromium binary is installed, and then failed instead when
``ATLAS_REQUIRE_BROWSER=1`` (as CI sets it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

CHROMIUM_NAMES = ("chromium", "chromium-browser")
TIMEOUT_MS = 10_000

ANSWER = (
    "<think>\nThe user asks about France.\n</think>\n\n"
    "The **capital** of France is `Paris`.\n\n```python\nprint('<b>not bold</b>')\n```"
)
LONG_ANSWER = "word " * 400
TOOL_ANSWER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SCRIPTS = {"[capital]": ANSWER, "[long]": LONG_ANSWER, "[ask]": TOOL_ANSWER}


def chromium_path() -> str:
    """The system Chromium; skips the test when there is none, or fails under ATLAS_REQUIRE_BROWSER=1."""
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    reason = f"no Chromium binary on PATH (looked for {', '.join(CHROMIUM_NAMES)}; apt-get install chromium)"
    if os.environ.get("ATLAS_REQUIRE_BROWSER") == "1":
        pytest.fail(f"ATLAS_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(scripted: ScriptedFactory) -> LiveServer:
    """The scripted model with the qwen3 reasoning and hermes tool-call parsers, one forward every 10 ms."""
    return scripted(SCRIPTS, delay_s=0.01, reasoning_parser="qwen3", tool_call_parser="hermes")


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, errors


def open_page(page: Page, server: LiveServer) -> None:
    page.goto(server.url + "/")
    expect(page.locator("#model option")).to_have_text(["scripted"])


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def test_streamed_reply_with_reasoning_markdown_and_code(page: Page, server: LiveServer) -> None:
    open_page(page, server)
    page.evaluate(
        """() => {
            window.seen = new Set();
            new MutationObserver(() => {
                const reply = document.querySelector('.message.assistant .content');
                if (reply) window.seen.add(reply.textContent);
            }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
        }"""
    )
    send(page, "[capital] What is the capital of France?")
    expect(page.locator(".message.user .content")).to_have_text("[capital] What is the capital of France?")
    reply = page.locator(".message.assistant")
    expect(reply).to_have_attribute("data-state", "done")
    expect(reply.locator(".content strong")).to_have_text("capital")
    expect(reply.locator(".content p code")).to_have_text("Paris")
    expect(reply.locator(".content pre code.language-python")).to_have_text("print('<b>not bold</b>')")
    assert reply.locator(".content b").count() == 0  # the model's HTML stays text
    reasoning = reply.locator("details.reasoning")
    expect(reasoning).not_to_have_attribute("open", "")
    expect(reasoning.locator(".reasoning-text")).to_have_text("The user asks about France.")
    expect(reasoning.locator(".reasoning-text")).not_to_be_visible()  # collapsed until clicked
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-text")).to_be_visible()
    partial = [text for text in page.evaluate("[...window.seen]") if text]
    assert len(partial) >= 3, partial  # the reply grew chunk by chunk, not all at once

    page.reload()  # the conversation is kept in the browser
    expect(page.locator(".message.user .content")).to_have_text("[capital] What is the capital of France?")
    expect(page.locator(".message.assistant .content strong")).to_have_text("capital")
    expect(page.locator("#conversations li.current .open")).to_have_text("[capital] What is the capital of France?")


def test_stop_aborts_a_long_generation(page: Page, server: LiveServer) -> None:
    open_page(page, server)
    send(page, "[long] Write a lot.")
    reply = page.locator(".message.assistant")
    expect(reply.locator(".content")).to_contain_text("word word word")
    expect(page.locator("#stop")).to_be_visible()
    page.click("#stop")
    expect(reply).to_have_attribute("data-state", "stopped")
    expect(reply.locator(".note")).to_have_text("Stopped.")
    expect(page.locator("#send")).to_be_enabled()
    shown = reply.locator(".content").inner_text()
    assert shown.count("word") < 400
    deadline = time.monotonic() + 5
    while server.engine.has_unfinished() and time.monotonic() < deadline:  # the server aborted it too
        time.sleep(0.02)
    assert not server.engine.has_unfinished()
    assert reply.locator(".content").inner_text() == shown


def test_tool_calls_are_shown(page: Page, server: LiveServer) -> None:
    open_page(page, server)
    page.click("#settings-toggle")
    page.fill("#tools", json.dumps(TOOLS))
    page.locator("#tools").dispatch_event("change")
    send(page, "[ask] Weather in Rome?")
    reply = page.locator(".message.assistant")
    expect(reply).to_have_attribute("data-state", "done")
    expect(reply.locator(".tool-call .tool-name")).to_have_text("Tool call: get_weather")
    assert json.loads(reply.locator(".tool-call .tool-arguments").inner_text()) == {"city": "Rome"}


def test_model_picker_lists_the_models_and_sends_the_chosen_one(page: Page, scripted: ScriptedFactory) -> None:
    """/v1/models reports one name (the first served one); a listing of two, as a server of several models
    would give, is answered here in the browser, and the server accepts both names."""
    server = scripted(SCRIPTS, model_names=["scripted", "alias"])
    listing = {"object": "list", "data": [{"id": name, "object": "model"} for name in ("scripted", "alias")]}
    page.route("**/v1/models", lambda route: route.fulfill(json=listing))
    page.goto(server.url + "/")
    expect(page.locator("#model option")).to_have_text(["scripted", "alias"])
    page.select_option("#model", "alias")
    with page.expect_response("**/v1/chat/completions") as answered:
        send(page, "[capital] Which model?")
    assert answered.value.request.post_data_json["model"] == "alias"
    assert answered.value.status == 200
    reply = page.locator(".message.assistant")
    expect(reply).to_have_attribute("data-state", "done")
    expect(reply.locator(".role")).to_have_text("alias")
    page.reload()  # the conversation remembers its model
    expect(page.locator("#model")).to_have_value("alias")


def test_the_page_waits_for_a_model_that_is_still_loading(page: Page, scripted: ScriptedFactory) -> None:
    server = scripted(SCRIPTS)
    runtime, server.state.runtime = server.state.runtime, None  # as while `atlas serve` loads the model
    page.goto(server.url + "/")
    expect(page.locator("#status")).to_contain_text("still loading")
    server.state.runtime = runtime
    expect(page.locator("#model option")).to_have_text(["scripted"])
    expect(page.locator("#status")).to_have_text("")


def test_api_key_server(page: Page, scripted: ScriptedFactory) -> None:
    server = scripted(SCRIPTS, api_keys=["page-secret"])
    page.goto(server.url + "/")
    expect(page.locator("#status")).to_contain_text("API key")
    expect(page.locator("#api-key")).to_be_visible()
    page.fill("#api-key", "page-secret")
    page.locator("#api-key").dispatch_event("change")
    expect(page.locator("#model option")).to_have_text(["scripted"])
    send(page, "[capital] Again?")
    expect(page.locator(".message.assistant .content strong")).to_have_text("capital")


def render_markdown(page: Page, source: str) -> str:
    """The page's own renderer's HTML of ``source``."""
    return str(page.evaluate("async (source) => (await import('/ui/markdown.js')).renderMarkdown(source)", source))


def test_markdown_renderer_escapes_html_and_renders_tables(page: Page, server: LiveServer) -> None:
    page.goto(server.url + "/")
    html = render_markdown(
        page,
        '<img src=x onerror="alert(1)"> [bad](javascript:alert(1)) [good](https://example.org/?a=1&b=2)\n'
        "- **one**\n- _two_",
    )
    assert "<img" not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert 'href="javascript' not in html and "[bad](javascript:alert(1))" in html
    assert '<a href="https://example.org/?a=1&amp;b=2" target="_blank" rel="noopener noreferrer">good</a>' in html
    assert "<ul><li><strong>one</strong></li><li><em>two</em></li></ul>" in html
    table = render_markdown(
        page,
        "Before\n| Name | Size |\n|:-----|-----:|\n| `a` <b> | **1** |\n| y |\n\nAfter",
    )
    left, right = '<td class="align-left">', '<td class="align-right">'
    assert table == (
        '<p>Before</p>\n<table><thead><tr><th class="align-left">Name</th><th class="align-right">Size</th></tr>'
        f"</thead><tbody><tr>{left}<code>a</code> &lt;b&gt;</td>{right}<strong>1</strong></td></tr>"
        f"<tr>{left}y</td>{right}</td></tr></tbody></table>\n<p>After</p>"
    )
