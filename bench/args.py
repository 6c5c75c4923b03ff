"""Options every bench tool shares: the device to time on, checked while parsing, so a bad one is
a usage error naming `--device` rather than a traceback after set-up."""

from __future__ import annotations

import argparse

import torch


def torch_device(text: str) -> str:
    try:
        dev = torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine's torch sees no CUDA device")
    if dev.type not in ("cuda", "cpu"):
        raise argparse.ArgumentTypeError(f"{text!r}: the benchmarks run on cuda or cpu")
    return text


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        type=torch_device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device to time on (default: cuda where present, else cpu)",
    )
