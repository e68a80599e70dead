"""`loss.png`: train and validation loss curves from metrics.jsonl (matplotlib, Agg backend).

>>> # plot_metrics("runs/tiny/metrics.jsonl", "runs/tiny/loss.png")
"""

from __future__ import annotations

from pathlib import Path

from euler_train.metrics import read_metrics


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold a numeric `key`."""
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def plot_metrics(metrics_path: str | Path, out_path: str | Path, title: str | None = None) -> Path:
    """Draw train loss and val loss (and val bits per byte on a second axis) against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    out_path = Path(out_path)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
