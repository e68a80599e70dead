"""The README's shell blocks, run as written, in order, in one folder, through the installed console scripts,
so that the documented flow cannot drift from what the tools accept.

The one change: `euler-train pretrain`, `sft` and `dpo` lines get `--steps 12 --no-progress` appended
(argparse keeps the last value), so the flow takes a minute instead of a quarter of an hour. The quick
start's block (hatch) is what `.ci/run` itself runs. Inputs the README calls the user's own (a folder of
blobs, a HellaSwag file) are made here; the data mirror stands beside the folder as `../shared/data`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_pipeline import tool

pytestmark = [pytest.mark.data, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"
TOOLS = ("euler-bpe", "euler-data", "euler-train")
QUICK = ["--steps", "12", "--no-progress"]


def readme_commands() -> list[list[str]]:
    """Every command line of the README's bash blocks but the quick start's, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    lines = [line for block in blocks if "hatch" not in block for line in block.splitlines()]
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def user_inputs(work: Path) -> None:
    """What the README expects the user to bring: a folder of files for byte mode, a HellaSwag file."""
    blobs = work / "blobs"
    blobs.mkdir()
    (blobs / "notes.txt").write_text("To be, or not to be, that is the question.\n" * 40, encoding="utf-8")
    (blobs / "table.bin").write_bytes(bytes(range(256)) * 8)
    item = {"ctx": "ROMEO: I will", "endings": [" go.", " the.", " of of", " and and"], "label": 0}
    (work / "hellaswag_val.jsonl").write_text(json.dumps(item) + "\n", encoding="utf-8")


def test_the_readme_commands_run_as_written(tmp_path, mirror) -> None:
    commands = readme_commands()
    assert [c[0] for c in commands][:2] == ["euler-data", "euler-data"] and len(commands) >= 15
    assert all(c[0] in TOOLS for c in commands), [c[0] for c in commands]
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(mirror)
    user_inputs(work)
    env = dict(os.environ, PYTHONUNBUFFERED="1", EULER_DATA_MIRROR=str(mirror))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for argv in commands:
        training = (["euler-train", "pretrain"], ["euler-train", "sft"], ["euler-train", "dpo"])
        extra = QUICK if argv[:2] in training else []
        proc = subprocess.run(
            [tool(argv[0]), *argv[1:], *extra],
            cwd=work,
            input="What is the capital of France?\n",  # chat reads its turns from stdin, then EOF ends it
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        shown = shlex.join(argv)
        assert proc.returncode == 0, (
            f"{shown}: exit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
        )
        assert "Traceback" not in proc.stderr, f"{shown}\n{proc.stderr}"
    assert (work / "runs" / "small" / "report.md").is_file() and (
        work / "hf" / "chat" / "config.json"
    ).is_file()
