"""Images through both chat APIs on the tiny Qwen3-VL checkpoint (a character-level tokenizer and a
Qwen3-VL-style chat template are written beside a copy of it): OpenAI ``image_url`` parts (data: URLs,
http URLs only from allowed hosts) and Anthropic base64 ``image`` blocks, image tokens counted in usage,
``count_tokens`` and ``/tokenize``, the same answer as the offline API, and 400s naming the part."""

from __future__ import annotations

import base64
import io
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from atlas_core import LLM, SamplingParams
from atlas_core.server.media import MediaPolicy
from tests.conftest import TINY
from tests.server.live import LiveServer, serve

SPECIALS = {
    "<|vision_start|>": 248,
    "<|vision_end|>": 249,
    "<|image_pad|>": 250,
    "<|im_start|>": 252,
    "<|im_end|>": 253,
}
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_TOKENS = 24  # image_a.png: a 8 x 12 patch grid, merged 2 x 2


def write_tokenizer(
    folder: Path, specials: dict[str, int] = SPECIALS, template: str = TEMPLATE, eos: str = "<|im_end|>"
) -> None:
    """A character-level tokenizer (printable ASCII and newline) with the vision and chat ``specials`` at the
    checkpoint's ids, and the chat ``template``."""
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))} | {"\n": 95, "<unk>": 96}
    vocab |= {f"<unused_{i}>": i for i in range(97, 256) if i not in specials.values()} | specials
    tokenizer = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": template, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def vl_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vl") / "qwen3_vl"
    shutil.copytree(TINY / "qwen3_vl", folder)
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def llm(vl_folder: Path) -> LLM:
    return LLM(vl_folder, backend="numpy", kv_cache_memory_gib=1 / 16)


@pytest.fixture(scope="module")
def start(llm: LLM) -> Iterator[Callable[..., LiveServer]]:
    servers: list[LiveServer] = []

    def make(**config: Any) -> LiveServer:
        server = serve(llm.engine, llm.require_tokenizer(), "qwen3-vl", **config)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def server(start: Callable[..., LiveServer]) -> LiveServer:
    return start()


def png(name: str = "image_a.png") -> bytes:
    with Image.open(TINY / "qwen3_vl" / name) as image:
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def openai_messages(url: str, text: str = "What is here?") -> Any:
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def test_openai_sdk_image_matches_the_offline_api(server: LiveServer, llm: LLM) -> None:
    text_only = llm.require_tokenizer().encode("<|im_start|>user\nWhat is here?<|im_end|>\n<|im_start|>assistant\n")
    chat = server.openai().chat.completions.create(
        model="qwen3-vl",
        messages=openai_messages(data_url(png())),
        max_tokens=6,
        temperature=0,
    )
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == len(text_only) + 2 + IMAGE_TOKENS  # vision start and end, image pads
    tokens = httpx.post(server.url + "/tokenize", json={"messages": openai_messages(data_url(png()))}).json()["tokens"]
    assert len(tokens) == chat.usage.prompt_tokens and tokens.count(250) == IMAGE_TOKENS
    offline = llm.generate(
        {"prompt_token_ids": tokens, "images": [png()]}, SamplingParams(temperature=0, max_tokens=6)
    )[0]
    assert chat.choices[0].message.content == offline.outputs[0].text


def test_anthropic_sdk_base64_image_block(server: LiveServer) -> None:
    messages: Any = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
                },
                {"type": "text", "text": "What is here?"},
            ],
        }
    ]
    client = server.anthropic()
    message = client.messages.create(model="qwen3-vl", max_tokens=6, messages=messages, extra_body={"temperature": 0})
    counted = client.messages.count_tokens(model="qwen3-vl", messages=messages)
    assert message.usage.input_tokens == counted.input_tokens > IMAGE_TOKENS
    chat = server.openai().chat.completions.create(
        model="qwen3-vl",
        messages=openai_messages(data_url(png())),
        max_tokens=6,
        temperature=0,
    )
    assert message.content[0].text == chat.choices[0].message.content  # type: ignore[union-attr]


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/redirect":  # to the same server under another host name
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/a.png")
            self.end_headers()
            return
        body = png()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/a.png"
    httpd.shutdown()


def test_remote_images_only_from_allowed_hosts(
    start: Callable[..., LiveServer], server: LiveServer, image_host: str
) -> None:
    with pytest.raises(
        openai.BadRequestError, match=r"messages\[0\]\.content\[0\]: fetching images from 127\.0\.0\.1 is not allowed"
    ):
        server.openai().chat.completions.create(model="qwen3-vl", messages=openai_messages(image_host), max_tokens=2)
    allowed = start(media=MediaPolicy(allowed_domains=("127.0.0.1",)))
    chat = allowed.openai().chat.completions.create(
        model="qwen3-vl", messages=openai_messages(image_host), max_tokens=2
    )
    assert chat.usage is not None and chat.usage.prompt_tokens > IMAGE_TOKENS
    redirect = image_host.replace("/a.png", "/redirect")
    with pytest.raises(openai.BadRequestError, match="redirected to http://localhost:.*is not allowed"):
        allowed.openai().chat.completions.create(model="qwen3-vl", messages=openai_messages(redirect), max_tokens=2)
    small = start(media=MediaPolicy(allow_remote=True, max_bytes=100))
    with pytest.raises(openai.BadRequestError, match="larger than 100 bytes"):
        small.openai().chat.completions.create(model="qwen3-vl", messages=openai_messages(image_host), max_tokens=2)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (data_url(png()[:300]), "cannot be decoded"),
        (data_url(b"hello", "text/plain"), "'text/plain' is not an image type"),
        (data_url(png(), "image/png").replace(";base64", ""), "must be data:<image type>;base64"),
        ("ftp://example.com/a.png", "must be data:, http: or https: URLs"),
    ],
    ids=["truncated", "wrong-mime", "not-base64", "ftp"],
)
def test_bad_images_are_400s_naming_the_part(server: LiveServer, url: str, message: str) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json={"messages": openai_messages(url), "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages[0].content[0]" and message in error["message"]


def test_limits(start: Callable[..., LiveServer]) -> None:
    limited = start(media=MediaPolicy(max_images=1, max_pixels=16 * 16))
    two = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png())}}] * 2}]
    response = httpx.post(limited.url + "/v1/chat/completions", json={"messages": two, "max_tokens": 2})
    assert response.status_code == 400 and "at most 1 per prompt" in response.json()["error"]["message"]
    chat = limited.openai().chat.completions.create(
        model="qwen3-vl", messages=openai_messages(data_url(png())), max_tokens=2
    )
    assert chat.usage is not None
    tokens = httpx.post(limited.url + "/tokenize", json={"messages": openai_messages(data_url(png()))}).json()["tokens"]
    assert tokens.count(250) == 2  # 45 x 30 resized to 16 x 8 (256 pixels): a 4 x 2 patch grid, merged 2 x 2


def test_media_flags_make_the_policy() -> None:
    from atlas_core.cli import build_parser
    from atlas_core.errors import ConfigError
    from atlas_core.server.cli_serve import media_policy, serve_settings

    argv = ["serve", "--limit-mm-per-prompt", '{"image": 2}', "--vision-max-pixels", "50000"]
    argv += ["--allowed-media-domains", "Images.Example.com", ".cdn.org", "--media-max-bytes", "1000"]
    settings = serve_settings(build_parser().parse_args(argv), {"ATLAS_MEDIA_FETCH_TIMEOUT": "2.5"})
    assert media_policy(settings) == MediaPolicy(2, 50000, ("images.example.com", "cdn.org"), False, 1000, 2.5)
    bad = serve_settings(build_parser().parse_args(["serve", "--limit-mm-per-prompt", '{"video": 1}']), {})
    with pytest.raises(ConfigError, match="limit-mm-per-prompt"):
        media_policy(bad)
