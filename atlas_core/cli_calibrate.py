"""``atlas calibrate-kv``: fp8 KV-cache scales measured on text, written to the file ``--kv-cache-scales`` reads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from atlas_core.engine.config import ENGINE_OPTIONS
from atlas_core.engine.kv_calibration import CALIBRATION_TEXT, measure_kv_scales, write_kv_scales
from atlas_core.errors import ConfigError
from atlas_core.options.flags import add_flags, parsed_values

CALIBRATION_SETTINGS: dict[str, Any] = {
    "kv_cache_memory_gib": 0.5,
    "max_num_seqs": 1,
    "enable_prefix_caching": False,
    "max_state_snapshots": 0,
}
"""Engine settings of the calibration run unless given: one sequence in a small KV cache (every layer is read back
to the host once), without recurrent-state snapshots; ``max_seq_len`` unset is ``--max-prompt-tokens`` + 1 at most."""


def run_calibrate(args: argparse.Namespace) -> int:
    from atlas_core.engine.llm import LLM

    values = parsed_values(args, ENGINE_OPTIONS)
    if values.get("kv_cache_dtype", "auto") != "auto" or values.get("kv_cache_scales"):
        raise ConfigError("calibrate-kv measures the model with its default KV cache: drop --kv-cache-dtype/-scales")
    values |= {name: value for name, value in CALIBRATION_SETTINGS.items() if values.get(name) is None}
    values["default_max_seq_len"] = args.max_prompt_tokens + 1  # the context a max_seq_len left unset caps at
    values |= {"kv_cache_dtype": "auto", "kv_cache_scales": None}  # also over ATLAS_KV_CACHE_* variables
    text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else CALIBRATION_TEXT
    with LLM(**values) as llm:
        ids = llm.require_tokenizer().encode(text)[: min(args.max_prompt_tokens, llm.engine.max_seq_len - 1)]
        if not ids:
            raise ConfigError(f"calibrate-kv: the prompt file {args.prompt_file!r} holds no text")
        scales = measure_kv_scales(llm, [ids])
        write_kv_scales(Path(args.output), scales, llm.loaded.name)
    largest = max(max(pair) for pair in scales)
    print(
        f"wrote the fp8 KV scales of {len(scales)} layers ({len(ids)} calibration tokens; largest {largest:.4g}) to "
        f"{args.output}; use it with --kv-cache-dtype fp8 --kv-cache-scales {args.output}"
    )
    return 0


def add_calibrate_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "calibrate-kv", help="measure fp8 KV-cache scales on text and write them to a file for --kv-cache-scales"
    )
    add_flags(parser, ENGINE_OPTIONS, with_defaults=False)  # unset: CALIBRATION_SETTINGS, then the usual defaults
    parser.add_argument("--output", required=True, help="the JSON file to write (pass it to --kv-cache-scales)")
    parser.add_argument(
        "--prompt-file", default=None, help="UTF-8 text to calibrate on (default: built-in mixed prose, code, tables)"
    )
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=2048, help="most calibration tokens used (default: 2048)"
    )
    parser.set_defaults(handler=run_calibrate)
