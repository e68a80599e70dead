"""A DuckDB data pipeline from raw books, web text and instructions to token shards."""

from euler_data.__about__ import __version__

__all__ = ["__version__"]
