"""Copies between the host and the device, made so the host does not wait on the device (issue 44, item 1-2).

- :func:`to_device`: a host tensor onto the device, through pinned memory and ``non_blocking`` to a CUDA device,
  so the copy overlaps the device's work;
- :func:`to_host`: a batch's results back, every tensor copied without blocking into pinned memory and then one
  wait for the device: one host sync per call, whatever the number of tensors. On the CPU it hands back views.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(tensor: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``: through pinned memory and ``non_blocking`` to a CUDA device."""
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_host(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """``tensors`` as numpy arrays on the host, with one wait for the device for all of them."""
    devices = {t.device for t in tensors if t.device.type != "cpu"}
    if not devices:
        return [t.numpy() for t in tensors]
    outs = []
    for t in tensors:
        if t.device.type == "cpu":
            outs.append(t)
            continue
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
        out.copy_(t, non_blocking=True)
        outs.append(out)
    for device in devices:
        torch.accelerator.synchronize(device) if hasattr(torch, "accelerator") else torch.cuda.synchronize(device)
    return [o.numpy() for o in outs]
