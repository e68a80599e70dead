"""The progress bar: step, loss, tokens/s, MFU (GPU), ETA; also adds `tok_per_s` to each metrics row."""

from __future__ import annotations

import time
from typing import Any


class Progress:
    """A tqdm bar over optimizer steps; throughput is measured between consecutive updates."""

    def __init__(self, trainer: Any, total: int, enabled: bool = True) -> None:
        self.trainer = trainer
        self.last_time = time.perf_counter()
        self.last_tokens = trainer.state.tokens
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=trainer.state.step,
                unit="step",
                dynamic_ncols=True,
                desc=trainer.spec.mode,
            )

    def update(self, row: dict[str, Any]) -> None:
        """Add throughput (and MFU on GPU) to `row` and refresh the bar."""
        now = time.perf_counter()
        tokens = self.trainer.state.tokens
        rate = (tokens - self.last_tokens) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_tokens = now, tokens
        row["tok_per_s"] = rate
        mfu = self.trainer.mfu(rate)
        if mfu is not None:
            row["mfu"] = mfu
        if self.bar is not None:
            post = {"loss": f"{row['loss']:.4f}", "tok/s": f"{rate:,.0f}"}
            if "val_loss" in row:
                post["val"] = f"{row['val_loss']:.4f}"
            if mfu is not None:
                post["mfu"] = f"{100 * mfu:.1f}%"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
