"""The precision policy: what runs in bfloat16, what is certified, what falls back to float32 (issue 26).

One place decides; the analyses ask it. Today it decides the MLM head's vocabulary product, 75% of the probe's
work at bert-base size:

- ``float32`` (the default): every product in float32.
- ``certified``: the same tables as ``float32`` (predictions, ranks, top-k and counts identical; probabilities
  within a bound stated per row). Where the machine has bf16 matrix units (:func:`bf16_units`: AMX /
  AVX512-BF16 on a CPU), the vocabulary product runs in bfloat16 with float32 accumulation, every row's rounding
  error is bounded, and a row whose answer the bound cannot certify is recomputed in float32
  (:class:`CertifiedHead`). Elsewhere it is ``float32``. Not the default: measured on this project's 2-core AMX
  machine it is slower than float32 (docs/benchmarks.md): the demo model's head is small (256 x 6,000: bf16 only
  2.2x) and 16% of its rows need float32; a bert-base-sized model with random weights has flat logits, so the
  worst-case bound certifies no row. What would make it pay is a tighter bound (below).

The encoder always runs in the model's own dtype (float32 unless the user chose otherwise). With a tuned lens or
the divergence view (which need the full distributions) the head runs in float32.

The certified head itself, and the bound it keeps, are :mod:`analysis.probe.certified`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path

import torch

from analysis.core.options import PRECISIONS  # defined torch-free, for the options schemas

FORCE_ENV = "LAYERLENS_BF16_UNITS"  # "1"/"0": say the machine has (not) bf16 matrix units (tests, benchmarks)


@functools.cache
def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def bf16_units(device: str = "cpu") -> bool:
    """Whether ``device`` has bfloat16 matrix units worth using: a CUDA GPU that supports bfloat16, or a CPU with
    AMX-BF16 or AVX512-BF16 that oneDNN can use. ``LAYERLENS_BF16_UNITS=0/1`` overrides (tests run both paths)."""
    forced = os.environ.get(FORCE_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device != "cpu":
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported and supported()) and bool({"amx_bf16", "avx512_bf16"} & _cpu_flags())


@functools.cache
def cpu_bf16_speedup() -> float:
    """How much faster a bfloat16 product is than a float32 one on this CPU: one timed GEMM of a layer's shape
    (1,024 x 768 by 768 x 768, best of 3 after a warm-up), measured once per process (~40 ms)."""
    import time

    torch.manual_seed(0)
    a, b = torch.randn(1024, 768), torch.randn(768, 768)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        times = []
        for _ in range(3):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    return best[torch.float32] / best[torch.bfloat16]


BF16_PAYS = 1.5  # a bf16 product this much faster than float32 (or more) is worth autocast's casts


def bf16_pays(device: str = "cpu") -> bool:
    """Whether training on ``device`` should run its products in bfloat16 autocast (float32 master weights): a
    GPU with bfloat16, or a CPU with bf16 units (:func:`bf16_units`) where a timed product shows bfloat16 at least
    ``BF16_PAYS`` x faster (chosen by measurement, not by the name of the device). ``LAYERLENS_BF16_UNITS``
    forces it as for :func:`bf16_units`."""
    if not bf16_units(device):
        return False
    if device.startswith("cuda") or os.environ.get(FORCE_ENV) == "1":
        return True
    return cpu_bf16_speedup() >= BF16_PAYS


def head_product(precision: str, device: str, needs_distributions: bool = False) -> str:
    """What the MLM head's vocabulary product runs in for a run of ``precision`` on ``device``:
    ``"bfloat16, certified"`` (a CPU with bf16 units, or a CUDA GPU with bf16) or ``"float32"`` (a CPU without
    bf16 units, a lens or the divergence view, or ``precision="float32"``). ``certified`` is asked for, never the
    default: where it pays on a GPU was not measured (no GPU was at hand, docs/benchmarks.md)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not '{precision}'")
    if precision != "certified" or needs_distributions:
        return "float32"
    if device == "cpu" and bf16_units(device):
        return "bfloat16, certified"
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bfloat16, certified"  # the head's torch path (analysis.probe.certified, issue 44 item 5)
    return "float32"



AGREEMENT_TEXTS = 32  # the approximate mode is checked against float32 on this many texts (probe) ...
AGREEMENT_ROWS = 256  # ... and rows (atlas), and the result is stored with the run


def mode(dtype: str, head: str = "float32") -> str:
    """The one name of a run's precision, for ``run.json``, the sidebar and the pages: ``exact`` (float32
    encoder; the head in float32 or in certified bf16, whose tables are float32's) or ``approximate`` (the
    encoder and head in bfloat16 or float16, checked against float32 on a sample)."""
    if dtype in ("bfloat16", "float16"):
        return f"approximate: encoder and head in {dtype} (agreement with float32 measured on a sample)"
    if head != "float32":
        return "exact: float32 encoder, MLM head in bf16 certified against float32 (tables identical)"
    return "exact: float32"


def dtype_of(model) -> str:
    """The name of the dtype a loaded torch model's weights are in (``float32``, ``bfloat16``, ``float16``)."""
    return str(model.dtype).removeprefix("torch.")


def model_mode(model) -> str:
    """:func:`mode` of a loaded torch model."""
    return mode(dtype_of(model))


def reference_spec(spec):
    """``spec`` in float32: the reference an approximate run is checked against."""
    return dataclasses.replace(spec, dtype="float32")


def describe(head: str, certified, dtype: str = "float32") -> dict:
    """What ``run.json`` and the pages say about the precision of a run (``certified``: the
    :class:`analysis.probe.certified.Certified` counts of a certified head, or None)."""
    out = {"mode": mode(dtype, head), "head_product": head, "encoder": dtype}
    if certified is not None:
        out.update(certified.to_dict())
        out["recomputed_share"] = certified.recomputed / certified.rows if certified.rows else math.nan
    return out


def precision_line(info: dict) -> str:
    """One sentence for a page: the mode a result ran in and, for the approximate mode, its measured agreement."""
    line = f"Precision: {info.get('mode', 'exact: float32')}."
    if info.get("recomputed") is not None:
        line += (f" {info['recomputed']:,} of {info['rows']:,} rows recomputed in float32; probabilities within "
                 f"{info['max_log_prob_bound']:.1e} in log of float32's.")
        shares = [x for x in info.get("certified_share_per_state") or [] if x is not None]
        if shares:
            line += f" Rows certified per layer: {min(shares):.1%} to {max(shares):.1%}."
    agreement = info.get("agreement")
    if agreement and "min_cka" in agreement:
        line += (f" Checked against float32 on the first {agreement['rows']} rows: every layer's linear CKA with "
                 f"the float32 vectors is at least {agreement['min_cka']:.4f}.")
    elif agreement:
        line += (f" Checked against float32 on the first {agreement['texts']} texts: "
                 f"{agreement['predictions_identical']:.2%} of predictions identical, layer accuracy within "
                 f"{agreement['max_accuracy_difference']:.4f}, target probability within "
                 f"{agreement['max_prob_difference']:.2e}.")
    return line
