"""`loss.png`: train and validation loss curves from metrics.jsonl (matplotlib, Agg backend); and several
runs overlaid on shared axes, with a text comparison of their final values.

>>> # plot_metrics("runs/tiny/metrics.jsonl", "runs/tiny/loss.png")
>>> # plot_runs(["runs/euler", "runs/torch"], "compare.png", labels=["euler", "pytorch"])
>>> compare_text({"a": [{"step": 9, "val_bpb": 2.5}], "b": [{"step": 9, "val_bpb": 2.4}]}).splitlines()[-1]
'val bpb at the end: b - a = -0.100000'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from euler_train.checkpoint import write_file
from euler_train.metrics import read_metrics


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold a numeric `key`."""
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def metrics_path(run: str | Path) -> Path:
    """A run folder's metrics.jsonl, or the path itself when it names a file."""
    run = Path(run)
    if not run.exists():
        raise ValueError(f"{run} does not exist (expected a run folder or its metrics.jsonl)")
    return run / "metrics.jsonl" if run.is_dir() else run


def _pyplot() -> Any:
    # start-up: importing matplotlib and pyplot costs over a second; only drawing needs them (Agg first)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(metrics_path: str | Path, out_path: str | Path, title: str | None = None) -> Path:
    """Draw train loss and val loss (and val bits per byte on a second axis) against step."""
    plt = _pyplot()
    rows = read_metrics(metrics_path)
    if not rows:
        raise ValueError(f"plot_metrics: no metrics in {metrics_path}")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for key, style in (("loss", "-"), ("val_loss", "o-")):
        steps, values = series(rows, key)
        if steps:
            ax.plot(steps, values, style, label="train loss" if key == "loss" else "val loss", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    steps, bpb = series(rows, "val_bpb")
    if steps:
        ax2 = ax.twinx()
        ax2.plot(steps, bpb, "s--", color="tab:green", label="val bits/byte", markersize=3)
        ax2.set_ylabel("bits per byte")
        ax2.legend(loc="upper center")
    ax.legend(loc="upper right")
    ax.set_title(title or str(Path(metrics_path).parent.name))
    fig.tight_layout()
    try:
        return write_file(out_path, fig.savefig)  # a failure keeps the old picture; OSError: one line
    finally:
        plt.close(fig)


def read_runs(runs: list[str | Path], labels: list[str] | None = None) -> dict[str, list[dict]]:
    """{label: rows} in the given order; labels default to the run folders' names (made unique)."""
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    out: dict[str, list[dict]] = {}
    for i, run in enumerate(runs):
        path = metrics_path(run)
        rows = read_metrics(path)
        if not rows:
            raise ValueError(f"no metrics in {path}")
        label = labels[i] if labels is not None else path.parent.name or str(path)
        while label in out:
            label += f"#{i}"
        out[label] = rows
    return out


def plot_runs(
    runs: list[str | Path], out_path: str | Path, labels: list[str] | None = None, title: str | None = None
) -> Path:
    """Several runs on shared axes: train loss (left) and val bits per byte (right; val loss when no run
    has bits per byte), one colour per run."""
    plt = _pyplot()
    data = read_runs(runs, labels)
    val_key = "val_bpb" if any(series(rows, "val_bpb")[0] for rows in data.values()) else "val_loss"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100, sharex=True)
    for i, (label, rows) in enumerate(data.items()):
        colour, dash = f"C{i}", ("-", "--", ":", "-.")[i % 4]  # dashes keep identical curves both visible
        left.plot(*series(rows, "loss"), dash, color=colour, label=label, linewidth=1)
        steps, values = series(rows, val_key)
        if steps:
            right.plot(steps, values, "o" + dash, color=colour, label=label, markersize=3)
    left.set_ylabel("train loss (nats/token)")
    right.set_ylabel("val bits per byte" if val_key == "val_bpb" else "val loss (nats/token)")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    fig.suptitle(title or " vs ".join(data))
    fig.tight_layout()
    try:
        return write_file(out_path, fig.savefig)  # a failure keeps the old picture; OSError: one line
    finally:
        plt.close(fig)


def val_summary(rows: list[dict]) -> str | None:
    """The last evaluation in words: head 0's (next-token) val loss, and val bits per byte when measured;
    None when no row holds one.

    >>> val_summary([{"step": 30, "val_loss": 4.4812, "val_next_loss": 2.1134, "val_bpb": 2.1702}])
    'val loss 2.1134 (next token), 2.1702 bits per byte'
    """
    last = next((r for r in reversed(rows) if isinstance(r.get("val_next_loss"), (int, float))), None)
    if last is None:
        return None
    bpb = last.get("val_bpb")
    return f"val loss {last['val_next_loss']:.4f} (next token)" + (
        f", {bpb:.4f} bits per byte" if isinstance(bpb, (int, float)) else ""
    )


def _final(rows: list[dict], key: str) -> tuple[int, float] | None:
    steps, values = series(rows, key)
    return (steps[-1], values[-1]) if steps else None


def compare_text(data: dict[str, list[dict]]) -> str:
    """One line per run (last step, final train loss, val loss, val bpb, median tokens/s of the logged
    steps), then each run's final val bpb (val loss when a run lacks bpb) minus the first run's."""
    lines = []
    for label, rows in data.items():
        parts = [f"{label}: step {rows[-1].get('step')}"]
        for key, name in (("loss", "train loss"), ("val_loss", "val loss"), ("val_bpb", "val bpb")):
            last = _final(rows, key)
            if last is not None:
                parts.append(f"{name} {last[1]:.4f}" + (f" (step {last[0]})" if key != "loss" else ""))
        speeds = sorted(series(rows, "tok_per_s")[1])
        if speeds:
            parts.append(f"median {speeds[len(speeds) // 2]:,.0f} tok/s")
        lines.append(", ".join(parts))
    labels = list(data)
    key = "val_bpb" if all(_final(r, "val_bpb") for r in data.values()) else "val_loss"
    base = _final(data[labels[0]], key)
    for label in labels[1:]:
        other = _final(data[label], key)
        if base is not None and other is not None:
            name = "val bpb" if key == "val_bpb" else "val loss"
            lines.append(f"{name} at the end: {label} - {labels[0]} = {other[1] - base[1]:+.6f}")
    return "\n".join(lines)
