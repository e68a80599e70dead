"""euler-kernels: forward/backward op pairs on NumPy (CPU) or CuPy (GPU) arrays, proven by float64
finite differences.

Every op is a pair `<op>_forward(...) -> (out, cache)` / `<op>_backward(dout, cache) -> grads`; see the
package README for the contract of each. `euler_kernels.testing` (hypothesis strategies) is imported
separately so that this package does not need hypothesis at run time.

Exported here is what euler-model, euler-train and the README's users call. The rest of an op module
(e.g. the single-tensor `euler_kernels.optim.adamw.adamw_update`, `euler_kernels.residual.residual`) is
imported from its module; each op's module, launcher and kernels are in its folder (rmsnorm/, matmul/, ...).
"""

from euler_kernels.__about__ import __version__
from euler_kernels.attention.attention import attention_backward, attention_forward
from euler_kernels.attention.decode_attention import decode_attention_forward, decode_attention_kernel
from euler_kernels.attention.flash_attention import flash_attention_supports
from euler_kernels.attention.qkv import qkv_backward, qkv_forward
from euler_kernels.backend import get_array_module, is_bf16, require_cuda, synchronize, to_device, to_numpy
from euler_kernels.cross_entropy.cross_entropy import (
    cross_entropy_backward,
    cross_entropy_forward,
    cross_entropy_weights,
)
from euler_kernels.cuda import float32_on_gpu
from euler_kernels.cuda.cast import stacked_rows, to_bf16_many
from euler_kernels.cuda.tables import keep_tables
from euler_kernels.decode.decode_accept import decode_accept
from euler_kernels.decode.decode_draft import decode_draft
from euler_kernels.decode.decode_record import decode_record
from euler_kernels.embedding.embedding import embedding_backward, embedding_forward
from euler_kernels.gradcheck import gradcheck, gradcheck_scalar, judged
from euler_kernels.matmul.decode_linear import decode_linear_forward
from euler_kernels.matmul.fp8_scales import Fp8Scales
from euler_kernels.matmul.fp8_scales import new_scales as new_fp8_scales
from euler_kernels.matmul.fp8_scales import restore_scales as restore_fp8_scales
from euler_kernels.matmul.fp8_scales import scale_arrays as fp8_scale_arrays
from euler_kernels.matmul.fp8_scales import scales_from_arrays as fp8_scales_from_arrays
from euler_kernels.matmul.fp8_scales import update_scales as update_fp8_scales
from euler_kernels.matmul.linear import (
    linear_backward,
    linear_forward,
    linear_forward_many,
    linear_weight_grad,
)
from euler_kernels.matmul.linear_fp8 import fp8_amax, fp8_fits, fp8_weights, is_fp8
from euler_kernels.op_checks import gradcheck_ops
from euler_kernels.optim.adamw import adamw_hyper, adamw_update_ctl, adamw_update_many
from euler_kernels.optim.grad_accumulate import accumulate_scaled_many
from euler_kernels.optim.grad_norm import sum_squares_many
from euler_kernels.optim.muon import muon_scratch, muon_update
from euler_kernels.optim.step_control import step_control
from euler_kernels.precision import EXACT, Precision
from euler_kernels.rmsnorm.residual_rmsnorm import (
    residual_rmsnorm_backward,
    residual_rmsnorm_backward_bf16_copy,
    residual_rmsnorm_forward,
)
from euler_kernels.rmsnorm.rmsnorm import rmsnorm_backward, rmsnorm_forward
from euler_kernels.rope.rope import rope_backward, rope_forward, rope_tables
from euler_kernels.swiglu.swiglu import (
    swiglu_backward,
    swiglu_backward_fp8,
    swiglu_forward,
    swiglu_forward_fp8,
)

__all__ = [
    "EXACT",
    "Fp8Scales",
    "Precision",
    "__version__",
    "accumulate_scaled_many",
    "adamw_hyper",
    "adamw_update_ctl",
    "adamw_update_many",
    "attention_backward",
    "attention_forward",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "cross_entropy_weights",
    "decode_accept",
    "decode_attention_forward",
    "decode_attention_kernel",
    "decode_draft",
    "decode_linear_forward",
    "decode_record",
    "embedding_backward",
    "embedding_forward",
    "flash_attention_supports",
    "float32_on_gpu",
    "fp8_amax",
    "fp8_fits",
    "fp8_scale_arrays",
    "fp8_scales_from_arrays",
    "fp8_weights",
    "get_array_module",
    "gradcheck",
    "gradcheck_ops",
    "gradcheck_scalar",
    "is_bf16",
    "is_fp8",
    "judged",
    "keep_tables",
    "linear_backward",
    "linear_forward",
    "linear_forward_many",
    "linear_weight_grad",
    "muon_scratch",
    "muon_update",
    "new_fp8_scales",
    "qkv_backward",
    "qkv_forward",
    "require_cuda",
    "residual_rmsnorm_backward",
    "residual_rmsnorm_backward_bf16_copy",
    "residual_rmsnorm_forward",
    "restore_fp8_scales",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "rope_backward",
    "rope_forward",
    "rope_tables",
    "stacked_rows",
    "step_control",
    "sum_squares_many",
    "swiglu_backward",
    "swiglu_backward_fp8",
    "swiglu_forward",
    "swiglu_forward_fp8",
    "synchronize",
    "to_bf16_many",
    "to_device",
    "to_numpy",
    "update_fp8_scales",
]
