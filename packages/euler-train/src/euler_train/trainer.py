"""The training loop shared by pretrain and sft: AdamW, warmup + cosine, accumulation, clipping,
evaluation, checkpoints, exact resume, SIGINT/SIGTERM, non-finite guards, data parallelism.

Every source of randomness is a function of (seed, step): the initial weights of (seed), each batch of
(seed, step, micro, rank). A checkpoint holds weights, moments, the step and the seed, so a resumed run
computes exactly what an uninterrupted one would have.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import euler_data
import euler_kernels as ek
import euler_model
from euler_data import FolderUnwritable
from euler_model.blocks import fp8_scale_formats
from euler_train import modelio
from euler_train.batches import Batches, bits_per_byte, make_batches
from euler_train.checkpoint import CheckpointManager, read_state
from euler_train.config import ConfigError, save_config
from euler_train.device import Device, flops_per_token, peak_flops
from euler_train.distributed import Comm
from euler_train.graph_step import CapturedOrEager, GraphStep
from euler_train.metrics import MetricsLogger, read_metrics
from euler_train.plot import plot_metrics, val_summary
from euler_train.progress import Progress
from euler_train.report import write_report
from euler_train.runfolder import clear_run
from euler_train.runspec import RunSpec
from euler_train.schedule import lr_at
from euler_train.signals import StopFlag
from euler_train.step import EagerStep, StepOptions, dpo_beta
from euler_train.zero import make_sharded_or_not

EXIT_NONFINITE = 3


class NonFiniteError(RuntimeError):
    """The loss or gradient became NaN/inf and train.on_nonfinite is "stop"."""


@dataclass
class State:
    """What changes while training (and is saved in trainer_state.json)."""

    step: int = 0  # optimizer steps done
    tokens: int = 0  # training tokens seen, all ranks together
    skipped: int = 0  # steps skipped for a non-finite loss/gradient
    val_loss: float | None = None  # at the most recent evaluation


@dataclass
class Trainer:
    spec: RunSpec
    device: Device
    comm: Comm
    params: dict[str, Any] = field(default_factory=dict)
    state: State = field(default_factory=State)
    stepper: Any = None  # step.EagerStep, or a CUDA graph of the same step (see _stepper)
    fp8_scales: Any = None  # delayed FP8 scales (train.fp8_scaling = "delayed"), else None
    fp8_saturated: int = 0  # values saturated by those scales as of the last report
    fp8_reported: int = 0  # steps done at the last report

    # --- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Weights (fresh, from --init, or from the resume checkpoint), optimizer, loaders, run folder."""
        tcfg, xp = self.spec.cfg.train, self.device.xp
        if self.spec.resume_from is not None:
            _, self.params, _, _ = modelio.load_model(self.spec.resume_from, xp)
        elif self.spec.init is not None:
            _, self.params, _, _ = modelio.load_model(self.spec.init, xp)
        else:
            self.params = euler_model.init_params(self.spec.mcfg, seed=tcfg.seed, xp=xp)
        self.opt = make_sharded_or_not(self.params, tcfg, self.comm)
        if tcfg.fp8_scaling == "delayed":  # the first step measures the maxima they start from
            if self.comm.world_size > 1:
                raise ConfigError(
                    "train.fp8_scaling='delayed' runs on one GPU (each process would keep scales of its "
                    f"own, and a checkpoint holds one set); with {self.comm.world_size} use 'current'"
                )
            self.fp8_scales = ek.new_fp8_scales(fp8_scale_formats(self.spec.mcfg))
        if self.spec.resume_from is not None:
            self._restore(self.spec.resume_from)
        self.batches: Batches = make_batches(
            self.spec.cfg, self.spec.mcfg, self.spec.mode, self.comm.rank, self.comm.world_size
        )
        if self.spec.mode == "sft":
            self._check_sft_fits()
        if self.spec.mode == "dpo":  # the reference: the starting weights, scored once (kept in checkpoints)
            self._check_pairs_fit()
            resumed = self.spec.resume_from is not None
            self.batches.refs = (
                modelio.read_reference(self.spec.resume_from) if resumed else self._reference()
            )
        cfg = self.spec.cfg
        self.ckpts = CheckpointManager(
            self.spec.run_dir / "checkpoints", cfg.checkpoint.keep_last, cfg.checkpoint.keep_best
        )
        if self.comm.is_main:
            if self.spec.overwrite:
                clear_run(self.spec.run_dir)
            self.spec.run_dir.mkdir(parents=True, exist_ok=True)
            self.ckpts.clean_temporaries()
            for tmp in self.spec.run_dir.glob(".tmp-*"):  # a killed writer's half-written plot or report
                tmp.unlink(missing_ok=True)
            save_config(cfg, self.spec.run_dir / "config.toml", self.spec.history)

    def _check_sft_fits(self) -> None:
        """Say how many examples the context cuts; ConfigError when the first step's batches hold no
        response token inside the context."""
        lengths = np.diff(self.batches.train_loader.offsets)  # (examples,) tokens of each
        window = self.spec.mcfg.context + self.spec.mcfg.n_mtp_heads
        cut, share = int((lengths > window).sum()), float((lengths > window).mean())
        if cut and self.comm.is_main:
            print(
                f"euler-train sft: note: {cut} of {len(lengths)} train examples ({100 * share:.0f}%) "
                f"are longer than the model's window ({window} tokens: context {self.spec.mcfg.context} + "
                f"{self.spec.mcfg.n_mtp_heads} heads) and are cut to it",
                file=sys.stderr,
            )
        micro = [self.batches.train(0, i) for i in range(self.batches.grad_accum)]
        if self.comm.allreduce_scalars([sum(self.micro_weights(micro))])[0] == 0:
            raise ConfigError(
                f"sft: no response token fits in the context ({self.spec.mcfg.context} tokens) of the "
                "first batch; pretrain with a longer context (--set model.context=N) or shorter examples"
            )

    def _check_pairs_fit(self) -> None:
        """Say how many training pairs have a reply that starts past the model's window (they weigh
        nothing); ConfigError when none has a reply token inside it."""
        loader, context = self.batches.train_loader, self.spec.mcfg.context
        starts = [
            int(np.argmax(loader.mask[lo:hi])) for lo, hi in zip(loader.offsets[:-1], loader.offsets[1:])
        ]
        outside = np.asarray(starts).reshape(-1, 2).max(axis=1) >= context  # (pairs,) a reply starts past it
        if outside.all():
            raise ConfigError(
                f"dpo: no training pair has a reply token within the model's context of {context} tokens "
                f"(the shortest prompt has {min(starts)}); start from a model with a longer context"
            )
        if outside.any() and self.comm.is_main:
            print(
                f"euler-train dpo: note: {int(outside.sum())} of {len(outside)} training pairs have a reply "
                f"that starts past the model's context of {context} tokens; they weigh nothing",
                file=sys.stderr,
            )

    def _reference(self) -> dict[str, np.ndarray]:
        """The current (starting) weights' log-probability of each row of each split's pairs, in row order."""
        refs = {}
        for split, loader in (("train", self.batches.train_loader), ("val", self.batches.val_loader)):
            if loader is not None:
                starts = range(0, loader.n_pairs, loader.batch_size)
                refs[split] = np.concatenate([self._pair_logprobs(loader, first)[0] for first in starts])
        return refs

    def _pair_logprobs(self, loader: Any, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each row's log-probability of its reply (2P,) float64, the rows' masks, the pair ids) of the
        loader's pairs first .. first + batch_size - 1, under the current weights."""
        tokens, targets, mask, pairs = loader.pairs(first, loader.batch_size)
        batch = (self.device.xp.asarray(a) for a in (tokens, targets, mask))
        logps = euler_model.sequence_logprobs(self.spec.mcfg, self.params, *batch, self.device.precision)
        return ek.to_numpy(logps).astype(np.float64), np.asarray(mask), pairs

    def _restore(self, folder: Any) -> None:
        """Optimizer moments and the loop state of a checkpoint."""
        saved = read_state(folder)
        self.opt.load_state_tensors(modelio.read_optimizer(folder), saved["opt_t"], self.device.xp)
        self.state = State(saved["step"], saved["tokens"], saved.get("skipped", 0), saved.get("val_loss"))
        if self.fp8_scales is not None:
            self._restore_fp8_scales(folder)
        if saved.get("seed") != self.spec.cfg.train.seed:
            print(f"euler-train: note: resuming a run started with seed {saved.get('seed')}", file=sys.stderr)

    def _restore_fp8_scales(self, folder: Any) -> None:
        """The delayed FP8 scales a checkpoint saved (so the resumed run casts as the uninterrupted one);
        a checkpoint without them (a run with current scaling) starts them afresh, with a note."""
        arrays = modelio.read_fp8_scales(folder)
        if arrays is None:
            print(
                "euler-train: note: the checkpoint holds no FP8 scales; the first step measures them",
                file=sys.stderr,
            )
            return
        try:
            self.fp8_scales = ek.fp8_scales_from_arrays(fp8_scale_formats(self.spec.mcfg), arrays)
        except ValueError as err:
            raise ConfigError(f"{folder}/{modelio.FP8_SCALES}: {err}") from None
        self.fp8_saturated = int(self.fp8_scales.saturated.get().sum())
        self.fp8_reported = self.state.step

    def _fp8_report(self, step: int) -> None:
        """One line when the delayed FP8 scales saturated values since the last report (never silently)."""
        if self.fp8_scales is None:
            return
        total = int(self.fp8_scales.saturated.get().sum())
        if total > self.fp8_saturated and self.comm.is_main:
            print(
                f"euler-train: note: {total - self.fp8_saturated:,} FP8 values saturated in steps "
                f"{self.fp8_reported + 1}-{step + 1} (larger than their delayed scale allowed: clipped to "
                "the format's largest value)",
                file=sys.stderr,
            )
        self.fp8_saturated, self.fp8_reported = total, step + 1

    # --- one step ------------------------------------------------------------------------------------
    def micro_weights(self, micro: list[tuple]) -> list[float]:
        """Each micro-batch's weight in the loss: a dpo batch its pairs, a masked (sft) batch its loss
        tokens, a pretrain one B*T."""
        if self.spec.mode == "dpo":
            return [t.shape[0] / 2 for t, *_ in micro]
        return [float(m[:, : t.shape[1]].sum()) if m is not None else float(t.size) for t, _, m in micro]

    def step_once(self, step: int, stop: StopFlag) -> tuple[dict[str, Any], bool]:
        """One optimizer step (step.train_step, captured as a CUDA graph where it can be); returns its
        metrics row and whether every rank agreed to stop."""
        micro, shares, total = self._inputs(step)
        lr = self._lr(step)
        hyper = self.opt.hyper(lr, enable=total > 0)  # SFT rows whose responses all fall outside: no update
        loss, norm, applied = self._stepper().run(micro, shares, hyper)
        loss, stop_votes = self.comm.allreduce_scalars([loss, float(stop.signum is not None)])
        row = {"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm}
        if applied:
            self.opt.t += 1
        else:
            if total > 0:  # the device found the loss or the gradient norm non-finite
                self._nonfinite(step, loss, norm)
            row["skipped"] = True
        self.state.step = step + 1
        self.state.tokens += sum(t.size for t, *_ in micro) * self.comm.world_size
        return row, stop_votes > 0

    def _inputs(self, step: int) -> tuple[list[tuple], list[float], float]:
        """(micro-batches, each one's share of the loss, loss tokens of all ranks) of step `step`."""
        micro = [self.batches.train(step, i) for i in range(self.batches.grad_accum)]
        self._check_ids(step, micro)
        weights = self.micro_weights(micro)
        total = self.comm.allreduce_scalars([sum(weights)])[0]
        return micro, [w / total if total > 0 else 0.0 for w in weights], total

    def gradients(self, step: int) -> tuple[float, dict[str, Any]]:
        """This rank's share of step `step`'s loss and the all-reduced gradients, without updating anything:
        the same train_step with its update disabled."""
        micro, shares, _ = self._inputs(step)
        tcfg, precision = self.spec.cfg.train, self.device.precision
        beta = dpo_beta(tcfg, self.spec.mode)
        options = StepOptions(
            max_norm=0.0, recompute=tcfg.recompute, precision=precision, dpo_beta=beta,
            dpo_sft_weight=tcfg.dpo_sft_weight,
        )  # fmt: skip
        eager = EagerStep(self.spec.mcfg, self.params, self.opt, self.comm, options)
        loss, _, _ = eager.run(micro, shares, self.opt.hyper(self._lr(step), enable=False))
        return loss, {n: g.copy() for n, g in eager.buf.grads.items()}

    def _check_ids(self, step: int, micro: list[tuple]) -> None:
        """Token ids must index the embedding (the GPU kernels read them unchecked): checked on the host."""
        vocab = self.spec.mcfg.vocab_size
        for tokens, targets, *_ in micro:
            for name, ids in (("tokens", tokens), ("targets", targets)):
                if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                    raise ConfigError(
                        f"step {step + 1}: {name} hold ids outside [0, {vocab}) (min {ids.min()}, max "
                        f"{ids.max()}): the dataset's tokenizer does not fit model.vocab_size"
                    )

    def _stepper(self) -> Any:
        """The step runner, made at the first step: a CUDA graph on one GPU with the fused attention
        kernel (several processes all-reduce through the host, and other head sizes attend through
        CuPy's matmul, which cannot be captured), else the eager step; a failed capture falls back."""
        if self.stepper is not None:
            return self.stepper
        tcfg, args = self.spec.cfg.train, (self.spec.mcfg, self.params, self.opt, self.comm)
        options = (StepOptions.from_train(tcfg, self.device.precision, self.spec.mode), self.fp8_scales)
        self.stepper = EagerStep(*args, *options)
        graphable = self.device.kind == "gpu" and self.comm.world_size == 1
        if tcfg.cuda_graph and graphable and ek.flash_attention_supports(self.spec.mcfg.head_dim):
            graph = GraphStep(*args, *options)
            self.stepper = CapturedOrEager(graph, self.stepper)
        return self.stepper

    def _lr(self, step: int) -> float:
        """The learning rate of optimizer step `step` (warmup, then cosine to train.min_lr)."""
        t = self.spec.cfg.train
        return lr_at(step, t.lr, t.min_lr, t.warmup_steps, t.steps)

    def _nonfinite(self, step: int, loss: float, norm: float) -> None:
        msg = (
            f"non-finite {'loss' if not math.isfinite(loss) else 'gradient'} at step {step + 1} "
            f"(loss={loss}, grad_norm={norm})"
        )
        if self.spec.cfg.train.on_nonfinite == "stop":
            raise NonFiniteError(
                f"{msg}; stopping (the last good checkpoint is kept; set "
                'train.on_nonfinite="skip" to skip such steps)'
            )
        self.state.skipped += 1
        if self.comm.is_main:
            print(f"euler-train: {msg}; step skipped", file=sys.stderr)

    # --- evaluation ----------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Validation loss (MTP mean, as trained) and next-token bits per byte over eval.batches batches."""
        if self.batches.val_loader is None:
            return {}
        if self.spec.mode == "dpo":
            return self._evaluate_pairs()
        sums = np.zeros(3)  # weighted MTP loss, weighted head-0 loss, weight
        for i in range(self.spec.cfg.eval.batches):
            tokens, targets, mask = self.batches.val(i)
            w = float(mask[:, : tokens.shape[1]].sum()) if mask is not None else float(tokens.size)
            mtp, head0 = self._eval_losses(tokens, targets, mask)
            sums += (mtp * w, head0 * w, w)
        mtp_sum, head0_sum, weight = self.comm.allreduce_scalars(list(sums))
        val_loss, next_loss = mtp_sum / max(weight, 1.0), head0_sum / max(weight, 1.0)
        out = {"val_loss": val_loss, "val_next_loss": next_loss}
        bpb = bits_per_byte(next_loss, self.batches.val_bytes_per_token)
        if bpb is not None and self.spec.mode == "pretrain":
            out["val_bpb"] = bpb
        return out

    def _evaluate_pairs(self) -> dict[str, float]:
        """DPO's statistics on the held-out pairs (val_*) and as many training pairs (train_*): the loss, the
        reward accuracy (the share of pairs whose implicit reward prefers the chosen reply), the mean reward
        margin, the policy's mean chosen / rejected log-probabilities, and how often the chosen reply has
        the higher log-probability per reply token under the policy (preference) and under the starting
        weights (reference_preference: what the SFT model alone prefers)."""
        beta = self.spec.cfg.train.dpo_beta
        out = {}
        for split in ("val", "train"):
            loader = self.batches.val_loader if split == "val" else self.batches.train_loader
            sums = np.zeros(8)  # loss, correct, margin, chosen, rejected logp, pairs, the two preferences
            for i in range(self.spec.cfg.eval.batches):
                if i * loader.batch_size >= loader.n_pairs:
                    break
                logps, mask, pairs = self._pair_logprobs(loader, i * loader.batch_size)
                ref = self.batches.refs[split][euler_data.pair_rows(pairs)]  # (2P,)
                margin = euler_model.reward_margins(logps, ref)  # (P,)
                length = np.maximum(mask.sum(axis=1), 1.0)  # (2P,) reply tokens in the window
                sums += (np.logaddexp(0.0, -beta * margin).sum(), (margin > 0).sum(), margin.sum(),
                         logps[0::2].sum(), logps[1::2].sum(), len(pairs),
                         prefers(logps / length).sum(), prefers(ref / length).sum())  # fmt: skip
            loss, correct, margin, chosen, rejected, n, own, start = self.comm.allreduce_scalars(list(sums))
            n = max(n, 1.0)
            out |= {f"{split}_dpo_loss": loss / n, f"{split}_reward_accuracy": correct / n,
                    f"{split}_margin": margin / n, f"{split}_chosen_logp": chosen / n,
                    f"{split}_rejected_logp": rejected / n, f"{split}_preference": own / n,
                    f"{split}_reference_preference": start / n}  # fmt: skip
        out["val_loss"] = out["val_dpo_loss"]  # what keep_best and the loss plot read
        return out

    def _eval_losses(self, tokens: Any, targets: Any, mask: Any) -> tuple[float, float]:
        """(mean over heads, head 0) cross-entropy of one batch, from one forward pass."""
        xp, mcfg = self.device.xp, self.spec.mcfg
        tokens, targets = xp.asarray(tokens), xp.asarray(targets)
        mask = None if mask is None else xp.asarray(mask)
        precision = self.device.precision
        z = euler_model.logits(mcfg, self.params, tokens, True, targets, precision)  # (K, B, T, V)
        t = tokens.shape[1]
        losses = []
        for k in range(mcfg.n_mtp_heads):
            m = None if mask is None else mask[:, k : k + t]
            losses.append(float(ek.cross_entropy_forward(z[k], targets[:, k : k + t], m)[0]))
        return sum(losses) / len(losses), losses[0]

    # --- checkpoints ---------------------------------------------------------------------------------
    def save(self, val_loss: float | None = None) -> None:
        """Checkpoint this step (rank 0 writes, every rank calls: under train.zero = 1 each gives its share
        of the optimizer state); refuses non-finite weights so a good one is never replaced."""
        opt_state = self.opt.state_tensors()  # a collective under ZeRO
        if not self.comm.is_main:
            return
        if not all(bool(self.device.xp.isfinite(p).all()) for p in self.params.values()):
            print(
                f"euler-train: weights at step {self.state.step} are not finite; not saving", file=sys.stderr
            )
            return
        state = self.trainer_state(val_loss)

        def write(folder: Any) -> None:
            modelio.write_model(
                folder, self.spec.mcfg, self.params, {"step": str(self.state.step)}, self.spec.tokenizer_path
            )
            modelio.write_optimizer(folder, opt_state)
            if self.fp8_scales is not None:
                modelio.write_fp8_scales(folder, ek.fp8_scale_arrays(self.fp8_scales))
            if self.batches.refs is not None:
                modelio.write_reference(folder, self.batches.refs)

        self.ckpts.save(self.state.step, write, state)

    def trainer_state(self, val_loss: float | None) -> dict[str, Any]:
        s = self.state
        return {
            "step": s.step,
            "tokens": s.tokens,
            "skipped": s.skipped,
            "opt_t": self.opt.t,
            "optimizer": self.spec.cfg.train.optimizer,
            "seed": self.spec.cfg.train.seed,
            "val_loss": val_loss,
            "mode": self.spec.mode,
            "model_config": self.spec.mcfg.to_dict(),
            "tokenizer_fingerprint": self.spec.fingerprint,
            "world_size": self.comm.world_size,
            "global_batch": self.spec.cfg.train.batch_size * self.comm.world_size,  # rows per micro
            "grad_accum": self.spec.cfg.train.grad_accum,
            "time": time.time(),
        }

    # --- the loop ------------------------------------------------------------------------------------
    def run(self, stop: StopFlag) -> int:
        """Train to train.steps; returns the exit code (0 done, 128 + signal when interrupted)."""
        cfg, main = self.spec.cfg, self.comm.is_main
        if main:
            print(self.describe(), file=sys.stderr)
        log = MetricsLogger(self.spec.run_dir, cfg.log.tensorboard, self.state.step or None) if main else None
        bar = Progress(self, cfg.train.steps, enabled=main and cfg.log.progress)
        try:
            stopped = self._loop(stop, bar, log)
        finally:
            bar.close()
            if log is not None:
                log.close()
        if stopped:
            return self._interrupted(stop)
        self.finish()
        return 0

    def _loop(self, stop: StopFlag, bar: Any, log: MetricsLogger | None) -> bool:
        """Steps until the end (False) or until a signal stopped every rank (True, checkpoint written)."""
        total, every = self.spec.cfg.train.steps, self.spec.cfg.log.every
        start = time.perf_counter()
        for step in range(self.state.step, total):
            row, stopping = self._timed_step(step, stop)
            done = step + 1
            val = self._maybe_eval(done, total, row)
            row["elapsed_s"] = time.perf_counter() - start  # wall time of this process's loop so far
            bar.update(row)
            if done % every == 0 or "val_loss" in row or done == total:
                self._fp8_report(step)
                if log is not None:
                    log.write(row)  # before the checkpoint: a checkpoint of step N has its rows on disk
            saved = self._maybe_save(done, total, val)
            if stopping and done < total:
                if not saved:  # decided alike on every rank (save is a collective under ZeRO)
                    self.save()
                return True
        return False

    def _timed_step(self, step: int, stop: StopFlag) -> tuple[dict[str, Any], bool]:
        """step_once, plus the step's own throughput (and MFU on GPU) in its row."""
        start, before = time.perf_counter(), self.state.tokens
        row, stopping = self.step_once(step, stop)
        row["tok_per_s"] = (self.state.tokens - before) / max(time.perf_counter() - start, 1e-9)
        mfu = self.mfu(row["tok_per_s"])
        if mfu is not None:
            row["mfu"] = mfu
        return row, stopping

    def describe(self) -> str:
        """One line: what is trained, on what, from where."""
        m, t = self.spec.mcfg, self.spec.cfg.train
        rows = 2 * t.batch_size if self.spec.mode == "dpo" else t.batch_size  # a dpo batch: pairs of rows
        per_step = rows * t.grad_accum * self.comm.world_size * m.context
        batch = f"{t.batch_size} pairs" if self.spec.mode == "dpo" else t.batch_size
        start = f"resuming at step {self.state.step}" if self.state.step else "from step 0"
        model = (
            f"the model of {self.spec.init}" if self.spec.init else f"{self.spec.cfg.model['preset']} model"
        )
        return (
            f"euler-train {self.spec.mode}: {model}, {euler_model.count_params(m):,} parameters, "
            f"vocab {m.vocab_size}, context {m.context}, {per_step:,} tokens/step (batch {batch} x "
            f"accum {t.grad_accum} x {self.comm.world_size} processes), {t.steps} steps on "
            f"{self.device.kind} ({self.spec.cfg.run.precision}), {start}"
        )

    def _maybe_eval(self, done: int, total: int, row: dict[str, Any]) -> float | None:
        """Evaluate into `row` when this step is due (and at the last step); returns the val loss."""
        cfg = self.spec.cfg
        if cfg.eval.enabled and ((cfg.eval.every and done % cfg.eval.every == 0) or done == total):
            row.update(self.evaluate())
            self.state.val_loss = row.get("val_loss")
            return self.state.val_loss
        return None

    def _maybe_save(self, done: int, total: int, val: float | None) -> bool:
        """Checkpoint when this step is due (and at the last step); returns whether it checkpointed."""
        every = self.spec.cfg.checkpoint.every
        due = bool(every and done % every == 0) or done == total
        if due:
            self.save(val)
        return due

    def _interrupted(self, stop: StopFlag) -> int:
        signum = stop.signum or signal.SIGTERM  # told by another rank: report it like a launcher's stop
        if self.comm.is_main:
            print(
                f"euler-train: stopped at step {self.state.step}; checkpoint saved in "
                f"{self.ckpts.root}; continue with --resume",
                file=sys.stderr,
            )
        return 128 + signum

    def finish(self) -> None:
        """loss.png, a one-line summary (the last evaluation's next-token val loss and bits per byte) and
        report.md (rank 0). A plot or report that cannot be written is a note: the run itself is done."""
        if not self.comm.is_main:
            return
        run = self.spec.run_dir
        try:
            plot_metrics(run / "metrics.jsonl", run / "loss.png")
        except (ValueError, FolderUnwritable) as err:
            print(f"euler-train: no plot: {err}", file=sys.stderr)
        val = val_summary(read_metrics(run / "metrics.jsonl"))
        print(
            f"euler-train: done: {self.state.step} steps, {self.state.tokens:,} tokens"
            + (f", {val}" if val else "")
            + f"; run folder {run}"
        )
        try:
            write_report(run, self.device.kind)
        except FolderUnwritable as err:
            print(f"euler-train: no report: {err} (`euler-train report {run}` writes it)", file=sys.stderr)

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation of this process's GPU, None on CPU."""
        peak = peak_flops(self.device, self.spec.cfg.run.precision)
        if peak is None:
            return None
        m = self.spec.mcfg
        matmul_params = euler_model.count_params(m) - m.vocab_size * m.dim  # the embedding is a lookup
        per_tok = flops_per_token(matmul_params, m.n_layers, m.dim, m.context)
        return per_tok * tokens_per_s / (peak * self.comm.world_size)


def prefers(per_token: np.ndarray) -> np.ndarray:
    """(P,) bool: whether each pair's chosen row (2i) has the higher value than its rejected row (2i + 1)."""
    return per_token[0::2] > per_token[1::2]
