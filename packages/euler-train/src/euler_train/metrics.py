"""Run metrics: one JSON object per line in `RUN/metrics.jsonl`, optionally TensorBoard event files.

>>> import tempfile, pathlib
>>> run = pathlib.Path(tempfile.mkdtemp())
>>> with MetricsLogger(run, tensorboard=False) as log:
...     log.write({"step": 1, "loss": 2.5})
>>> read_metrics(run / "metrics.jsonl")
[{'step': 1, 'loss': 2.5}]
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every well-formed line of a metrics.jsonl (a torn last line after a crash is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_after(path: Path, step: int) -> None:
    """Drop lines with step > `step` (a resumed run rewrites what came after its checkpoint)."""
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Appends metrics rows; mirrors numbers to TensorBoard when tensorboardX is importable."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            truncate_after(self.path, resume_step)
        elif self.path.exists():
            self.path.unlink()
        self.file = open(self.path, "a", encoding="utf-8")
        self.tb = self._open_tensorboard(Path(run_dir) / "tensorboard") if tensorboard else None

    @staticmethod
    def _open_tensorboard(folder: Path) -> Any:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            return None
        return SummaryWriter(str(folder))

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (must hold `step`), flushed at once so a kill loses at most this line."""
        self.file.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self.file.flush()
        if self.tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(key, value, row["step"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
