"""The communicator's interface, and the world of one process (every collective is the identity).

`distributed.NcclComm` (GPUs) and `socket_comm.SocketComm` (CPU processes) are the real worlds.

>>> comm = Comm()
>>> comm.rank, comm.world_size, comm.is_main, comm.allreduce_scalars([1.5, 2.0])
(0, 1, True, [1.5, 2.0])
"""

from __future__ import annotations

from typing import Any

EXIT_LOST_RANK = 4  # the exit code of a rank that stops because another rank died or fell silent


class CommError(RuntimeError):
    """A collective cannot finish: another rank died (its connection closed) or sent nothing in time."""


class Comm:
    """World of one process: collectives return their input."""

    rank = 0
    world_size = 1
    local_rank = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def allreduce_grads(self, grads: dict[str, Any]) -> None:
        """Sum gradients over ranks, in place (identity here)."""

    def allreduce_scalars(self, values: list[float]) -> list[float]:
        """Sum a few floats over ranks (identity here)."""
        return list(values)

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for here)."""

    def close(self) -> None:
        """Release the communicator."""
