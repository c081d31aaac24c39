"""`atlas serve` settings: `ModelChoice` and `EngineConfig` (the engine's) plus `ServeOptions`
(the server's), all declared as `atlas_core.options` fields. Each comes from the command line,
else the environment (``ATLAS_`` + the flag's name in capitals, ``-`` as ``_``: ``--max-num-seqs``
is ``ATLAS_MAX_NUM_SEQS``), else the model family's defaults (registration metadata ``defaults``),
else the built-in default.

Environment values are parsed like the flag's value; lists are comma-separated; booleans accept
1/0, true/false, yes/no, on/off.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from atlas_core.engine.config import EngineConfig, ModelChoice
from atlas_core.engine.pooling import PoolingType
from atlas_core.errors import ConfigError
from atlas_core.options.declare import option, options_of

LogLevel = Literal["debug", "info", "warning", "error"]
GenerationConfigSource = Literal["auto", "none"]


@dataclass(frozen=True)
class ServeOptions:
    """The `atlas serve` settings that are not engine settings."""

    host: str = option(
        "127.0.0.1", help="interface to listen on; anything but loopback needs --api-key", aliases=("bind",)
    )
    port: int = option(8888, help="port")
    served_model_name: list[str] = option(
        default_factory=list,
        metavar="NAME",
        help="names clients may use as `model`; the first is reported",
        default_help="the model's name",
        aliases=("model-name",),
    )
    accept_any_model_name: bool = option(
        False, help="serve requests whatever `model` they name (agent clients that send their own model ids)"
    )
    tool_call_parser: str | None = option(
        None,
        metavar="NAME",
        help="tool-call format of the model's output, or 'none'",
        default_help="the family's, else none",
    )
    reasoning_parser: str | None = option(
        None,
        metavar="NAME",
        help="reasoning format of the model's output, or 'none'",
        default_help="the family's, else none",
    )
    chat_template: str | None = option(
        None, metavar="FILE_OR_JINJA", help="replace the model's chat template", default_help="the model's"
    )
    default_chat_template_kwargs: dict[str, Any] = option(
        default_factory=dict,
        metavar="JSON",
        help="chat template variables for every request, e.g. '{\"enable_thinking\": false}'",
    )
    api_key: list[str] = option(
        default_factory=list,
        repeat=True,
        metavar="KEY",
        help="require this key on /v1/* and tokenize; repeatable",
        default_help="none, no auth",
    )
    api_keys_file: str | None = option(None, metavar="FILE", help="file of accepted keys, one per line")
    request_timeout: float | None = option(
        None, metavar="SECONDS", help="end requests running longer than this", default_help="no limit"
    )
    max_body_bytes: int = option(16 * 2**20, metavar="BYTES", help="largest request body accepted")
    cors_allow_origins: list[str] = option(
        default_factory=list, metavar="ORIGIN", help="origins allowed by CORS, or '*'", default_help="none, CORS off"
    )
    shutdown_timeout: float = option(
        30.0, metavar="SECONDS", help="on shutdown, how long in-flight requests may continue before they are ended"
    )
    max_sequences_per_request: int = option(
        256, metavar="N", help="most completions one request may ask for (prompts times n); more is a 400"
    )
    max_tokens_per_request: int = option(
        2**20,
        metavar="TOKENS",
        help="most tokens one request may create: its prompt tokens plus, for each completion, the tokens it may "
        "generate (max_tokens, else the rest of the context); more is a 400",
    )
    responses_store_size: int = option(
        256,
        metavar="N",
        help="most /v1/responses responses kept in memory for previous_response_id and GET (least recently used "
        "dropped first); 0 keeps none",
    )
    enable_special_tokens_in_content: bool = option(
        False,
        help="tokenize special-token strings inside message content (e.g. <|im_start|>) as special tokens; "
        "off: content is plain text, only the chat template's own markup is special",
    )
    no_web_ui: bool = option(False, help="do not serve the chat page at / (the API routes are unaffected)")
    log_level: LogLevel = option("info", help="least severe log messages shown (an access line per request at info)")
    log_requests: bool = option(
        False,
        help="also log each request's prompt text (off: only its method, path, status, token counts and time)",
        aliases=("enable-log-requests",),
    )
    generation_config: GenerationConfigSource = option(
        "auto",
        help="auto: sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty) from the checkpoint's "
        "generation_config.json for requests that omit them; none: built-in defaults only",
    )
    pooling: PoolingType | None = option(
        None,
        help="/v1/embeddings: pool the final hidden states of the last token or the mean of all tokens",
        default_help="the model's (sentence-transformers Pooling config), else last",
    )
    limit_mm_per_prompt: dict[str, Any] = option(
        default_factory=lambda: {"image": 8},
        metavar="JSON",
        help="most media items one request may carry, by kind, e.g. '{\"image\": 4}'; more is a 400",
    )
    vision_max_pixels: int | None = option(
        None,
        metavar="PIXELS",
        help="resize each image to at most this many pixels before the vision encoder (fewer tokens per image)",
        default_help="the model's own pixel budget",
    )
    allowed_media_domains: list[str] = option(
        default_factory=list,
        metavar="HOST",
        help="hosts (and their subdomains) whose http(s) image URLs requests may name; data: URLs are always read",
        default_help="none",
    )
    allow_remote_media: bool = option(
        False, help="fetch http(s) image URLs of any host (else see --allowed-media-domains)"
    )
    media_max_bytes: int = option(20 * 2**20, metavar="BYTES", help="largest image fetched from a URL")
    media_fetch_timeout: float = option(10.0, metavar="SECONDS", help="longest wait for one image fetched from a URL")


SERVE_OPTIONS = options_of(ModelChoice, EngineConfig, ServeOptions)
"""Every `atlas serve` setting, in the order of ``--help``."""

BEFORE_LOADING = ("model", "backend", "max_seq_len")
"""Settings needed to find and load the model (``max_seq_len`` sizes its position tables), so family
defaults cannot set them."""


def chat_template_text(reference: str) -> str:
    """``--chat-template``: a file path, or the Jinja template itself."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{%" in reference or "{{" in reference:
        return reference
    raise ConfigError(f"--chat-template {reference!r}: no such file, and it does not look like a Jinja template")


def parser_name(value: str | None) -> str | None:
    """``none`` (any case) or empty turns a family's default parser off."""
    return None if value is None or value.strip().lower() in ("", "none") else value
