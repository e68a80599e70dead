"""The euler CLI and its parts: run config, trainer, checkpoints, schedule.

>>> from euler_train import resolve_config, lr_at
>>> resolve_config("small").model["preset"], lr_at(0, 1.0, 0.1, 10, 100)
('small', 0.1)
"""

from euler_train.__about__ import __version__
from euler_train.checkpoint import CheckpointError, CheckpointManager
from euler_train.config import PRESETS, ConfigError, resolve_config
from euler_train.optimizer import AdamW
from euler_train.runspec import RunSpec, plan_run
from euler_train.schedule import lr_at
from euler_train.trainer import NonFiniteError, Trainer

__all__ = [
    "PRESETS",
    "AdamW",
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "NonFiniteError",
    "RunSpec",
    "Trainer",
    "__version__",
    "lr_at",
    "plan_run",
    "resolve_config",
]
