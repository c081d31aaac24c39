"""``atlas serve``: start HTTP at once (``/health`` answers 503 while loading), load the model in
a background thread, then print the ready line and serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from atlas_core.errors import ConfigError
from atlas_core.options.flags import add_flags, parsed_values
from atlas_core.options.resolve import Settings
from atlas_core.server.settings import SERVE_OPTIONS

if TYPE_CHECKING:
    from atlas_core.server.media import MediaPolicy
    from atlas_core.server.state import ServerConfig

log = logging.getLogger("atlas.serve")

LOOPBACK = ("127.0.0.1", "localhost", "::1")

EPILOG = (
    "Every option can also be set in the environment: ATLAS_ + the option in capitals with _ for -\n"
    "(e.g. ATLAS_PORT=9000, ATLAS_API_KEY=secret, ATLAS_MODEL=Qwen/Qwen3-8B). Precedence: flag >\n"
    "environment > the model family's defaults (e.g. its tool-call and reasoning parsers) > the\n"
    "defaults shown here. Lists in the environment are comma-separated.\n\nVariables: "
    + ", ".join(opt.env_name for opt in SERVE_OPTIONS)
)


def add_serve_parser(commands: Any) -> None:
    """Register ``atlas serve`` on ``commands`` (the ``add_subparsers`` object of the ``atlas`` parser).
    Flags that are not given stay out of the parsed namespace, so that `Settings` can fill them in
    from the environment and the family's defaults."""
    parser = commands.add_parser(
        "serve",
        help="serve a model over OpenAI- and Anthropic-compatible HTTP APIs",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a model: a chat page at /, /v1/chat/completions, /v1/completions, /v1/responses, "
        "/v1/embeddings, /v1/models, /v1/messages, /tokenize, /detokenize, /health, /metrics, /openapi.json.",
    )
    add_flags(parser, SERVE_OPTIONS, with_defaults=False)
    parser.set_defaults(handler=run_serve)


def serve_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """The `atlas serve` settings of parsed ``args`` over ``env`` (default: `os.environ`)."""
    return Settings(SERVE_OPTIONS, parsed_values(args, SERVE_OPTIONS), env)


def run_serve(args: argparse.Namespace) -> int:
    """Resolve the settings, then serve until a shutdown signal; the exit status."""
    from atlas_core.server.state import ServerState
    from atlas_core.server.uvicorn_server import make_server

    settings = serve_settings(args)
    configure_logging(settings["log_level"])
    if settings["rank"]:  # a rank other than 0 of a split model: it works for rank 0, which serves
        return _run_rank(settings)
    config = server_config(settings)
    host, port = settings["host"], settings["port"]
    if host not in LOOPBACK and not config.api_keys:
        print(
            f"\n{'!' * 78}\n"
            f"WARNING: listening on {host} WITHOUT authentication: anyone who can reach this machine can\n"
            f"use the model. Pass --api-key KEY (or ATLAS_API_KEY) to require a key.\n{'!' * 78}\n",
            file=sys.stderr,
            flush=True,
        )
    state = ServerState(config)
    server = make_server(state, host, port, log_level="debug" if settings["log_level"] == "debug" else "warning")
    failures: list[BaseException] = []
    loader = threading.Thread(target=_load, args=(settings, state, server, failures), name="atlas-load", daemon=True)
    loader.start()
    server.run()
    if failures:
        raise failures[0]
    return 0


def server_config(settings: Settings) -> ServerConfig:
    """The HTTP-level `ServerConfig` of resolved ``settings`` (the keys of ``--api-keys-file`` read
    and added to ``--api-key``'s)."""
    from atlas_core.server.auth import read_keys_file
    from atlas_core.server.state import ServerConfig

    keys = list(settings["api_key"] or []) + (
        read_keys_file(settings["api_keys_file"]) if settings["api_keys_file"] else []
    )
    return ServerConfig(
        model_names=list(settings["served_model_name"] or []),
        api_keys=keys,
        request_timeout=settings["request_timeout"],
        max_body_bytes=settings["max_body_bytes"],
        cors_allow_origins=list(settings["cors_allow_origins"] or []),
        shutdown_timeout=settings["shutdown_timeout"],
        max_sequences_per_request=settings["max_sequences_per_request"],
        max_tokens_per_request=settings["max_tokens_per_request"],
        enable_special_tokens_in_content=settings["enable_special_tokens_in_content"],
        responses_store_size=settings["responses_store_size"],
        accept_any_model_name=settings["accept_any_model_name"],
        log_requests=settings["log_requests"],
        web_ui=not settings["no_web_ui"],
        media=media_policy(settings),
    )


def media_policy(settings: Settings) -> MediaPolicy:
    """The image limits of ``--limit-mm-per-prompt``, ``--vision-max-pixels`` and the remote-media flags."""
    from atlas_core.server.media import MediaPolicy

    limits = settings["limit_mm_per_prompt"] or {}
    unknown = sorted(set(limits) - {"image"})
    if unknown or not isinstance(limits.get("image", 8), int) or limits.get("image", 8) < 0:
        raise ConfigError(f'--limit-mm-per-prompt takes {{"image": N}} with N >= 0, got {json.dumps(limits)}')
    max_pixels = settings["vision_max_pixels"]
    if max_pixels is not None and max_pixels < 1:
        raise ConfigError(f"--vision-max-pixels must be at least 1, got {max_pixels}")
    return MediaPolicy(
        max_images=int(limits.get("image", 8)),
        max_pixels=max_pixels,
        allowed_domains=tuple(d.lower().lstrip(".") for d in settings["allowed_media_domains"] or []),
        allow_remote=settings["allow_remote_media"],
        max_bytes=settings["media_max_bytes"],
        timeout=settings["media_fetch_timeout"],
    )


def configure_logging(level: str) -> None:
    """Log records of ``level`` and above to stderr, one line each (time, level, logger, message)."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True
    )


def _load(settings: Settings, state: Any, server: Any, failures: list[BaseException]) -> None:
    """Load the model into ``state`` (the server answers 503 meanwhile); on failure stop the server."""

    def stop(exc: BaseException) -> None:  # reported by run_serve once the server has stopped
        failures.append(exc)
        server.should_exit = True

    try:
        description = _attach_model(settings, state, stop)
    except BaseException as exc:
        stop(exc)
        return
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        print(f"atlas ready: http://{settings['host']}:{server.bound_port} {description}", flush=True)


def _run_rank(settings: Settings) -> int:
    """Rank ``--rank`` (1 or more) of a model split over ranks started by hand: load this rank's shard and
    run rank 0's steps until rank 0 stops (exit status 0) or the replica fails (`CommError`)."""
    from atlas_core.engine.config import EngineConfig
    from atlas_core.parallel.worker import run_worker

    replica = EngineConfig(**settings.of(EngineConfig)).replica_settings()
    log.info("rank %d of %d: joining rank 0 at %s", replica.rank, replica.world_size, replica.master_addr)
    run_worker(settings["model"], settings["backend"], replica)
    return 0


def _attach_model(settings: Settings, state: Any, on_failure: Callable[[BaseException], None] | None = None) -> str:
    """Load, configure and attach the model; returns the ready line's description of it. A model split over
    ranks calls ``on_failure`` when the replica fails (a rank died, a collective timed out)."""
    from atlas_core.backends.select import select_backend
    from atlas_core.engine.async_engine import AsyncEngine
    from atlas_core.engine.config import EngineConfig
    from atlas_core.engine.llm_engine import LLMEngine
    from atlas_core.engine.pooling_config import pooling_config
    from atlas_core.errors import AtlasError
    from atlas_core.model.generation_config import sampling_defaults
    from atlas_core.parallel.mirror import RankMirror
    from atlas_core.parallel.replica import load_engine_model
    from atlas_core.parsing.registry import reasoning_format, tool_format
    from atlas_core.plugins import get_registry
    from atlas_core.server.settings import BEFORE_LOADING, chat_template_text, parser_name
    from atlas_core.server.state import ModelRuntime
    from atlas_core.tokenizer.chat_template import ChatTemplate

    registry = get_registry()
    backend = select_backend(registry, settings["backend"])
    replica = EngineConfig(**settings.of(EngineConfig)).replica_settings()
    loaded = load_engine_model(settings["model"], backend, registry, replica)
    mirror = loaded.model.mirror if isinstance(loaded.model.mirror, RankMirror) else None
    if mirror is not None:
        atexit.register(mirror.close)  # the other ranks stop, and their processes are reaped, at exit
    unknown = settings.apply_family_defaults(loaded.family_defaults, fixed=BEFORE_LOADING)
    if unknown:
        log.warning("the %s family defaults name no serve option: %s", loaded.name, ", ".join(unknown))
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise AtlasError(
            f"{loaded.resolved.path} has no tokenizer (tokenizer.json or tokenizer.model); atlas serve needs one"
        )
    if settings["chat_template"]:
        text = chat_template_text(settings["chat_template"])
        ChatTemplate(text, origin="--chat-template")  # a syntax error stops the server now, not per request
        tokenizer.chat_template, tokenizer.tool_chat_template = text, None
    config = state.config
    config.tool_call_parser = parser_name(settings["tool_call_parser"])
    config.reasoning_parser = parser_name(settings["reasoning_parser"])
    if config.tool_call_parser:
        tool_format(config.tool_call_parser)
    if config.reasoning_parser:
        reasoning_format(config.reasoning_parser)
    config.default_chat_template_kwargs = dict(settings["default_chat_template_kwargs"] or {})
    if settings["generation_config"] == "auto":
        config.generation_defaults = sampling_defaults(loaded.resolved.path)
    config.pooling = pooling_config(loaded.resolved.path, loaded.config, settings["pooling"])
    if not config.model_names:
        config.model_names = [loaded.name]
    engine = LLMEngine(loaded, backend, EngineConfig(**settings.of(EngineConfig)))
    if mirror is not None and on_failure is not None:
        mirror.on_failure(on_failure)
    state.attach(ModelRuntime(AsyncEngine(engine), tokenizer))
    from_family = ", ".join(f"{k}={settings[k]}" for k, source in settings.sources.items() if source == "family")
    capacity, max_len = engine.kv_capacity_tokens, engine.max_seq_len
    return (
        f"model={config.model_names[0]} backend={backend.name} "
        f"kv_capacity={capacity} tokens ({capacity // max_len} sequences of max_seq_len={max_len}) "
        f"kv_cache_dtype={engine.kv_dtype} "
        f"max_num_seqs={engine.config.max_num_seqs} tool_call_parser={config.tool_call_parser} "
        f"reasoning_parser={config.reasoning_parser}"
        + (f" generation_config={config.generation_defaults}" if config.generation_defaults else "")
        + (f" (family defaults: {from_family})" if from_family else "")
    )
