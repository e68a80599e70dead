"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

>>> lr_at(0, lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=100)
0.1
>>> round(lr_at(99, lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=100), 4)
0.1
"""

from __future__ import annotations

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based) of `total_steps`.

    Warmup rises linearly to `lr` at step `warmup_steps - 1`; the cosine then falls from `lr` to
    `min_lr`, reaching it at the last step.
    """
    if step < 0 or total_steps < 1:
        raise ValueError(f"lr_at: need step >= 0 and total_steps >= 1, got step={step}, total={total_steps}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps - 1
    if decay_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup_steps) / decay_steps)  # 0 at the end of warmup, 1 at the last step
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
