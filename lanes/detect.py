"""Which lane this machine runs: the GPU class from torch's compute capability, matched
against the `capabilities` each lane YAML declares; no CUDA device means the CPU lane."""

from __future__ import annotations

from dataclasses import dataclass

from .config import LANE_DIR, lane_names, load_lane


@dataclass(frozen=True)
class Detected:
    lane: str
    capability: str | None  # "9.0", or None without a CUDA device
    gpu: str  # device name, "none" on CPU


def lane_for(capability: str | None, lane_dir=LANE_DIR) -> str:
    """The lane that declares `capability` (None: the CPU lane); ValueError when none does."""
    lanes = [load_lane(n, lane_dir) for n in lane_names(lane_dir)]
    if capability is None:
        matches = [lane["name"] for lane in lanes if lane["device"] == "cpu"]
    else:
        matches = [lane["name"] for lane in lanes if capability in map(str, lane["capabilities"])]
    if len(matches) != 1:
        declared = {lane["name"]: lane["capabilities"] for lane in lanes}
        what = "no CUDA device" if capability is None else f"compute capability {capability}"
        raise ValueError(
            f"detect: {what} matches lanes {matches}, expected exactly one; lanes declare "
            f"{declared} (add or fix a lanes/<name>.yaml)"
        )
    return matches[0]


def detect_lane() -> Detected:
    import torch  # here, not above: a lane run that names its lane never needs torch

    from selgate.device import capability_text, device_capability

    capability = capability_text(device_capability())
    gpu = "none" if capability is None else torch.cuda.get_device_name()
    return Detected(lane_for(capability), capability, gpu)
