"""The one training step: forward, backward, gradient all-reduce, clipping and the optimizer update, from
fixed buffers to updated weights, on the CPU and the GPU alike.

The host writes the step's inputs into `StepBuffers` (the micro-batches, each micro-batch's share of the
loss, and the optimizer's hyper = [lr, bc1, bc2, enable]); `train_step` turns them into the loss, the
gradients and the control vector [grad_scale, apply, lr, bc1, bc2, norm] (euler_kernels.step_control)
that the update reads; the host then reads back the loss, the norm and whether the update was applied.
Nothing in `train_step` reads a value back to the host on the GPU, so the very same function is what
graph_step.GraphStep captures as a CUDA graph; elsewhere it runs eagerly (EagerStep).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
import euler_model
from euler_train.config import TrainConfig


@dataclass
class StepBuffers:
    """Everything a step reads or writes besides the weights and the optimizer's moments."""

    tokens: Any  # (A, B, T) int64: A micro-batches
    targets: Any  # (A, B, T + K - 1) int64
    masks: Any  # (A, B, T + K - 1) float32 loss masks (SFT), or None (every target counts)
    refs: Any  # dpo: (A, B) float64, the reference's log-probability of each row; else None
    shares: Any  # (A,) float32: micro-batch i's share of the loss (its loss tokens / all ranks' total)
    hyper: Any  # (4,) float32 [lr, bc1, bc2, enable] from the optimizer (Muon appends its lr)
    grads: dict[str, Any]  # name -> gradient, summed over micro-batches (and ranks); see train_step
    loss: Any  # () float32: the step's loss on this rank (its micro-batches' weighted sum)
    control: Any  # (6,) float32 [grad_scale, apply, lr, bc1, bc2, norm]

    @classmethod
    def allocate(
        cls, xp: Any, mcfg: Any, params: dict[str, Any], micro: list[tuple], hyper_size: int = 4
    ) -> StepBuffers:
        """Buffers shaped for these micro-batches [(tokens (B, T), targets, mask or None), ...] and an
        optimizer whose hyper has `hyper_size` entries."""
        a, (b, t) = len(micro), micro[0][0].shape
        width = micro[0][1].shape[1]  # T + K - 1 (a dpo batch: T, head 0 alone)
        masked = micro[0][2] is not None
        return cls(
            tokens=xp.zeros((a, b, t), dtype=xp.int64),
            targets=xp.zeros((a, b, width), dtype=xp.int64),
            masks=xp.zeros((a, b, width), dtype=xp.float32) if masked else None,
            refs=xp.zeros((a, b), dtype=xp.float64) if len(micro[0]) > 3 else None,
            shares=xp.zeros((a,), dtype=xp.float32),
            hyper=xp.zeros((hyper_size,), dtype=xp.float32),
            grads={n: xp.zeros_like(p) for n, p in params.items()} if a > 1 else {},
            loss=xp.zeros((), dtype=xp.float32),
            control=xp.zeros((6,), dtype=xp.float32),
        )

    def fits(self, micro: list[tuple]) -> bool:
        """Whether these micro-batches have the shapes (and masking) the buffers were made for."""
        same = len(micro) == self.tokens.shape[0] and micro[0][0].shape == self.tokens.shape[1:]
        return (
            same
            and micro[0][1].shape == self.targets.shape[1:]
            and (micro[0][2] is None) == (self.masks is None)
            and (len(micro[0]) > 3) == (self.refs is not None)
        )

    def write(self, micro: list[tuple], shares: list[float], hyper: np.ndarray, stream: Any = None) -> None:
        """Copy the step's host inputs into the buffers (on `stream` on the GPU)."""
        host = {
            "tokens": np.stack([m[0] for m in micro]).astype(np.int64),
            "targets": np.stack([m[1] for m in micro]).astype(np.int64),
            "shares": np.asarray(shares, dtype=np.float32),
            "hyper": np.asarray(hyper, dtype=np.float32),
        }
        if self.masks is not None:
            host["masks"] = np.stack([m[2] for m in micro]).astype(np.float32)
        if self.refs is not None:
            host["refs"] = np.stack([m[3] for m in micro]).astype(np.float64)
        for name, values in host.items():
            buf = getattr(self, name)
            if isinstance(buf, np.ndarray):
                buf[...] = values
            else:
                buf.set(values, stream=stream)

    def release_step_grads(self) -> None:
        """Drop the gradients the last step made: with one micro-batch they are its backward's own arrays
        (a new set each step); several micro-batches sum into buffers made once, which stay."""
        if self.tokens.shape[0] == 1:
            self.grads = {}

    def read(self) -> tuple[float, float, bool]:
        """(loss, gradient norm before clipping, whether the update was applied), read back to the host."""
        control = ek.to_numpy(self.control)
        return float(ek.to_numpy(self.loss)), float(control[5]), bool(control[1] != 0.0)


def bf16_weight_copies(
    mcfg: Any, params: dict[str, Any], opt: Any, precision: ek.Precision
) -> dict[str, Any]:
    """bf16 copies of the weights that the GPU's bf16 step multiplies (euler_model.bf16_weight_groups),
    made once here and from then on rewritten by the optimizer's update in the pass that updates the
    weights: the forward reads them instead of casting every weight each step. {} where the forward casts
    for itself: the CPU, the float32 and TF32 modes, and optimizers that do not write copies (Muon, ZeRO).
    The copies are the buffers the model's own cast of the same groups writes (ek.to_bf16_many keeps them
    per list of weights), so an evaluation's forward, which casts, holds no second set. They hold only
    while nothing but that optimizer changes the weights: a runner makes them at its first step."""
    if not getattr(opt, "writes_bf16_copies", False) or not euler_model.bf16_path(params, precision):
        return {}
    copies: dict[str, Any] = {}
    for names in euler_model.bf16_weight_groups(mcfg, params, precision):
        if names:
            copies.update(zip(names, ek.to_bf16_many([params[n] for n in names])))
    return copies


@dataclass(frozen=True)
class StepOptions:
    """What one training step does besides its inputs, from the run's [train] section and its precision
    (`from_train`)."""

    max_norm: float  # global-norm clipping (train.grad_clip); 0 disables
    recompute: bool = False  # the layers' activations re-made in the backward (euler_model/recompute.py)
    keep_activations: bool = False  # the bf16 forward keeps what its backward would re-make
    bf16_grads: bool = False  # the matrices' gradients are bf16 (several micro-batches sum into float32)
    precision: ek.Precision = ek.EXACT  # how the products and attention are computed (the run's)
    dpo_beta: float | None = None  # the DPO loss over pairs of rows with this beta; None: the MTP loss
    dpo_sft_weight: float = 0.0  # with dpo_beta: + this times the chosen replies' NLL per token

    @classmethod
    def from_train(cls, train: TrainConfig, precision: ek.Precision, mode: str = "pretrain") -> StepOptions:
        beta = dpo_beta(train, mode)
        return cls(
            train.grad_clip, train.recompute, train.keep_activations, train.bf16_grads, precision, beta,
            train.dpo_sft_weight,
        )  # fmt: skip


def dpo_beta(train: TrainConfig, mode: str) -> float | None:
    """A `mode` run's step's DPO beta (StepOptions.dpo_beta): train.dpo_beta for dpo, else None."""
    return train.dpo_beta if mode == "dpo" else None


def train_step(
    mcfg: Any,
    params: dict[str, Any],
    opt: Any,
    comm: Any,
    buf: StepBuffers,
    options: StepOptions,
    fp8_scales: Any = None,
    copies: dict[str, Any] | None = None,
) -> None:
    """One optimizer step from `buf` to updated `params` (see the module docstring), as `options` say;
    `fp8_scales`: delayed FP8 scales of the fp8 mode (euler_model.blocks), updated at the step's end from
    the maxima its kernels measured (on the device: a captured step updates them every replay);
    `copies`: bf16_weight_copies(...), which the forward multiplies and the update rewrites.

    Several micro-batches: each one's gradients are weighted by its share and summed into buf.grads. One
    micro-batch: its share scales the loss's gradient before the backward, and buf.grads becomes the
    backward's own arrays (no pass over the gradients, no second set of them in memory)."""
    count = buf.tokens.shape[0]
    buf.release_step_grads()  # the last step's gradients go before this backward makes new ones
    for i in range(count):
        mask = None if buf.masks is None else buf.masks[i]
        share = buf.shares[i]  # a 0-d array: no host value enters the step
        scale = share if count == 1 else None
        weights = {**params, **copies} if copies else params
        if options.dpo_beta is not None:  # pairs of rows (euler_model.preference)
            pairs = euler_model.PairBatch(buf.tokens[i], buf.targets[i], mask, buf.refs[i])
            loss, grads, _ = euler_model.dpo_loss_and_grads(
                mcfg, weights, pairs, options.dpo_beta, options.precision, scale, options.recompute,
                fp8_scales, options.keep_activations, options.bf16_grads, options.dpo_sft_weight,
            )  # fmt: skip
        else:
            loss, grads = euler_model.loss_and_grads_on_device(
                mcfg,
                weights,
                buf.tokens[i],
                buf.targets[i],
                mask,
                options.recompute,
                scale,
                fp8_scales,
                options.keep_activations,
                options.bf16_grads,
                options.precision,
            )
        if count == 1:
            buf.grads = grads
        else:
            names = list(grads)
            ek.accumulate_scaled_many([buf.grads[n] for n in names], [grads[n] for n in names], share, i > 0)
        loss = loss * share
        buf.loss[...] = loss if i == 0 else buf.loss + loss
    comm.allreduce_grads(buf.grads)  # a no-op on one process
    grads = [buf.grads[n] for n in params]
    ek.step_control(ek.sum_squares_many(grads), buf.loss, buf.hyper, options.max_norm, out=buf.control)
    if copies:
        opt.update(params, buf.grads, buf.control, buf.hyper, copies=copies)
    else:
        opt.update(params, buf.grads, buf.control, buf.hyper)
    if fp8_scales is not None:  # this step's maxima into the histories: the next step casts with them
        ek.update_fp8_scales(fp8_scales)
        fp8_scales.calibrated = True


class EagerStep:
    """train_step run directly, every step (the CPU, several processes, or a GPU step not captured)."""

    def __init__(
        self,
        mcfg: Any,
        params: dict[str, Any],
        opt: Any,
        comm: Any,
        options: StepOptions,
        fp8_scales: Any = None,
    ) -> None:
        self.mcfg, self.params, self.opt, self.comm = mcfg, params, opt, comm
        self.options, self.fp8_scales = options, fp8_scales
        self.buf: StepBuffers | None = None
        self.copies: dict[str, Any] | None = None  # bf16_weight_copies, made at the first step

    def run(self, micro: list[tuple], shares: list[float], hyper: np.ndarray) -> tuple[float, float, bool]:
        """Step on these micro-batches; returns (loss, norm, applied)."""
        if self.buf is None or not self.buf.fits(micro):
            xp = ek.get_array_module(next(iter(self.params.values())))
            self.buf = StepBuffers.allocate(xp, self.mcfg, self.params, micro, len(hyper))
        if self.copies is None:
            self.copies = bf16_weight_copies(self.mcfg, self.params, self.opt, self.options.precision)
        self.buf.write(micro, shares, hyper)
        train_step(
            self.mcfg, self.params, self.opt, self.comm, self.buf, self.options, self.fp8_scales, self.copies
        )
        return self.buf.read()
