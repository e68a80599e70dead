"""The host side of the TMA launches (euler_kernels.cuda.tensor_map) that needs no GPU: how parameters are
laid out for cuLaunchKernel and what a map refuses. The maps and launches themselves run in the sm90 GPU
tests (test_flash_attention_bf16_gpu.py)."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from euler_kernels.cuda import tensor_map


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
