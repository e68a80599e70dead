"""metrics.jsonl writing, resume truncation, and the loss plot."""

from __future__ import annotations

import json
import math

from euler_train.metrics import MetricsLogger, read_metrics, truncate_after
from euler_train.plot import plot_metrics, series


def test_rows_are_json_lines_and_non_finite_values_become_strings(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.write({"step": 1, "loss": 2.5})
        log.write({"step": 2, "loss": math.nan, "skipped": True})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 1, "loss": 2.5}
    assert json.loads(lines[1]) == {"step": 2, "loss": "nan", "skipped": True}


def test_a_torn_last_line_is_skipped(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 1.0}]


def test_resume_truncates_rows_after_the_checkpoint_and_a_fresh_run_starts_empty(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for s in range(1, 6):
            log.write({"step": s, "loss": float(s)})
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as log:
        log.write({"step": 4, "loss": 40.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]
    with MetricsLogger(tmp_path, tensorboard=False):
        pass
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_truncate_after_keeps_only_earlier_steps(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    truncate_after(path, 1)
    assert read_metrics(path) == [{"step": 1}]


def test_plot_writes_a_png_with_train_and_val_curves(tmp_path) -> None:
    rows = [{"step": s, "loss": 5.0 - 0.1 * s} for s in range(1, 21)]
    rows[9].update(val_loss=4.2, val_bpb=3.1)
    rows[19].update(val_loss=3.4, val_bpb=2.6)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert series(rows, "val_loss") == ([10, 20], [4.2, 3.4])


def test_tensorboard_gets_every_numeric_value_when_its_writer_is_installed(tmp_path, monkeypatch) -> None:
    import sys
    import types

    written = []

    class Writer:
        def __init__(self, logdir):
            self.logdir = logdir

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def close(self):
            written.append("closed")

    monkeypatch.setitem(sys.modules, "tensorboardX", types.SimpleNamespace(SummaryWriter=Writer))
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        assert log.tb.logdir == str(tmp_path / "tensorboard")
        log.write({"step": 3, "loss": 1.5, "skipped": True, "note": "x"})
    assert written == [("loss", 1.5, 3), "closed"]
