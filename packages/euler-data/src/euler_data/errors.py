"""The one error type the pipeline raises for bad input: it names the file and the problem."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input that stops a stage, e.g. ``DataError("books.parquet", "no 'text' column")``.

    ``str(err)`` is one line, ``"<where>: <problem>"``, which the CLI prints before exiting non-zero.
    """

    def __init__(self, where: str, problem: str) -> None:
        self.where = str(where)
        self.problem = " ".join(str(problem).split())  # one line, always
        super().__init__(f"{self.where}: {self.problem}")
