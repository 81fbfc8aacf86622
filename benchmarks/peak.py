"""The peak of the device that ran the model, measured in the same run (issue 44 item 8): every benchmark states its
figures as a fraction of it; and the matrix work of an encoder and an MLM head, counted the same way everywhere.

- a CUDA GPU: float32 (TF32 off), TF32 and bfloat16 matrix products, each the best of a few timed repeats after a
  warm-up, at ``n = 8192`` (the square shape where a GPU comes closest to its datasheet) and synchronised;
- a CPU: float32, and bfloat16 only where the CPU has bf16 matrix units (:func:`analysis.core.precision.bf16_units`;
  without them a bf16 product is emulated and slower than float32, so it is no peak), at ``n = 2048``.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _tf32(on: bool):
    if not torch.cuda.is_available():
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def gemm_tflops(device: str | torch.device, dtype: torch.dtype = torch.float32, n: int | None = None,
                repeats: int = 5) -> float:
    """TFLOP/s of the best of ``repeats`` ``n x n`` products in ``dtype`` on ``device``."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def device_peaks(device: str | torch.device) -> dict[str, float]:
    """The measured peaks of ``device`` in TFLOP/s: ``float32`` always; ``tf32`` and ``bfloat16`` on a CUDA GPU;
    ``bfloat16`` on a CPU with bf16 units."""
    from analysis.core.precision import bf16_units

    device = torch.device(device)
    if device.type == "cuda":
        with _tf32(False):
            peaks = {"float32": gemm_tflops(device)}
        with _tf32(True):
            peaks["tf32"] = gemm_tflops(device)
        peaks["bfloat16"] = gemm_tflops(device, torch.bfloat16)
        return peaks
    peaks = {"float32": gemm_tflops(device)}
    if bf16_units("cpu"):
        peaks["bfloat16"] = gemm_tflops(device, torch.bfloat16)
    return peaks


def device_name(device: str | torch.device) -> str:
    """The device in words, for a benchmark's first line."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return (f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} "
            f"torch threads, load {os.getloadavg()[0]:.1f}")


def encoder_flops(loaded, tokens: int, mean_len: float) -> float:
    """Forward matrix FLOPs of the encoder over ``tokens`` tokens: ``24 d^2 + 4 n d`` per token per layer."""
    d = loaded.anatomy.hidden_size
    return tokens * loaded.num_layers * (24 * d * d + 4 * mean_len * d)


def head_flops(loaded, rows: int) -> float:
    """The MLM head on ``rows`` rows: its transform and the vocabulary product."""
    d, v = loaded.anatomy.hidden_size, loaded.anatomy.vocab_size
    return rows * (2 * d * d + 2 * d * v)
