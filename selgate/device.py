"""The GPU's compute capability, asked of torch in one place: what a kernel can run on (no
override applies here; `selgate.kernels.policy.capability` is the dispatcher's view), and the
"9.0" form in which configs, lanes and reports name it."""

from __future__ import annotations

import torch

_caps: dict = {}  # CUDA device index -> (major, minor)


def device_capability(device=None) -> tuple[int, int] | None:
    """The hardware's compute capability, `(major, minor)`, or None off CUDA: what a kernel
    can run on, so overrides do not apply (`capability` is the policy's view). The one place
    that asks torch; `device=None` is the current CUDA device, None when none is visible."""
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    elif not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return None
    key = device.index if device.index is not None else torch.cuda.current_device()
    cap = _caps.get(key)
    if cap is None:
        cap = _caps[key] = tuple(torch.cuda.get_device_capability(key))
    return cap


def capability_text(cap: tuple[int, int] | None) -> str | None:
    """`(9, 0)` as "9.0", the form configs, lanes and reports name a capability in; None stays None."""
    return None if cap is None else f"{cap[0]}.{cap[1]}"


def forget() -> None:
    """Drops the capabilities asked so far (`selgate.kernels.reload_settings`)."""
    _caps.clear()
