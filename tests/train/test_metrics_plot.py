"""metrics.jsonl writing, resume truncation, and the loss plot."""

from __future__ import annotations

import json
import math

from euler_train.cli import main
from euler_train.metrics import MetricsLogger, read_metrics, truncate_after
from euler_train.plot import compare_text, plot_metrics, plot_runs, read_runs, series


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


def write_run(folder, val_bpb: float, shift: float = 0.0):
    """A run folder whose metrics.jsonl has 20 train rows and evaluations at steps 10 and 20."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "loss": 5.0 - 0.1 * s + shift, "tok_per_s": 1000.0 * s} for s in range(1, 21)]
    rows[9].update(val_loss=4.2 + shift, val_bpb=val_bpb + 0.5)
    rows[19].update(val_loss=3.4 + shift, val_bpb=val_bpb)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_several_runs_overlay_on_shared_axes_and_compare_their_final_bpb(tmp_path) -> None:
    a, b = write_run(tmp_path / "a", 2.60), write_run(tmp_path / "b", 2.61, shift=0.01)
    out = plot_runs([a, b / "metrics.jsonl"], tmp_path / "cmp.png", labels=["euler", "pytorch"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = compare_text(read_runs([a, b], ["euler", "pytorch"]))
    lines = text.splitlines()
    assert lines[0].startswith("euler: step 20, train loss 3.0000") and "val bpb 2.6000" in lines[0]
    assert lines[0].endswith("val bpb 2.6000 (step 20), median 11,000 tok/s")
    assert lines[1].startswith("pytorch: step 20") and "val bpb 2.6100" in lines[1]
    assert lines[2] == "val bpb at the end: pytorch - euler = +0.010000"


def test_runs_without_bpb_compare_val_loss_and_default_labels_are_folder_names(tmp_path) -> None:
    a, b = tmp_path / "x" / "one", tmp_path / "y" / "one"  # the same folder name twice
    for folder, val in ((a, 3.0), (b, 2.5)):
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 4.0, "val_loss": val}) + "\n")
    data = read_runs([a, b])
    assert list(data) == ["one", "one#1"]
    assert compare_text(data).splitlines()[-1] == "val loss at the end: one#1 - one = -0.500000"
    assert plot_runs([a, b], tmp_path / "c.png").is_file()


def test_plot_command_takes_several_runs_and_keeps_the_single_run_default(tmp_path, capsys) -> None:
    a, b = write_run(tmp_path / "a", 2.60), write_run(tmp_path / "b", 2.70)
    assert main(["plot", str(a)]) == 0
    assert (a / "loss.png").is_file() and capsys.readouterr().out.strip() == str(a / "loss.png")
    out = tmp_path / "both.png"
    assert main(["plot", str(a), str(b), "--labels", "euler,pytorch", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "val bpb at the end: pytorch - euler = +0.100000" in printed and out.is_file()
    assert main(["plot", str(a), str(b)]) == 0 and (a / "compare.png").is_file()
    assert main(["plot", str(a), str(b), "--labels", "only-one"]) == 2
    assert "2 runs" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
