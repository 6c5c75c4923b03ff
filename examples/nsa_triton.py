"""native-sparse-attention-triton's selected-branch kernel (`topk_sparse_attention` of
XunhaoLai/native-sparse-attention-triton, native_sparse_attention/ops/triton/, commit 5702c3d)
checked by selgate: its varlen block-index form wrapped by selgate's varlen adapter. Install the
upstream package beside this file (its op imports torch and triton only; the package's
`ops/__init__.py` imports flash_attn for other ops), then:

    selgate check nsa_triton:selection --declare nsa_triton.yaml

Its verdict on an H100: evidence/native-sparse-attention-triton/report.md.

Upstream's signature is `topk_sparse_attention(q, k, v, topk_idx, block_size, cu_seqlens,
softmax_scale=None)`: q [total, HQ, D], k/v [total, H, D], topk_idx [H, total, S] int32 with
-1 as padding, cu_seqlens int32 shared by queries and keys (it asserts q_len == k_len). That is
exactly the positional order `varlen_block_kernel` calls `fn(q, k, v, topk_idx, block_size,
cu_seqlens, scale)` in (topk int32, -1 padded, cu_seqlens int32, scale a float), so the op is
passed as it is, no lambda. Only the op's own module and `ops/triton/utils.py` are imported:
the package __init__ files here are empty, since upstream's `ops/__init__.py` imports
compressed_attention and the torch ops, which need flash_attn."""

from __future__ import annotations

from native_sparse_attention.ops.triton.topk_sparse_attention import topk_sparse_attention

from selgate.conformance.adapters import varlen_block_kernel

# upstream asserts block_size in {32, 64, 128, 256}; 64 is NSA's l_sel and the docs' example
BLOCK_SIZE = 64

selection = varlen_block_kernel(topk_sparse_attention, block_size=BLOCK_SIZE)
