"""What a run folder holds, so that a new run never mixes with an old one: starting a run in a folder
that already holds one needs --resume (continue it) or --overwrite (delete it first).

>>> import tempfile
>>> run = Path(tempfile.mkdtemp())
>>> describe_run(run) is None
True
>>> _ = (run / "metrics.jsonl").write_text('{"step": 1}\\n{"step": 2}\\n')
>>> describe_run(run)
'metrics.jsonl (2 rows, up to step 2)'
"""

from __future__ import annotations

import shutil
from pathlib import Path

from euler_train.checkpoint import step_of
from euler_train.metrics import read_metrics

# Everything a pretrain or sft writes into its run folder (--overwrite removes exactly these).
RUN_FILES = (
    "config.toml",
    "metrics.jsonl",
    "checkpoints",
    "loss.png",
    "tensorboard",
    "report.md",
    "evals.jsonl",
)


def describe_run(run_dir: Path) -> str | None:
    """What of a run `run_dir` holds, in a few words, or None when it holds none of a run's files."""
    parts = []
    ckpt = run_dir / "checkpoints"
    steps = sorted(s for s in (step_of(p) for p in ckpt.iterdir()) if s >= 0) if ckpt.is_dir() else []
    if steps:
        parts.append(f"checkpoints of steps {', '.join(map(str, steps))}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    if rows:
        parts.append(f"metrics.jsonl ({len(rows)} rows, up to step {rows[-1].get('step', '?')})")
    parts += [name for name in RUN_FILES if name not in ("checkpoints", "metrics.jsonl")]
    parts = [p for p in parts if p not in RUN_FILES or (run_dir / p).exists()]
    return "; ".join(parts) or None


def clear_run(run_dir: Path) -> None:
    """Delete a run's files from `run_dir` (other files in the folder are left alone)."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
