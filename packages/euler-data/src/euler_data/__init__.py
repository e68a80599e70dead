"""A DuckDB data pipeline from raw books, web text and instructions to token shards.

>>> from euler_data import PretrainLoader, read_meta  # doctest: +SKIP
>>> tokens, targets = PretrainLoader("data/mix", context=128, extra_targets=4, batch_size=8).batch(0)
"""

from euler_data.__about__ import __version__
from euler_data.chat import CHAT_TEMPLATE, alpaca_messages, encode_chat, render_chat
from euler_data.dataset_folder import folder_kind, replace_files
from euler_data.errors import DataError
from euler_data.folder_lock import LOCK_FILE, FolderBusy, FolderUnwritable, hold_folder, unwritable
from euler_data.loaders import PrefsLoader, PretrainLoader, SFTLoader, pair_rows
from euler_data.meta import read_meta, split_paths
from euler_data.prefs import build_prefs, read_prefs
from euler_data.recipe import FilterConfig, Recipe, SourceSpec, load_recipe
from euler_data.sft import build_sft, read_chat_examples


def prepare(*args, **kwargs):
    """``euler_data.pipeline.prepare``."""
    # start-up: the pipeline pulls in DuckDB, slow to import, which the loaders and read_meta do not need
    from euler_data.pipeline import prepare as _prepare

    return _prepare(*args, **kwargs)


__all__ = [
    "CHAT_TEMPLATE",
    "LOCK_FILE",
    "DataError",
    "FilterConfig",
    "FolderBusy",
    "FolderUnwritable",
    "PrefsLoader",
    "PretrainLoader",
    "Recipe",
    "SFTLoader",
    "SourceSpec",
    "__version__",
    "alpaca_messages",
    "build_prefs",
    "build_sft",
    "encode_chat",
    "folder_kind",
    "hold_folder",
    "load_recipe",
    "pair_rows",
    "prepare",
    "read_chat_examples",
    "read_meta",
    "read_prefs",
    "render_chat",
    "replace_files",
    "split_paths",
    "unwritable",
]
