"""The README's quick start on a machine with no network and no data mirror: it trains on the Tiny
Shakespeare shipped inside euler-data (no `data` marker: this test needs no mirror)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests.e2e.test_pipeline import run


@pytest.mark.slow
def test_quickstart_runs_offline_without_a_mirror_on_the_embedded_data(tmp_path) -> None:
    """No network, no mirror: the README's quick start trains on the Tiny Shakespeare shipped inside
    euler-data, byte-identical to the canonical file."""
    env = {k: v for k, v in os.environ.items() if k != "EULER_DATA_MIRROR"}
    env.update(PYTHONUNBUFFERED="1", EULER_DATA_OFFLINE="1")
    out = tmp_path / "qs"
    proc = run("euler-train", "quickstart", "--out", str(out), "--preset", "tiny", "--steps", "6", env=env)
    assert proc.stdout.count("--- sample") == 3 and (out / "run" / "checkpoints" / "step_6").is_dir()
    (unpacked,) = (out / "data" / "downloads").glob("embedded-tinyshakespeare-*")
    digest = hashlib.sha256(unpacked.read_bytes()).hexdigest()
    assert digest == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["documents_kept"] == 1 and meta["tokens"]["train"] > 200_000
