"""The host side of the TMA launches (euler_kernels.cuda.tensor_map) that needs no GPU: how parameters are
laid out for cuLaunchKernel and what a map refuses. The maps and launches themselves run in the sm90 GPU
tests (test_flash_attention_bf16_gpu.py)."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from euler_kernels.attention import tensor_map
from euler_kernels.cuda._module import token_stride


@pytest.mark.parametrize("value", [np.int32(-7), np.int32(2**31 - 1), np.float32(0.125), np.float32(-3.5e-3)])
def test_scalar_parameters_point_at_their_value_bytes(value):
    address, held = tensor_map._parameter(value)
    assert ctypes.string_at(address, 4) == value.tobytes()
    assert held is not None  # the bytes stay alive as long as the launch holds this


def test_array_parameters_point_at_the_device_pointer():
    fake = SimpleNamespace(data=SimpleNamespace(ptr=0x7F00_1234_5600))
    address, _ = tensor_map._parameter(fake)
    assert ctypes.c_uint64.from_address(address).value == 0x7F00_1234_5600


def test_a_tensor_map_sits_at_a_64_byte_aligned_address_and_is_passed_as_itself():
    maps = [tensor_map.TensorMap() for _ in range(8)]
    assert all(m.address % 64 == 0 for m in maps)
    assert tensor_map._parameter(maps[0])[0] == maps[0].address


def test_a_map_of_a_misaligned_array_is_refused_before_the_driver_is_asked():
    fake = SimpleNamespace(data=SimpleNamespace(ptr=0x1008), shape=(1, 4, 2, 64), dtype=np.dtype(np.uint16))
    with pytest.raises(ValueError, match="16-byte aligned"):
        tensor_map.head_rows_map(fake, 64)


def _like_device(view: np.ndarray, ptr: int = 0x10000) -> SimpleNamespace:
    """A stand-in for a CuPy array with a NumPy view's layout at a device address."""
    data = SimpleNamespace(ptr=ptr)
    layout = {"ndim": view.ndim, "shape": view.shape, "strides": view.strides, "itemsize": view.itemsize}
    return SimpleNamespace(data=data, **layout)


def test_heads_of_a_wider_row_are_mapped_where_they_lie():
    rows = np.zeros((2 * 5, (4 + 2 * 2) * 64), np.uint16)  # (B T, (Hq + 2 Hkv) D): the joint q/k/v rows
    heads = rows.reshape(2, 5, 8, 64)
    q, k, v = heads[:, :, :4], heads[:, :, 4:6], heads[:, :, 6:]
    assert all(tensor_map.mappable(_like_device(a)) for a in (q, k, v, np.zeros((2, 5, 4, 64), np.uint16)))
    assert token_stride(v) == 8 * 64


def test_layouts_a_map_cannot_read_are_refused():
    odd_rows = np.zeros((10, 3 * 64 + 4), np.uint16)[:, :128].reshape(2, 5, 2, 64)  # tokens 392 bytes apart
    strided_heads = np.zeros((2, 5, 4, 64), np.uint16)[:, :, ::2]  # heads not packed
    assert not tensor_map.mappable(_like_device(odd_rows))
    assert not tensor_map.mappable(_like_device(strided_heads))
    with pytest.raises(ValueError, match="packed heads"):
        tensor_map.head_rows_map(_like_device(strided_heads), 64)


def test_token_stride_reads_the_layouts_the_strided_kernels_take():
    rows = np.zeros((3 * 4, 10 * 8), np.float32).reshape(3, 4, 10, 8)  # (B, T, heads of the joint row, D)
    assert token_stride(rows) == 80  # C order: H * D
    assert token_stride(rows[:, :, 2:5]) == 80  # heads of a wider row
    assert token_stride(rows[:, :1, 2:5]) == 320  # one token a row of the batch: B's stride
    assert token_stride(rows[:1, :1, 2:5]) == 24  # a single token
    assert token_stride(rows[:, ::2, 2:5]) == 160  # every other token: still one run
    assert token_stride(rows[:, :, ::2]) is None  # heads not packed
    assert token_stride(rows[:, :, :, ::2]) is None  # values not packed
    assert token_stride(rows[:, ::-1]) is None  # tokens running backwards
    assert token_stride(rows[:2, :2].transpose(1, 0, 2, 3)) is None  # B and T do not merge
    assert token_stride(rows[0]) is None  # not (B, T, H, D)
