"""The kernel library on a GPU: a warm kernel cache compiles nothing, and kernels whose code waits for their inputs
are the ones launched programmatically where the device supports it. Needs a CUDA GPU; skipped with the backend's
own reason elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from atlas_gb10.backend import CudaBackend

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def test_warm_kernel_cache_compiles_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import numpy as np
        from atlas_gb10.backend import CudaBackend
        b = CudaBackend()
        x = b.from_numpy(np.ones((4, 64), np.float32))
        w = b.from_numpy(np.ones((32, 64), np.float32), weight=True)
        b.argmax(b.linear(b.rms_norm(x, w[0], 1e-6)[0], w))
        print("compiled", b.kernels.compiled)
        """
    )
    env = dict(os.environ, ATLAS_KERNEL_CACHE=str(tmp_path / "cache"))
    runs = [
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600, check=False
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split()[-1] == "3", runs[0].stdout
    assert runs[1].stdout.split()[-1] == "0", runs[1].stdout


@pytest.mark.parametrize(
    ("op", "name"),
    [
        ("rms_norm", "rms_norm_block_vec_bf16"),
        ("gemm", "gemm_bf16_m1_n2_vec"),
        ("attention", "attention_m16_d4"),
        ("attention_decode", "attention_decode_d8"),
        ("moe", "moe_route"),
        ("recurrent", "gated_delta_rule_bf16"),
    ],
)
def test_kernels_wait_for_their_inputs_where_launches_are_programmatic(
    backend: CudaBackend, op: str, name: str
) -> None:
    """On compute capability 9.0 and later a kernel's code holds ``await_inputs()``'s wait, so decode graphs
    capture it as a programmatic launch (`launch.py`); elsewhere the launch stays CuPy's."""
    from atlas_gb10.launch import supports_programmatic_launch

    kernel = backend.kernels.function(op, name)
    assert kernel.waits == supports_programmatic_launch(backend.profile.arch)
