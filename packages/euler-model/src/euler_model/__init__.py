"""A Llama-style decoder with multi-token prediction, generation, checkpoints and Hugging Face interop.

>>> import numpy as np
>>> from euler_model import preset, init_params, loss_and_grads
>>> cfg = preset("tiny"); params = init_params(cfg, seed=0)
>>> tokens = np.zeros((2, 8), dtype=np.int64)
>>> targets = np.zeros((2, 8 + cfg.n_mtp_heads - 1), dtype=np.int64)
>>> loss, grads = loss_and_grads(cfg, params, tokens, targets)
"""

from euler_model.__about__ import __version__
from euler_model.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from euler_model.config import PRESETS, ModelConfig, preset
from euler_model.decode_batch import release_kept_decoders
from euler_model.decode_step import checked_draft_tree, default_draft_tree
from euler_model.generate import Completion, GenerationStats, generate, generate_batch
from euler_model.hf import load_hf, save_hf
from euler_model.memory import step_memory
from euler_model.model import (
    bf16_path,
    bf16_weight_groups,
    forward_loss,
    logits,
    loss_and_grads,
    loss_and_grads_on_device,
)
from euler_model.params import (
    count_params,
    describe_params,
    gradcheck_params,
    init_params,
    param_shapes,
    product_params,
)
from euler_model.preference import PairBatch, dpo_loss, dpo_loss_and_grads, reward_margins, sequence_logprobs

__all__ = [
    "FORMAT_VERSION",
    "PRESETS",
    "Completion",
    "GenerationStats",
    "ModelConfig",
    "PairBatch",
    "__version__",
    "bf16_path",
    "bf16_weight_groups",
    "checked_draft_tree",
    "count_params",
    "default_draft_tree",
    "describe_params",
    "dpo_loss",
    "dpo_loss_and_grads",
    "forward_loss",
    "generate",
    "generate_batch",
    "gradcheck_params",
    "init_params",
    "load_checkpoint",
    "load_hf",
    "logits",
    "loss_and_grads",
    "loss_and_grads_on_device",
    "param_shapes",
    "preset",
    "product_params",
    "release_kept_decoders",
    "reward_margins",
    "save_checkpoint",
    "save_hf",
    "sequence_logprobs",
    "step_memory",
]
