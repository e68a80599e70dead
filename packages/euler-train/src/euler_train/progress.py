"""The progress bar: step, loss, tokens/s, MFU (GPU), validation loss and tqdm's ETA."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from euler_bpe.progress import progress_stream


class Progress:
    """A tqdm bar over optimizer steps; shows the throughput of the training step itself (evaluation and
    checkpoint time excluded), as measured by the trainer in each row."""

    def __init__(self, trainer: Any, total: int, enabled: bool = True) -> None:
        self.bar = None
        if enabled:
            self.bar = tqdm(
                total=total,
                initial=trainer.state.step,
                unit="step",
                dynamic_ncols=True,
                desc=trainer.spec.mode,
                file=progress_stream(),
            )

    def update(self, row: dict[str, Any]) -> None:
        """Refresh the bar with the row's loss, tokens/s, MFU and validation loss."""
        if self.bar is None:
            return
        post = {"loss": f"{row['loss']:.4f}", "tok/s": f"{row['tok_per_s']:,.0f}"}
        if "mfu" in row:
            post["mfu"] = f"{100 * row['mfu']:.1f}%"
        if "val_loss" in row:
            post["val"] = f"{row['val_loss']:.4f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
