"""euler-train side by side with PyTorch: one training step, and one checkpoint write/read.

    python bench_train.py cpu --data DIR [--reps 7]         # small preset on the CPU
    python bench_train.py gpu --data DIR --precision tf32   # gpu preset on one GPU (fp32 or tf32)

Training step: euler's `Trainer.step_once` (loader, loss_and_grads, clipping, AdamW) against the same
decoder written in PyTorch (RMSNorm, RoPE, GQA through SDPA, SwiGLU, K output heads; autograd),
torch.optim.AdamW and clip_grad_norm_, on the same token batches. Checkpoint: euler's atomic folder
(safetensors for weights and moments, sha256 list, fsync, rename) against torch.save of the same tensors
followed by an fsync.
Measurements are interleaved (ours, reference, ours, ...) and reported as medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def euler_trainer(data: str, preset: str, device: str, precision: str, batch: int, run: Path):
    from euler_train.config import resolve_config
    from euler_train.device import setup_device
    from euler_train.distributed import Comm
    from euler_train.runspec import plan_run
    from euler_train.trainer import Trainer

    cfg = resolve_config(
        preset,
        overrides=[
            f'data.dir="{data}"',
            f"train.batch_size={batch}",
            f'run.device="{device}"',
            f'run.precision="{precision}"',
        ],
    )
    trainer = Trainer(plan_run(cfg, run, "pretrain"), setup_device(cfg.run), Comm())
    trainer.setup()
    return trainer


def torch_model(mcfg, device: str):
    """The same decoder in PyTorch (RMSNorm, RoPE, GQA through SDPA, SwiGLU, K heads) + torch AdamW."""
    import torch

    model = TorchDecoder(mcfg).to(device)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return model, params, opt


def _torch_decoder_class():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c) -> None:
            super().__init__()
            d, kv = c.dim // c.n_heads, c.n_kv_heads * (c.dim // c.n_heads)
            self.c, self.d = c, d
            self.n1, self.n2 = nn.RMSNorm(c.dim, eps=c.norm_eps), nn.RMSNorm(c.dim, eps=c.norm_eps)
            self.wq, self.wk, self.wv = (nn.Linear(c.dim, n, bias=False) for n in (c.dim, kv, kv))
            self.wo = nn.Linear(c.dim, c.dim, bias=False)
            self.gate, self.up = (
                nn.Linear(c.dim, c.ffn_dim, bias=False),
                nn.Linear(c.dim, c.ffn_dim, bias=False),
            )
            self.down = nn.Linear(c.ffn_dim, c.dim, bias=False)

        def rope(self, x, cos, sin):  # rotate-half pairing, as HF Llama
            x1, x2 = x[..., : self.d // 2], x[..., self.d // 2 :]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.n1(x)
            q = self.rope(self.wq(h).view(b, t, -1, self.d), cos, sin).transpose(1, 2)
            k = self.rope(self.wk(h).view(b, t, -1, self.d), cos, sin).transpose(1, 2)
            v = self.wv(h).view(b, t, -1, self.d).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.wo(a.transpose(1, 2).reshape(b, t, -1))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class TorchDecoder(nn.Module):
        def __init__(self, c) -> None:
            super().__init__()
            self.c = c
            self.embed = nn.Embedding(c.vocab_size, c.dim)
            self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
            self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
            self.heads = nn.ModuleList(
                nn.Linear(c.dim, c.vocab_size, bias=False) for _ in range(c.n_mtp_heads)
            )
            d = c.dim // c.n_heads
            inv = 1.0 / c.rope_theta ** (torch.arange(0, d // 2, dtype=torch.float32) * 2 / d)
            ang = torch.arange(c.context, dtype=torch.float32)[:, None] * inv[None]  # (T, D/2)
            self.register_buffer("cos", ang.cos()[:, None, :], persistent=False)
            self.register_buffer("sin", ang.sin()[:, None, :], persistent=False)

        def forward(self, tokens):
            t = tokens.shape[1]
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, self.cos[:t], self.sin[:t])
            h = self.norm(x)
            return [head(h) for head in self.heads]

    return TorchDecoder


def TorchDecoder(mcfg):
    return _torch_decoder_class()(mcfg)


def torch_step(model, params, opt, tokens, targets, k: int) -> float:
    import torch
    import torch.nn.functional as F

    t = tokens.shape[1]
    logits = model(tokens)  # K x (B, T, V); head i predicts targets[:, i : i + T]
    losses = [F.cross_entropy(z.flatten(0, 1), targets[:, i : i + t].flatten()) for i, z in enumerate(logits)]
    loss = sum(losses) / k
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss)


def time_it(fn, sync=lambda: None) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def bench_steps(args, device: str, precision: str, preset: str, batch: int) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        trainer = euler_trainer(args.data, preset, device, precision, batch, Path(tmp))
        mcfg, k = trainer.spec.mcfg, trainer.spec.mcfg.n_mtp_heads
        dev = "cuda" if device == "gpu" else "cpu"
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        model, params, opt = torch_model(mcfg, dev)
        sync = (lambda: torch.cuda.synchronize()) if dev == "cuda" else (lambda: None)
        from euler_train.signals import StopFlag

        stop, ours, ref = StopFlag(), [], []
        for step in range(args.warmup + args.reps):
            tokens, targets, _ = trainer.batches.train(step, 0)
            tt, ty = torch.as_tensor(tokens, device=dev), torch.as_tensor(targets, device=dev)
            a = time_it(lambda s=step: trainer.step_once(s, stop), sync)
            b = time_it(lambda tt=tt, ty=ty: torch_step(model, params, opt, tt, ty, k), sync)
            if step >= args.warmup:
                ours.append(a)
                ref.append(b)
        ntok = batch * mcfg.context
        mo, mr = statistics.median(ours), statistics.median(ref)
        out = {
            "preset": preset,
            "device": device,
            "precision": precision,
            "batch": batch,
            "context": mcfg.context,
            "ours_s": mo,
            "torch_s": mr,
            "ours_tok_s": ntok / mo,
            "torch_tok_s": ntok / mr,
            "ratio_ours_over_torch": mo / mr,
        }
        mfu = trainer.mfu(ntok / mo)
        if mfu is not None:
            out["ours_mfu"] = mfu
            out["torch_mfu"] = trainer.mfu(ntok / mr)
        return out


def bench_checkpoint(args, preset: str, overrides: dict) -> dict:
    import torch

    import euler_model
    from euler_train.checkpoint import CheckpointManager
    from euler_train.modelio import load_model, read_optimizer, write_model, write_optimizer

    mcfg = euler_model.preset(preset, **overrides)
    params = euler_model.init_params(mcfg, seed=0)
    moments = {f"{kind}.{n}": np.zeros_like(p) for kind in "mv" for n, p in params.items()}
    ours_w, ours_r, ref_w, ref_r = [], [], [], []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        mgr = CheckpointManager(Path(tmp) / "checkpoints", keep_last=1)
        state_t = {k: torch.from_numpy(v) for k, v in params.items()}
        moments_t = {k: torch.from_numpy(v) for k, v in moments.items()}

        def ours_write(step):
            mgr.save(
                step,
                lambda d: (write_model(d, mcfg, params, {}, None), write_optimizer(d, moments)),
                {"step": step},
            )

        def ours_read():
            folder = mgr.latest_valid()  # verifies every sha256
            load_model(folder)
            read_optimizer(folder)

        def ref_write():
            path = Path(tmp) / "ref.pt"
            torch.save({"model": state_t, "optim": moments_t}, path)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        for rep in range(args.reps):
            ours_w.append(time_it(lambda r=rep: ours_write(r)))
            ref_w.append(time_it(ref_write))
            ours_r.append(time_it(ours_read))
            ref_r.append(time_it(lambda: torch.load(Path(tmp) / "ref.pt")))
    mb = (sum(p.nbytes for p in params.values()) * 3) / 2**20
    return {
        "preset": preset,
        "overrides": overrides,
        "params": euler_model.count_params(mcfg),
        "MiB": mb,
        "ours_write_s": statistics.median(ours_w),
        "torch_write_s": statistics.median(ref_w),
        "ours_read_s": statistics.median(ours_r),
        "torch_read_s": statistics.median(ref_r),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("where", choices=["cpu", "gpu"])
    p.add_argument("--data", required=True)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tmp", default=None, help="folder for checkpoint files")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32"], help="gpu: one per run")
    p.add_argument("--checkpoint", action="store_true", help="gpu: also time checkpoints of the gpu preset")
    args = p.parse_args()
    results = []
    if args.where == "cpu":
        results.append(bench_steps(args, "cpu", "fp32", "tiny", 8))
        results.append(bench_steps(args, "cpu", "fp32", "small", 16))
        results.append(bench_checkpoint(args, "small", {}))
        results.append(bench_checkpoint(args, "gpu", {"n_layers": 4}))
    else:
        # one precision a run (--precision): the trainer computes in setup_device's Precision of it
        results.append(bench_steps(args, "gpu", args.precision, "gpu", 32))
        if args.checkpoint:
            results.append(bench_checkpoint(args, "gpu", {}))
    for r in results:
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
