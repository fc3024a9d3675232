"""Measuring attention: peak memory of known allocations, which SDPA kernel runs, timing."""

from __future__ import annotations

import time

import pytest
import torch
from torch.nn.attention import SDPBackend

from companion.measure import (
    SDPA_KERNELS,
    compare_with_naive,
    median_seconds,
    peak_memory_bytes,
    sdpa_backend,
)

# --- peak memory -------------------------------------------------------------------------------


def test_peak_memory_of_known_allocations():
    # One 4,000,000-byte tensor.
    assert peak_memory_bytes(lambda: torch.empty(1000, 1000)) == pytest.approx(4_000_000, rel=0.02)

    def alloc_free_alloc():
        big = torch.empty(2_000_000)  # 8 MB
        del big
        return torch.empty(1_000_000)  # 4 MB, after the 8 MB were freed

    # Replaying in order gives 8 MB: catches summing every allocation (12 MB) and taking the net
    # change (4 MB).
    assert peak_memory_bytes(alloc_free_alloc) == pytest.approx(8_000_000, rel=0.02)
    before = torch.empty(3_000_000)
    assert peak_memory_bytes(lambda x: x.add_(1), before) < 1000  # in place: nothing new
    assert peak_memory_bytes(lambda x, *, scale: x * scale, before, scale=2.0) == pytest.approx(
        12_000_000, rel=0.02
    )
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        peak_memory_bytes(3)


# --- torch's kernels ---------------------------------------------------------------------------


def test_sdpa_backend_on_the_cpu():
    # CPU tensors: torch's flash-attention CPU kernel unless dropout rules it out, then the
    # math path. Forcing a backend is obeyed. Catches a lookup that returns the first
    # scaled_dot_product operator seen (the dispatcher, not the kernel) or ignores `backends`.
    q = torch.randn(1, 2, 32, 16)
    backend = sdpa_backend(q, q, q)
    assert backend in set(SDPA_KERNELS.values())
    assert backend is SDPBackend.FLASH_ATTENTION
    assert sdpa_backend(q, q, q, is_causal=True) is SDPBackend.FLASH_ATTENTION
    assert sdpa_backend(q, q, q, dropout_p=0.1) is SDPBackend.MATH
    assert sdpa_backend(q, q, q, backends=[SDPBackend.MATH]) is SDPBackend.MATH
    forced = sdpa_backend(q, q, q, backends=[SDPBackend.FLASH_ATTENTION])
    assert forced is SDPBackend.FLASH_ATTENTION
    with pytest.raises(RuntimeError, match="No viable backend"):
        sdpa_backend(q, q, q, backends=[SDPBackend.EFFICIENT_ATTENTION])  # a CUDA-only kernel


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"backends": []}, ValueError, r"backends must name at least one SDPBackend"),
        (
            {"backends": ["math"]},
            TypeError,
            r"backends\[0\] must be a torch.nn.attention.SDPBackend",
        ),
        ({"backends": SDPBackend.MATH}, TypeError, r"backends must be a sequence of SDPBackend"),
        ({"dropout_p": 1.5}, ValueError, r"dropout_p must be in \[0, 1\)"),
        ({"is_causal": None}, TypeError, r"is_causal must be a bool"),
    ],
)
def test_sdpa_backend_bad_arguments(kwargs, error, message):
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(error, match=message):
        sdpa_backend(q, q, q, **kwargs)
    with pytest.raises(TypeError, match="k must be a floating-point tensor"):
        sdpa_backend(q, q.long(), q)


def test_compare_with_naive_and_median_seconds():
    q = torch.randn(1, 2, 64, 16)
    timing = compare_with_naive(q, q, q, is_causal=True, repeats=3)
    assert timing.backend is sdpa_backend(q, q, q, is_causal=True)
    assert timing.sdpa_seconds > 0 and timing.naive_seconds > 0
    assert timing.speedup == timing.naive_seconds / timing.sdpa_seconds
    forced = compare_with_naive(q, q, q, repeats=1, backends=[SDPBackend.MATH])
    assert forced.backend is SDPBackend.MATH
    # a 20 ms sleep takes at least 20 ms (and, even on a busy machine, well under 2 s)
    assert 0.02 <= median_seconds(time.sleep, 0.02, repeats=3, warmup=0) < 2.0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        median_seconds(time.sleep, 0.0, repeats=0)


def test_profiler_log_lines_stay_out_of_stderr_and_other_lines_pass():
    """torch's profiler writes ``USDT:… profiler_start`` lines to descriptor 2 at every start;
    the measuring functions keep them out (they would land in a chapter's output) and pass on
    anything else written to stderr meanwhile. Run in a fresh process: pytest captures fd 2."""
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "from companion.measure import peak_memory_bytes, sdpa_backend\n"
        "def noisy():\n"
        "    os.write(2, b'a warning of our own\\n')\n"
        "    return torch.randn(64, 64)\n"
        "assert peak_memory_bytes(noisy) > 0\n"
        "q = torch.randn(1, 2, 8, 4)\n"
        "sdpa_backend(q, q, q)\n"
        "from torch.profiler import profile\n"
        "with profile():\n"  # the bare profiler does print them: the check can see them
        "    torch.randn(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "a warning of our own" in lines, f"stderr lost the function's own line: {lines}"
    profiler_lines = [line for line in lines if "profiler_start" in line]
    assert len(profiler_lines) == 1, (
        f"expected exactly one profiler_start line (from the bare profiler), got {profiler_lines}"
    )
