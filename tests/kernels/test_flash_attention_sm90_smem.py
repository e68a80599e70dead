"""The Hopper FlashAttention kernels' shared memory fits one block of an H100/H200 (227 KB opt-in) at both
head dimensions, with the defaults and with each variant benchmarks/tune_attention_sm90.py times. The
sizes are the launchers' own arithmetic, so this runs without a GPU; the backward at head_dim 128 is within
a kilobyte of the limit, and a layout change that outgrows it would otherwise fail only on the device."""

import pytest

from euler_kernels.attention import flash_attention_sm90

HOPPER_SMEM_PER_BLOCK = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90


@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward_fits(head_dim):
    assert flash_attention_sm90._backward_smem(head_dim) <= HOPPER_SMEM_PER_BLOCK


@pytest.mark.parametrize(
    ("head_dim", "q_stages", "kv_stages", "consumers"),
    # defaults and the tune script's variants
    [
        (64, 2, 2, 2),
        (64, 1, 2, 2),
        (64, 2, 3, 2),
        (64, 2, 2, 3),
        (64, 1, 2, 3),
        (64, 2, 3, 3),  # KV_STAGES 3 on the default packed layout
        (128, 2, 2, 2),
        (128, 1, 2, 2),
    ],
)
def test_forward_fits(head_dim, q_stages, kv_stages, consumers):
    smem = flash_attention_sm90._forward_smem(head_dim, q_stages, kv_stages, consumers)
    assert smem <= HOPPER_SMEM_PER_BLOCK


def test_three_kv_buffers_do_not_fit_at_head_dim_128():
    # why the tune script times KV_STAGES 3 at head_dim 64 only
    assert flash_attention_sm90._forward_smem(128, 2, 3) > HOPPER_SMEM_PER_BLOCK


@pytest.mark.parametrize(
    ("head_dim", "T", "group", "consumers", "pack"),
    [
        (64, 1, 3, 3, 1),  # three heads of a kv head an item: never padding, any T
        (64, 512, 12, 3, 1),
        (64, 512, 1, 2, 0),  # one head an item: 192 rows pad T 512 to 576
        (64, 768, 1, 3, 0),
        (64, 1024, 2, 2, 0),
        (64, 2048, 4, 3, 0),
        (64, 8192, 1, 3, 0),
        (128, 8192, 3, 2, 0),  # no registers for three consumers at head_dim 128
    ],
)
def test_forward_layout_follows_the_measured_rule(head_dim, T, group, consumers, pack):
    # the H200 sweeps in docs/benchmarks/attention_gpu.md: 192-row items were slower at T 256, 512, 1024
    layout = flash_attention_sm90.forward_layout(head_dim, T, group)
    assert layout == {"FWD_CONSUMERS": consumers, "FWD_GQA_PACK": pack}
