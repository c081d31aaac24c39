"""``atlas serve``: load the model, start the engine thread, serve HTTP with uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from atlas_core.cli import add_engine_args, engine_kwargs

log = logging.getLogger("atlas.serve")


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from atlas_core.engine.async_engine import AsyncEngine
    from atlas_core.engine.llm import LLM
    from atlas_core.server.app import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"WARNING: serving on {args.host} exposes the model to the network without authentication", file=sys.stderr)
    llm = LLM(args.model, **engine_kwargs(args))
    name = args.served_model_name or llm.loaded.name
    app = create_app(AsyncEngine(llm.engine), llm.require_tokenizer(), name)
    engine = llm.engine
    print(
        f"atlas ready: http://{args.host}:{args.port}/v1 model={name} backend={llm.backend.name} "
        f"kv_capacity={engine.kv_capacity_tokens} tokens max_seq_len={engine.max_seq_len} "
        f"max_num_seqs={engine.config.max_num_seqs}",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def add_serve_parser(commands: Any) -> None:
    parser = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_engine_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8888, help="port (default: 8888)")
    parser.add_argument("--served-model-name", default=None, help="model name reported by the API (default: the model's)")
    parser.set_defaults(handler=run_serve)
