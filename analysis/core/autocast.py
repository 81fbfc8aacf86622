"""What training runs its products in: bfloat16 autocast with float32 master weights, or float32 (issue 26).

The decision is :func:`analysis.core.precision.bf16_pays` (a GPU with bfloat16, or a CPU whose bf16 units a timed
product shows at least 1.5x faster than float32; ``LAYERLENS_BF16_UNITS=0/1`` forces it), made in one place for
fine-tuning (:mod:`analysis.training.train`), further pre-training
(:func:`analysis.training.finetune.further_pretrain`) and tuned-lens training (:mod:`analysis.probe.lens`). The recipe
is mixed-precision training (Micikevicius et al. 2018, "Mixed Precision Training", ICLR): products in 16 bits, float32
master weights that the optimizer updates, and reductions such as the loss's softmax in float32. With bfloat16's 8
exponent bits no loss scaling is needed (Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training"), which
is what the HF Trainer's ``bf16=True`` does on a CPU too (``torch.autocast("cpu", dtype=torch.bfloat16)``).

A frozen model (the tuned lens's encoder and MLM head) pays autocast's weight casts on every call: PyTorch
caches a cast only for leaf tensors that require gradients. :func:`bf16_shadow` gives it bfloat16 copies of its
``nn.Linear`` weights once (the values autocast would cast them to, so the results are the same bit for bit),
in a module tree that shares every other tensor with the shared model and leaves that model untouched.
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager

import torch
from torch import nn

BF16, F32 = "bfloat16", "float32"


CPU_MIN_HIDDEN = 512  # measured (docs/benchmarks.md, issue 26): hidden 768 gains, the demo's 256 loses 2x


def training_autocast(device, hidden_size: int | None = None) -> str:
    """``"bfloat16"`` when training on ``device`` should run in bfloat16 autocast (float32 master weights), else
    ``"float32"``: :func:`analysis.core.precision.bf16_pays`, and on a CPU a model of hidden size at least
    ``CPU_MIN_HIDDEN`` (on this project's AVX512-BF16 CPU bf16 autocast made bert-base-sized training 1.5-2.2x
    faster but the demo model's (hidden 256) tuned lens 2.1x slower and the tests' tiny models ~10x slower:
    small products gain little and pay the casts). ``LAYERLENS_BF16_UNITS=1`` forces bfloat16 at any size.
    Run metadata records this value (``autocast``)."""
    import os

    from analysis.core.precision import FORCE_ENV, bf16_pays

    device = str(device)
    if not bf16_pays(device):
        return F32
    small = (hidden_size is not None and hidden_size < CPU_MIN_HIDDEN and device == "cpu"
             and os.environ.get(FORCE_ENV) != "1")
    return F32 if small else BF16


def autocast(device, mode: str) -> AbstractContextManager:
    """``torch.autocast`` to bfloat16 on ``device``'s type when ``mode`` is ``"bfloat16"``; not entered (a disabled
    context) for ``"float32"``."""
    if mode not in (BF16, F32):
        raise ValueError(f"autocast mode must be {BF16} or {F32}, not {mode!r}")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=mode == BF16)


def bf16_shadow(module: nn.Module) -> nn.Module:
    """A copy of frozen ``module`` whose ``nn.Linear`` weights are bfloat16 (made once here) and whose every other
    parameter and buffer *is* the original's tensor (no copy). Under bfloat16 autocast it computes exactly what
    ``module`` computes there, without casting the weights on every call. ``module`` itself is not changed (it
    may be the shared cached model). A weight tied to an embedding (BERT's decoder) gets its own bfloat16 copy in
    the decoder only: the embedding lookup stays float32, as under autocast."""
    shared = {id(t): t for t in (*module.parameters(), *module.buffers())}
    shadow = copy.deepcopy(module, memo=dict(shared))
    copies: dict[int, nn.Parameter] = {}
    for layer in shadow.modules():
        if isinstance(layer, nn.Linear) and layer.weight.dtype == torch.float32:
            w = layer.weight
            if id(w) not in copies:
                copies[id(w)] = nn.Parameter(w.detach().to(torch.bfloat16), requires_grad=False)
            layer.weight = copies[id(w)]
    return shadow.eval()
