"""SmolLM2-135M-Instruct as a Q8_0 GGUF beside its F16 version on the CPU (numpy backend): resident memory and
speed.

Both files are written from the built-in model's GGUF with the `gguf` package: every tensor read back as floats
by `gguf.quants`, then each 2-D weight stored as Q8_0 (`gguf.quants.quantize`) in one file and as F16 in the
other, 1-D tensors as F32, the metadata (tokenizer, chat template, hyperparameters) copied. Each file is then
measured in fresh processes: the resident growth after loading it (``LLM(path, backend="numpy",
gguf_weights=...)``, VmRSS after minus before) and ``atlas bench latency``'s prefill and decode lines. The Q8_0
file is measured twice: its blocks kept (``--gguf-weights quantized``) and read as floats (``float``).

    OPENBLAS_NUM_THREADS=1 python scripts/bench_gguf_cpu.py [--out DIR] [--tokens 16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from atlas_core.model.resolve import default_model_path

Q8_0_BLOCK = 32
"""Elements per Q8_0 block: a weight's rows must hold whole blocks."""
RSS_PROBE = """
import sys
from atlas_core import LLM

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
before = rss_mib()
llm = LLM(sys.argv[1], backend="numpy", gguf_weights=sys.argv[2], kv_cache_memory_gib=1 / 64, max_seq_len=256)
print(f"{rss_mib() - before:.1f}")
"""


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    """Every key of ``reader`` but the file header's and the architecture (the writer adds those)."""
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)


def rewrite(source: Path, target: Path, weight_type: Q) -> None:
    """``source`` with its 2-D weights stored as ``weight_type`` (Q8_0 or F16) and its 1-D tensors as F32."""
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(target, arch)
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape(tuple(int(n) for n in reversed(tensor.shape)))
        if values.ndim != 2:
            writer.add_tensor(tensor.name, values)
        elif weight_type == Q.Q8_0 and values.shape[-1] % Q8_0_BLOCK == 0:
            blocks = gguf.quants.quantize(values, Q.Q8_0)
            writer.add_tensor(tensor.name, blocks, raw_shape=blocks.shape, raw_dtype=Q.Q8_0)
        else:
            writer.add_tensor(tensor.name, values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def measure(path: Path, gguf_weights: str, tokens: int) -> list[str]:
    """The resident growth after loading ``path`` and the bench's prefill and decode lines."""
    growth = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(path), gguf_weights], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    bench = subprocess.run(
        [
            sys.executable,
            "-m",
            "atlas_core.cli",
            "bench",
            "latency",
            str(path),
            "--backend",
            "numpy",
            "--tokens",
            str(tokens),
            "--kv-cache-memory-gib",
            "0.0625",
            "--max-seq-len",
            "256",
            "--gguf-weights",
            gguf_weights,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [line for line in bench.splitlines() if line.startswith(("weights/step", "prefill", "decode"))]
    return [f"resident growth after load: {growth} MiB", *lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="where to write the two GGUF files (a temporary folder)")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        files = {"Q8_0": out / "SmolLM2-135M-Instruct.Q8_0.gguf", "F16": out / "SmolLM2-135M-Instruct.F16.gguf"}
        for name, path in files.items():
            rewrite(default_model_path(), path, Q.Q8_0 if name == "Q8_0" else Q.F16)
        runs = [("Q8_0", "quantized"), ("Q8_0", "float"), ("F16", "float")]
        for name, gguf_weights in runs:
            size = files[name].stat().st_size / 2**20
            print(f"{name} file ({size:.1f} MiB), --gguf-weights {gguf_weights}")
            for line in measure(files[name], gguf_weights, args.tokens):
                print(f"  {line}")


if __name__ == "__main__":
    main()
