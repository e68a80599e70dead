"""Host-to-GPU transfer through pinned (page-locked) memory, when a loader is asked for ``device="cuda"``.

CuPy is optional: it is imported only here, only when asked.
"""

from __future__ import annotations

import numpy as np


def to_device(array: np.ndarray, device: str | None):
    """``array`` as is (device None / "cpu"), or as a CuPy array copied from a pinned host buffer.

    >>> to_device(np.zeros(3), None).shape
    (3,)
    """
    if device in (None, "cpu"):
        return array
    if device != "cuda":
        raise ValueError(f"to_device: device must be None, 'cpu' or 'cuda', got {device!r}")
    import cupy

    pinned_mem = cupy.cuda.alloc_pinned_memory(array.nbytes)
    pinned = np.frombuffer(pinned_mem, dtype=array.dtype, count=array.size).reshape(array.shape)
    pinned[...] = array  # host copy into page-locked memory
    out = cupy.empty(array.shape, dtype=array.dtype)
    stream = cupy.cuda.get_current_stream()
    out.set(pinned, stream=stream)  # DMA straight from the page-locked buffer
    stream.synchronize()  # the pinned buffer goes back to CuPy's pool on return
    return out
