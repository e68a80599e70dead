"""euler-train reads a dataset whose train split euler-data wrote as shards (meta.json lists them)."""

from __future__ import annotations

import json

from euler_data.cli import main as euler_data
from euler_train.cli import main
from euler_train.metrics import read_metrics


def test_pretrain_on_a_sharded_train_split(tmp_path, corpus) -> None:
    data = tmp_path / "sharded"
    argv = ["prepare", "--source", f"{corpus}::paragraph", "--vocab-size", "300", "--min-chars", "40"]
    assert (
        euler_data([*argv, "--shard-tokens", "20000", "--out", str(data), "--quiet", "--workers", "1"]) == 0
    )
    shards = json.loads((data / "meta.json").read_text())["shards"]["train"]
    assert len(shards) > 1 and not (data / "train.bin").exists()
    run = tmp_path / "run"
    pre = ["pretrain", "--data", str(data), "--out", str(run), "--steps", "3", "--no-progress"]
    assert main([*pre, "--set", "model.context=32"]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
