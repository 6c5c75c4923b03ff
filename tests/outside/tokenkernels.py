"""Small pure-torch selection kernels that take the matrix's token ranges, written for the
tests as an outside author would: correct, subtly wrong, and one that kills its process
on one case and hangs on another. They validate their inputs with selgate's public
`check_inputs`, as a careful author's kernel would, so bad input gets a clear error."""

from __future__ import annotations

import os
import time

import torch

from selgate.reference import check_inputs


def gather(q, k, v, ranges, *, scale=None):
    """q [B, S, G, h, Dk], k/v [B, G, S_kv, D], ranges [B, S, G, n, 2]; computed in fp64."""
    check_inputs(q, k, v, ranges, scale=scale)
    B, S, G, h, Dk = q.shape
    S_kv = k.shape[2]
    scale = Dk**-0.5 if scale is None else scale
    t = torch.arange(S, device=q.device) + S_kv - S
    key = torch.arange(S_kv, device=q.device)
    r = ranges.long()[..., None]  # [B, S, G, n, 2, 1]
    mask = ((key >= r[..., 0, :]) & (key < r[..., 1, :])).any(3)  # [B, S, G, S_kv]
    mask &= (key <= t[:, None])[None, :, None]
    m = mask[..., None]
    k_rows = torch.where(m, k[:, None].double(), 0)  # [B, S, G, S_kv, Dk]; unselected keys unread
    v_rows = torch.where(m, v[:, None].double(), 0)
    s = torch.einsum("bsghd,bsgkd->bsghk", q.double(), k_rows) * scale
    sel = mask[:, :, :, None]
    s = torch.where(sel, s, 0.0)
    top = torch.where(sel, s, float("-inf")).amax(-1, keepdim=True).clamp(min=-1e300)
    p = torch.where(sel, torch.exp(s - top), 0.0)
    total = p.sum(-1, keepdim=True)
    return (torch.einsum("bsghk,bsgkd->bsghd", p, v_rows) / torch.where(total > 0, total, 1.0)).to(v.dtype)


def off_by_a_little(q, k, v, ranges, *, scale=None):
    """Wrong by 1e-4 relative: within any eyeball's tolerance, not within SPEC.md's fp32 bar."""
    return gather(q, k, v, ranges, scale=scale) * (1 + 1e-4)


def _first_time(name: str) -> bool:
    """True once per working directory (a marker file), so one case, not every case of a
    shape, meets the fault; under `selgate check`, once per root of executors (the folder above
    their scratch folders, which is what they may write): once in the executors that run the
    cases, once in the determinism family's second processes, which have a root of their own."""
    tmp = os.environ.get("TMPDIR", "")
    folder = os.path.dirname(tmp) if os.path.basename(tmp).startswith("executor-") else "."
    try:
        with open(os.path.join(folder, f".{name}-happened"), "x"):
            return True
    except FileExistsError:
        return False


def dies_on_one_case(q, k, v, ranges, *, scale=None):
    """Aborts the process on the first call with 29 keys and hangs on the first with 45;
    correct everywhere else."""
    if k.shape[2] == 29 and _first_time("abort"):
        os.abort()
    if k.shape[2] == 45 and _first_time("hang"):
        time.sleep(3600)
    return gather(q, k, v, ranges, scale=scale)


for _fn in (gather, off_by_a_little, dies_on_one_case):
    _fn.dtypes = ("fp32",)
    _fn.backward = True
