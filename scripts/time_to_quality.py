"""Time to quality: how many minutes of training an optimizer needs to reach a validation bits per byte.

    python scripts/time_to_quality.py --optimizer muon --target-bpb 1.480            # the GPU recipe
    python scripts/time_to_quality.py --optimizer adamw --target-bpb 1.480 --data runs/data/gpu
    python scripts/time_to_quality.py --preset small --recipe tinyshakespeare --target-bpb 2.17 --device cpu

Prepares the recipe's data if DATA holds none (euler-data prepare, from the mirror or the network), trains
with `euler-train pretrain` (evaluating every --eval-every steps), then reads the run's metrics.jsonl and
prints the first evaluation at or below the target: its step, the wall minutes of training up to it (the
`elapsed_s` of that row: steps, evaluations and checkpoints), and the final val bpb. Extra arguments after
`--` go to euler-train unchanged (e.g. `-- --set train.muon_lr=0.03`). Exit code 0 when the target was
reached, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"gpu": ROOT / "docs" / "results" / "gpu_pretrain_recipe.toml"}


def tool(name: str) -> list[str]:
    """A console script of the installed packages (beside this interpreter, else on PATH)."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return [str(local)]
    module = {"euler-data": "euler_data.cli", "euler-train": "euler_train.cli"}[name]
    return [shutil.which(name)] if shutil.which(name) else [sys.executable, "-m", module]


def prepare(data: Path, recipe: str, mirror: str | None) -> None:
    if (data / "train.bin").is_file():
        print(f"time_to_quality: using the dataset in {data}", file=sys.stderr)
        return
    source = ["--recipe", str(RECIPES[recipe])] if recipe in RECIPES else ["--source", recipe]
    cmd = [*tool("euler-data"), "prepare", *source, "--out", str(data), "--quiet"]
    cmd += ["--mirror", mirror] if mirror else []
    cmd += [] if recipe in RECIPES else ["--vocab-size", "512", "--context", "128"]
    print(f"time_to_quality: {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(cmd, check=True)


def first_at_target(rows: list[dict], target: float) -> dict | None:
    """The first evaluation row whose val_bpb is at or below the target."""
    return next((r for r in rows if "val_bpb" in r and r["val_bpb"] <= target), None)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=["adamw", "muon"], required=True)
    p.add_argument("--target-bpb", type=float, required=True, help="validation bits per byte to reach")
    p.add_argument("--preset", default="gpu", choices=["tiny", "small", "gpu"])
    p.add_argument(
        "--recipe", default="gpu", help='"gpu" (docs/results/gpu_pretrain_recipe.toml) or a source'
    )
    p.add_argument("--data", default=None, help="dataset folder (default: runs/data/RECIPE)")
    p.add_argument("--mirror", default=None, help="data mirror for prepare (default: EULER_DATA_MIRROR)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    p.add_argument("--out", default=None, help="run folder (default: runs/ttq-OPTIMIZER; replaced)")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    data = Path(args.data or f"runs/data/{Path(args.recipe).stem}")
    out = Path(args.out or f"runs/ttq-{args.optimizer}")
    prepare(data, args.recipe, args.mirror)
    cmd = [*tool("euler-train"), "pretrain", "--preset", args.preset, "--data", str(data), "--out", str(out)]
    cmd += ["--optimizer", args.optimizer, "--steps", str(args.steps), "--eval-every", str(args.eval_every)]
    cmd += ["--device", args.device, "--ckpt-every", "0", "--overwrite", "--no-progress", *extra]
    print(f"time_to_quality: {' '.join(cmd)}", file=sys.stderr)
    code = subprocess.run(cmd).returncode
    if code != 0:
        print(f"time_to_quality: euler-train exited {code}", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_bpb" in r]
    hit = first_at_target(rows, args.target_bpb)
    summary = {
        "optimizer": args.optimizer,
        "target_bpb": args.target_bpb,
        "reached": hit is not None,
        "step": hit["step"] if hit else None,
        "minutes": round(hit["elapsed_s"] / 60, 3) if hit else None,
        "final_val_bpb": evals[-1]["val_bpb"] if evals else None,
        "total_minutes": round(rows[-1]["elapsed_s"] / 60, 3),
        "curve": [(r["step"], round(r["val_bpb"], 4), round(r["elapsed_s"], 1)) for r in evals],
    }
    print(json.dumps(summary))
    when = f"step {hit['step']}, {summary['minutes']} min" if hit else "not reached"
    print(f"time_to_quality: {args.optimizer} to val bpb <= {args.target_bpb}: {when}", file=sys.stderr)
    return 0 if hit else 1


if __name__ == "__main__":
    sys.exit(main())
