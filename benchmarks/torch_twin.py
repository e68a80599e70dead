"""A PyTorch twin of `euler-train pretrain`: the same run with only the framework changed.

Same run config (preset -> --config TOML -> --set -> flags, resolved by euler-train itself), same model
shapes (euler-train's plan_run), same initial weights (`euler_model.init_params(cfg, seed)` copied into
torch tensors, so step 1's losses agree), same batches in the same order (euler-train's loaders: a pure
function of (seed, step, micro, rank)), same learning rate at every step (euler-train's `lr_at`), same
AdamW (betas, eps, decoupled weight decay on tensors with ndim >= 2 only), same global-norm clipping,
gradient accumulation and data-parallel averaging (ranks are emulated in one process), same evaluation
cadence and validation batches, and the same bits per byte. The model is the PyTorch reference of
`benchmarks/bench_model.py` (RMSNorm, RoPE, GQA through scaled_dot_product_attention, SwiGLU, MTP heads);
autograd does the backward, torch.optim.AdamW the update. The run folder gets euler-train's
`metrics.jsonl` rows (written by euler-train's MetricsLogger), `config.toml` and `loss.png`, so both runs
plot with the same code.

The GPU comparison, on one GPU, with DATA made by `euler-data prepare` (any `--config FILE`,
`--set key=value` or flag given to the first command is given unchanged to the second):

    euler-train pretrain --preset gpu --data DATA --out runs/gpu-euler
    python benchmarks/torch_twin.py --preset gpu --data DATA --out runs/gpu-torch \\
        --device cuda --precision tf32
    euler-train plot runs/gpu-euler runs/gpu-torch --labels euler,pytorch --out docs/gpu_vs_torch.png

The last prints each run's final train loss, val loss, val bpb and median tokens/s, and the difference
of the final val bpb. The twin's device and precision default to the config's (`--device cuda` when
run.device is gpu), so `--device` / `--precision` may be left out. `--precision bf16` is PyTorch's own
mixed precision, the twin of euler's bf16 mode: each forward inside `torch.autocast(dtype=bfloat16)`
(bf16 products, float32 softmax and losses as autocast's policy has them), float32 weights, gradients
and AdamW.
On the CPU, `tests/e2e/test_torch_twin.py` is the proof that the two are the same run: 20 steps of the
`small` preset with accumulation, clipping, warmup and cosine, two evaluations; per-step train losses
agree to ~3e-7 relative and val bpb to ~3e-7 (float32 rounding), where decay on the norms, another eps
or the schedule one step off would move them by 4e-4 to 1e-2.

Run with the test environment's Python (it has torch and the euler packages):
/root/.local/share/hatch/env/virtual/main/8q9sCXq4/hatch-test.py3.11/bin/python benchmarks/torch_twin.py -h
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import torch_loss, torch_tables

import euler_model
from euler_train.args import EXIT_CONFIG, TRAIN_FLAGS
from euler_train.batches import Batches, bits_per_byte, make_batches
from euler_train.config import ConfigError, save_config
from euler_train.device import PEAK_FLOPS, flops_per_token
from euler_train.metrics import MetricsLogger
from euler_train.optimizer import muon_names
from euler_train.runspec import RunSpec, config_from_args, plan_run
from euler_train.schedule import lr_at

EXIT_NONFINITE = 3  # as euler-train


# --- arguments and config ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="PyTorch twin of `euler-train pretrain` (same config, data, "
                                "schedule, init and optimizer; only the framework differs)")  # fmt: skip
    p.add_argument("--data", metavar="DIR", help="dataset folder made by euler-data (data.dir)")
    p.add_argument("--out", metavar="RUN", required=True, help="run folder (config, metrics, loss.png)")
    p.add_argument("--preset", choices=["tiny", "small", "gpu"], help="run preset (default: tiny)")
    p.add_argument("--config", metavar="TOML", help="a run config file applied over the preset")
    for flag, kind in (("steps", int), ("batch-size", int), ("grad-accum", int), ("lr", float),
                       ("eval-every", int), ("seed", int)):  # fmt: skip
        p.add_argument(f"--{flag}", type=kind, help=f"as euler-train pretrain --{flag}")
    p.add_argument("--optimizer", choices=["adamw", "muon"], help="muon: torch.optim.Muon for euler's Muon "
                   "group (the blocks' matrices), AdamW for the rest (PyTorch >= 2.9)")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. train.lr=3e-4")
    # dest names differ from TRAIN_FLAGS' so that config_from_args does not read them as run.device etc.
    p.add_argument("--device", dest="torch_device", choices=["cpu", "cuda"],
                   help="torch device (default: cuda when run.device is gpu, else cpu)")  # fmt: skip
    p.add_argument("--precision", dest="torch_precision", choices=["fp32", "tf32", "bf16"],
                   help="tf32: TF32 matmuls on CUDA; bf16: torch.autocast to bfloat16 around each forward "
                        "(PyTorch's mixed precision; float32 weights, optimizer and gradients) "
                        "(default: run.precision)")  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: every core)")
    p.add_argument("--print-every", type=int, default=0, metavar="N", help="progress line every N steps")
    return p


def resolve(args: argparse.Namespace) -> tuple[RunSpec, str, str]:
    """euler-train's own config resolution and run plan; then the torch device and precision."""
    args.resume, args.no_progress, args.no_eval, args.command = False, True, False, "pretrain"
    for name in set(TRAIN_FLAGS) - set(vars(args)):
        setattr(args, name, None)  # flags the twin does not take (init, gpus, ckpt_every, ...)
    cfg = config_from_args(args)
    spec = plan_run(cfg, args.out, "pretrain")
    device = args.torch_device or ("cuda" if cfg.run.device == "gpu" else "cpu")
    if cfg.run.device == "auto" and not args.torch_device:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = args.torch_precision or cfg.run.precision
    if precision not in ("fp32", "tf32", "bf16"):
        raise ConfigError(f"the twin runs fp32, tf32 or bf16, not {precision!r}")
    if device == "cpu" and precision == "tf32":
        raise ConfigError("--precision tf32 needs --device cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device")
    return spec, device, precision


# --- the twin trainer ----------------------------------------------------------------------------------


class TorchTwin:
    """euler-train's Trainer loop, step for step, with torch doing the arithmetic."""

    def __init__(self, spec: RunSpec, device: str, precision: str) -> None:
        self.spec, self.device, self.precision = spec, torch.device(device), precision
        self.cfg, self.mcfg, tcfg = spec.cfg, spec.mcfg, spec.cfg.train
        world = spec.cfg.run.gpus  # data-parallel ranks, emulated here one after the other
        self.ranks: list[Batches] = [
            make_batches(self.cfg, self.mcfg, "pretrain", r, world) for r in range(world)
        ]
        init = euler_model.init_params(self.mcfg, seed=tcfg.seed)  # the very weights euler-train starts from
        self.params = {k: torch.nn.Parameter(torch.from_numpy(v).to(self.device)) for k, v in init.items()}
        self.opts = self.optimizers(tcfg)
        self.cos, self.sin = (t.to(self.device) for t in torch_tables(self.mcfg))
        self.head0 = dataclasses.replace(self.mcfg, n_mtp_heads=1)  # torch_loss of head 0 alone
        self.tokens_seen = 0

    def forward_precision(self) -> Any:
        """The context each forward runs in: bf16 autocast (the backward follows the forward's dtypes), or
        nothing (fp32; tf32 is a switch of the matmuls)."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimizers(self, tcfg: dict[str, Any]) -> list[tuple[Any, float]]:
        """(optimizer, peak-lr factor) pairs: AdamW over every weight (decay on ndim >= 2), or with
        train.optimizer = "muon" torch.optim.Muon over euler's Muon group at muon_lr / lr x the lr."""
        muon = set(muon_names(self.params)) if tcfg.optimizer == "muon" else set()
        rest = {n: p for n, p in self.params.items() if n not in muon}
        groups = [
            {"params": [p for p in rest.values() if p.ndim >= 2], "weight_decay": tcfg.weight_decay},
            {"params": [p for p in rest.values() if p.ndim < 2], "weight_decay": 0.0},
        ]
        betas, fused = (tcfg.beta1, tcfg.beta2), self.device.type == "cuda"
        out = [(torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=tcfg.eps, fused=fused), 1.0)]
        if muon:
            matrices = [self.params[n] for n in self.params if n in muon]
            opt = torch.optim.Muon(matrices, lr=0.0, weight_decay=tcfg.weight_decay,
                                   momentum=tcfg.muon_momentum, nesterov=True)  # fmt: skip
            out.append((opt, tcfg.muon_lr / tcfg.lr))
        return out

    def tensors(self, batch: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens, targets, mask = batch
        mask = torch.ones(targets.shape) if mask is None else torch.from_numpy(mask)
        move = lambda a: a.to(self.device, non_blocking=True)  # noqa: E731
        return move(torch.from_numpy(tokens)), move(torch.from_numpy(targets)), move(mask)

    def step(self, step: int) -> dict[str, Any]:
        """Optimizer step `step` (0-based): micro-batches x ranks averaged by loss tokens, clip, AdamW."""
        tcfg = self.cfg.train
        micro = [b.train(step, i) for b in self.ranks for i in range(b.grad_accum)]
        weights = [float(t.size) for t, _, _ in micro]  # pretrain: every token is a loss token
        total = sum(weights)
        loss_sum = 0.0
        for opt, _ in self.opts:
            opt.zero_grad(set_to_none=True)
        for batch, w in zip(micro, weights):
            with self.forward_precision():
                loss = torch_loss(self.mcfg, self.params, *self.tensors(batch), self.cos, self.sin)
            (loss.float() * (w / total)).backward()
            loss_sum += float(loss.detach()) * (w / total)
        params = list(self.params.values())
        clip = tcfg.grad_clip if tcfg.grad_clip > 0 else math.inf  # inf: the norm, no scaling
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        lr = lr_at(step, tcfg.lr, tcfg.min_lr, tcfg.warmup_steps, tcfg.steps)
        row = {"step": step + 1, "loss": loss_sum, "lr": lr, "grad_norm": norm}
        if not (math.isfinite(loss_sum) and math.isfinite(norm)):
            what = "loss" if not math.isfinite(loss_sum) else "gradient"
            if tcfg.on_nonfinite == "stop":
                raise FloatingPointError(
                    f"non-finite {what} at step {step + 1} (loss={loss_sum}, norm={norm})"
                )
            print(f"torch_twin: non-finite {what} at step {step + 1}; step skipped", file=sys.stderr)
            row["skipped"] = True
        else:
            for opt, factor in self.opts:
                for group in opt.param_groups:
                    group["lr"] = lr * factor
                opt.step()
        self.tokens_seen += sum(t.size for t, _, _ in micro)
        return row

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """val_loss (MTP mean), val_next_loss (head 0) and val_bpb over eval.batches batches per rank."""
        if self.ranks[0].val_loader is None:
            return {}
        mtp_sum = head0_sum = weight = 0.0
        for batches in self.ranks:
            for i in range(self.cfg.eval.batches):
                tokens, targets, mask = self.tensors(batches.val(i))
                w = float(tokens.numel())
                with self.forward_precision():
                    mtp = torch_loss(self.mcfg, self.params, tokens, targets, mask, self.cos, self.sin)
                    head0 = torch_loss(self.head0, self.params, tokens, targets, mask, self.cos, self.sin)
                mtp_sum += w * float(mtp)
                head0_sum += w * float(head0)
                weight += w
        out = {"val_loss": mtp_sum / max(weight, 1.0), "val_next_loss": head0_sum / max(weight, 1.0)}
        bpb = bits_per_byte(out["val_next_loss"], self.ranks[0].val_bytes_per_token)
        if bpb is not None:
            out["val_bpb"] = bpb
        return out

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation against euler-train's table of peak FLOP/s (CUDA only)."""
        if self.device.type != "cuda":
            return None
        name = torch.cuda.get_device_name(self.device)
        peak = next((t[self.precision] for key, t in PEAK_FLOPS.items() if key in name), None)
        if peak is None:
            return None
        m = self.mcfg
        matmul_params = euler_model.count_params(m) - m.vocab_size * m.dim
        world = self.cfg.run.gpus
        return flops_per_token(matmul_params, m.n_layers, m.dim, m.context) * tokens_per_s / (peak * world)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, print_every: int) -> dict[str, Any]:
        """Train to train.steps, writing metrics rows exactly when euler-train writes them."""
        cfg, total = self.cfg, self.cfg.train.steps
        self.spec.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.spec.run_dir / "config.toml")
        every, eval_every = cfg.log.every, cfg.eval.every
        last: dict[str, Any] = {}
        train_s, start = 0.0, time.perf_counter()
        with MetricsLogger(self.spec.run_dir, tensorboard=False) as log:
            for step in range(total):
                t0, before = time.perf_counter(), self.tokens_seen
                row = self.step(step)
                self.sync()
                seconds = max(time.perf_counter() - t0, 1e-9)
                train_s += seconds
                row["tok_per_s"] = (self.tokens_seen - before) / seconds
                if (mfu := self.mfu(row["tok_per_s"])) is not None:
                    row["mfu"] = mfu
                done = step + 1
                if (eval_every and done % eval_every == 0) or done == total:
                    row.update(self.evaluate())
                row["elapsed_s"] = time.perf_counter() - start  # as euler-train's rows
                if done % every == 0 or "val_loss" in row or done == total:
                    log.write(row)
                if print_every and (done % print_every == 0 or "val_loss" in row or done == total):
                    print(progress_line(row, total), flush=True)
                last.update(row)
        wall = time.perf_counter() - start
        return {
            "steps": total,
            "tokens": self.tokens_seen,
            "wall_s": wall,
            "tok_per_s": self.tokens_seen / max(train_s, 1e-9),  # training steps only, as euler-train's rows
            "train_loss": last.get("loss"),
            "val_loss": last.get("val_loss"),
            "val_bpb": last.get("val_bpb"),
        }


def progress_line(row: dict[str, Any], total: int) -> str:
    line = f"step {row['step']}/{total}  loss {row['loss']:.4f}  lr {row['lr']:.3g}"
    line += f"  tok/s {row['tok_per_s']:,.0f}"
    if "mfu" in row:
        line += f"  mfu {100 * row['mfu']:.1f}%"
    if "val_loss" in row:
        line += f"  val {row['val_loss']:.4f}"
    if "val_bpb" in row:
        line += f"  bpb {row['val_bpb']:.4f}"
    return line


def describe(twin: TorchTwin) -> str:
    m, t = twin.mcfg, twin.cfg.train
    world = twin.cfg.run.gpus
    per_step = t.batch_size * t.grad_accum * world * m.context
    return (
        f"torch_twin pretrain: {twin.cfg.model['preset']} model, "
        f"{euler_model.count_params(m):,} parameters, "
        f"vocab {m.vocab_size}, context {m.context}, {per_step:,} tokens/step (batch {t.batch_size} x "
        f"accum {t.grad_accum} x {world} ranks), {t.steps} steps on torch {torch.__version__} "
        f"{twin.device.type} ({twin.precision})"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec, device, precision = resolve(args)
    except ConfigError as err:
        print(f"torch_twin: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    twin = TorchTwin(spec, device, precision)
    print(describe(twin), flush=True)
    print_every = args.print_every or max(1, spec.cfg.train.steps // 20)
    try:
        summary = twin.run(print_every)
    except FloatingPointError as err:
        print(f"torch_twin: error: {err}; stopping", file=sys.stderr)
        return EXIT_NONFINITE
    (spec.run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    from euler_train.plot import plot_metrics

    plot_metrics(spec.run_dir / "metrics.jsonl", spec.run_dir / "loss.png")
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    print(
        f"torch_twin: done: {summary['steps']} steps, {summary['tokens']:,} tokens "
        f"in {summary['wall_s']:.1f} s "
        f"({summary['tok_per_s']:,.0f} tok/s while training); final train loss {fmt(summary['train_loss'])}, "
        f"val loss {fmt(summary['val_loss'])}, val bpb {fmt(summary['val_bpb'])}; run folder {spec.run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
