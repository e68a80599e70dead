"""Launchers of the Hopper bf16 FlashAttention kernels (flash_attention_sm90.cu: wgmma, compiled for sm_90a),
and the rule that picks them.

The rule: bf16 attention runs the Hopper kernels on a GPU of compute capability 9.x (H100, H200) and the
mma.sync kernels of flash_attention_bf16.cu on every other GPU. A Precision's attention_kernel "mma" makes
a Hopper GPU run the mma.sync kernels too (to compare them); "sm90" asks for the Hopper ones and fails on
other GPUs. Both families take the same arrays and give the same results to bf16 rounding; the
forward's lse is the same quantity, so either backward can follow either forward.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from euler_kernels.attention.tensor_map import head_rows_map, launch, loaded_function
from euler_kernels.cuda._module import get_kernel_sm90a, sm_count

_SOURCE = "flash_attention_sm90.cu"
_BN, _KV_STAGES, _Q_STAGES = 128, 2, 2  # forward: keys per tile, buffers of K/V and of Q


def forward_layout(head_dim: int, T: int, group: int) -> dict[str, int]:
    """The forward's work items for a shape (-D defines of the .cu): FWD_CONSUMERS, the consumer warpgroups
    of 64 query rows each, and FWD_GQA_PACK, whether an item is 64 positions of that many query heads of
    one kv head (`group` = Hq / Hkv query heads a kv head) instead of 64 x consumers positions of one head.

    At head_dim 64 a warpgroup's softmax takes as long as its products, so three consumers let each softmax
    run under two others' products. Where the group is a multiple of 3, items of three heads are never
    padding and cost no more diagonal tiles than two consumers' 128-row items, so they beat the two-consumer
    forward at every T measured (docs/benchmarks/attention_gpu.md). Otherwise three consumers take 192-row
    items, which pay only where they pad T by at most 4% more than 128-row ones do, and only from T 768 on
    (below it they lose to two consumers). Head_dim 128 has no registers for three.

    >>> forward_layout(64, 512, 3)
    {'FWD_CONSUMERS': 3, 'FWD_GQA_PACK': 1}
    >>> forward_layout(64, 512, 1), forward_layout(64, 2048, 1)
    ({'FWD_CONSUMERS': 2, 'FWD_GQA_PACK': 0}, {'FWD_CONSUMERS': 3, 'FWD_GQA_PACK': 0})
    >>> forward_layout(128, 8192, 4)
    {'FWD_CONSUMERS': 2, 'FWD_GQA_PACK': 0}
    """
    if head_dim == 64 and group % 3 == 0:
        return {"FWD_CONSUMERS": 3, "FWD_GQA_PACK": 1}
    padded = (-(-T // 192) * 192, -(-T // 128) * 128)  # rows computed with 192- and 128-row items
    three = head_dim == 64 and T >= 768 and padded[0] <= 1.04 * padded[1]
    return {"FWD_CONSUMERS": 3 if three else 2, "FWD_GQA_PACK": 0}


def kernel_sizes(q: Any, k: Any, causal: bool) -> tuple:
    """The scalar arguments every FlashAttention kernel takes after its arrays (these and those of
    flash_attention.py): T, S, Hq, Hkv, scale = D^-0.5, causal."""
    _, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    return (np.int32(T), np.int32(S), np.int32(Hq), np.int32(Hkv), np.float32(D**-0.5), np.int32(causal))


@functools.cache
def _is_hopper(device: int) -> bool:
    import cupy

    return cupy.cuda.Device(device).compute_capability.startswith("9")


def use_sm90(attention_kernel: str) -> bool:
    """Whether bf16 attention on the current GPU runs the Hopper kernels, for a Precision's attention_kernel
    (auto, sm90, mma: the rule in this module's doc)."""
    import cupy

    hopper = _is_hopper(cupy.cuda.runtime.getDevice())
    if attention_kernel == "sm90" and not hopper:
        raise ValueError("attention_kernel sm90 needs a GPU of compute capability 9.x (Hopper)")
    return hopper and attention_kernel != "mma"


def _forward_smem(head_dim: int, q_stages: int, kv_stages: int, consumers: int = 2) -> int:
    """q_stages x Q (BM = 64 consumers, D) + kv_stages x (K, V) (BN, D) + an O staging tile (64, D) a
    consumer, bf16, the barriers (2 per buffer, 8 bytes each), + 1024 to align."""
    tiles = 2 * head_dim * (q_stages * 64 * consumers + 2 * kv_stages * _BN + consumers * 64)
    return tiles + 2 * (q_stages + 2 * kv_stages) * 8 + 1024


def forward(q16: Any, k16: Any, v16: Any, causal: bool, out16: Any, lse: Any, **tuning: int) -> None:
    """out16 (B, T, Hq, D) bf16 and lse (B, Hq, T) of contiguous, checked q16 (B, T, Hq, D), k16/v16
    (B, S, Hkv, D) bf16, written in place: one persistent block per SM (at most one per work item).
    `tuning`: extra -D defines (timing experiments: Q_STAGES, KV_STAGES, FWD_PINGPONG, FWD_CONSUMERS,
    FWD_GQA_PACK)."""
    B, T, Hq, D = q16.shape
    group = Hq // k16.shape[2]  # query heads a kv head
    defines = {
        "HEAD_DIM": D,
        "Q_STAGES": _Q_STAGES,
        "KV_STAGES": _KV_STAGES,
        **forward_layout(D, T, group),
        **tuning,
    }
    consumers = defines["FWD_CONSUMERS"]
    heads = consumers if defines["FWD_GQA_PACK"] else 1  # query heads per work item
    if group % heads or (heads > 1 and D != 64):
        raise ValueError(f"FWD_GQA_PACK needs head_dim 64 and a multiple of {heads} query heads a kv head")
    rows = 64 * consumers // heads  # query positions per work item
    smem = _forward_smem(D, defines["Q_STAGES"], defines["KV_STAGES"], consumers)
    function = loaded_function(get_kernel_sm90a(_SOURCE, "flash_attention_forward_sm90", **defines), smem)
    work = (T + rows - 1) // rows * (Hq // heads) * B
    grid = (min(work, sm_count()), 1, 1)
    maps = (head_rows_map(q16, rows), head_rows_map(k16, _BN), head_rows_map(v16, _BN))
    args = (head_rows_map(out16, 64), lse, *maps, *kernel_sizes(q16, k16, causal), np.int32(B))
    launch(function, grid, (128 * (1 + consumers), 1, 1), args, smem)  # a producer warpgroup + the consumers


_BK, _BQ, _BWD_STAGES = 128, 64, 2  # backward: keys per block, queries per tile, Q/dO buffers (as in the .cu)


def _backward_smem(head_dim: int) -> int:
    """K, V (BK, D) + BWD_STAGES x (Q, dO) (BQ, D) + 2 x dS^T (BK, BQ) bf16, 2 x dQ (BQ, D) float32 staging,
    BWD_STAGES x (lse, delta) (BQ,) float32, 1 + 2 BWD_STAGES + 4 barriers, + 1024 to align."""
    bf16_tiles = 2 * _BK * head_dim + 2 * _BWD_STAGES * _BQ * head_dim + 2 * _BK * _BQ
    barriers = 8 * (1 + 2 * _BWD_STAGES + 4)
    return 2 * bf16_tiles + 4 * 2 * _BQ * head_dim + 4 * 2 * _BWD_STAGES * _BQ + barriers + 1024


def backward(dout16, q16, k16, v16, lse, delta, causal: bool, dq, dk, dv, **tuning: int) -> None:
    """float32 dq (zeroed: the kernel adds into it), dk, dv of contiguous, checked bf16 inputs, from the
    forward's lse and delta = rowsum(dout * out), written in place. `tuning`: extra -D defines (timing
    experiments: BWD_HEAVY_FIRST, BWD_DQ_FIRST, BWD_OVERLAP, DQ_ONE_WG, BWD_RS_KV, BWD_ABLATE)."""
    B, _, _, D = q16.shape
    S, Hkv = k16.shape[1], k16.shape[2]
    smem = _backward_smem(D)
    kernel = get_kernel_sm90a(_SOURCE, "flash_attention_backward_sm90", HEAD_DIM=D, **tuning)
    function = loaded_function(kernel, smem)
    grid = ((S + _BK - 1) // _BK * Hkv * B, 1, 1)  # one block per (key block, kv head, batch), heaviest first
    maps = (head_rows_map(dq, _BQ), head_rows_map(q16, _BQ), head_rows_map(k16, _BK), head_rows_map(v16, _BK))
    args = (dk, dv, *maps, head_rows_map(dout16, _BQ), lse, delta, *kernel_sizes(q16, k16, causal))
    launch(function, grid, (384, 1, 1), args, smem)  # a copying warpgroup + 2 consumers
