"""`RUN/report.md`: one page on a run, written when `pretrain`, `sft` or `dpo` finishes and by
`euler-train report`.

Sections: the config (config.toml); the data (the dataset's meta.json, sft_meta.json and
prefs_meta.json: documents, bytes and tokens per split, drops by reason, sources); training (steps,
tokens seen, wall time, tokens/s and MFU from metrics.jsonl); the loss (loss.png, the validation rows,
the final val bpb); a dpo run's preference statistics; the evaluations that `euler-train eval` appended
to RUN/evals.jsonl, and for a tuned run (sft, dpo) those of the run it started from, so that an
evaluation before and after stand together; samples from the newest checkpoint (a pretrained model: one
greedy and two seeded continuations of a document start; a tuned model: greedy replies to held-out
prompts).

>>> fence("a ``` b")
'````'
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

from euler_data import read_meta
from euler_data.dataset_folder import PREFS_META
from euler_data.errors import DataError
from euler_data.prefs import read_prefs
from euler_data.sft import SFT_META
from euler_train.checkpoint import CheckpointError, read_state, write_file
from euler_train.config import ConfigError, recorded_config, run_section
from euler_train.evals.chat import greedy_reply, reply_start, val_examples
from euler_train.evals.command import EVALS, metrics_text
from euler_train.metrics import read_metrics
from euler_train.modelio import resolve_checkpoint
from euler_train.sampling import (
    END,
    EOT,
    SamplingModel,
    for_terminal,
    load_for_sampling,
    stop_ids,
    stream_ids,
)

REPORT = "report.md"
SAMPLE_TOKENS = 64  # new tokens per sample (fewer when the context leaves less room)
SEEDS = (0, 1)  # seeded samples of a pretrained model, beside the greedy one
VAL_ROWS = 12  # validation rows shown in the loss section (evenly spaced, the last always)


def write_report(run_dir: str | Path, device: str = "cpu") -> Path:
    """Write RUN/report.md (the samples run on `device`; the old report stays until the new one is
    whole); returns its path."""
    run = Path(run_dir)
    if not (run / "config.toml").is_file():
        raise ConfigError(f"{run} is not a run folder (no config.toml)")
    text = report_text(run, device)
    return write_file(run / REPORT, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def report_text(run: Path, device: str = "cpu") -> str:
    cfg, history = recorded_config(run / "config.toml")
    rows = read_metrics(run / "metrics.jsonl")
    try:
        checkpoint = resolve_checkpoint(run)
        state = read_state(checkpoint)
    except CheckpointError as err:
        checkpoint, state = None, {"error": str(err)}
    parts = [
        f"# Run report: {run.name}",
        f"Written {time.strftime('%Y-%m-%d %H:%M')} from `{run}`; newest checkpoint: "
        + (f"`{checkpoint.name}`" if checkpoint else f"none ({state['error']})")
        + f"; mode {state.get('mode', '?')}.",
        config_section(run, history),
        data_section(cfg, state.get("mode", "?")),
        training_section(run, rows, state),
        loss_section(run, rows),
        preference_section(rows),
        evals_section(run, cfg),
        samples_section(checkpoint, state, cfg, device),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def config_section(run: Path, history: list[dict[str, Any]]) -> str:
    """config.toml, and the changes --resume made to it (its `history`), each with the step it holds from."""
    text = "## Config\n\n`config.toml` (the resolved run config):\n\n```toml\n" + (
        (run / "config.toml").read_text(encoding="utf-8").strip() + "\n```"
    )
    if not history:
        return text
    rows = [[c.get("step"), c.get("key"), c.get("was"), c.get("now")] for c in history]
    changed = table(["from step", "key", "before", "after"], rows)
    return f"{text}\n\nChanged on --resume (the config above holds the values after):\n\n{changed}"


def cell(value: Any) -> str:
    """A Markdown table cell: numbers with thousands separators, pipes escaped."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def drops(dropped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in dropped.items()) or "none"


def data_section(cfg: dict[str, Any], mode: str) -> str:
    """The data accounting of data.dir: meta.json (pretrain set), sft_meta.json (SFT set) and
    prefs_meta.json (preference set)."""
    folder = Path(cfg.get("data", {}).get("dir") or "")
    init = cfg.get("data", {}).get("init")
    out = [f"## Data\n\n`{folder}`" + (f" ({mode} from `{init}`)" if init else "")]
    if not folder.is_dir():
        return out[0] + f": not found from {Path.cwd()}; no data accounting."
    if (folder / "meta.json").is_file():
        out.append(pretrain_data(folder))
    if (folder / SFT_META).is_file():
        out.append(side_set_data(folder, SFT_META, "SFT set", "examples", "response tokens"))
    if (folder / PREFS_META).is_file():
        out.append(side_set_data(folder, PREFS_META, "Preference set", "pairs", "reply tokens"))
    return "\n\n".join(
        out if len(out) > 1 else [*out, "No meta.json, sft_meta.json or prefs_meta.json there."]
    )


def pretrain_data(folder: Path) -> str:
    """meta.json: documents kept and dropped, counts per split, and per source."""
    try:
        meta = read_meta(folder)
    except DataError as err:
        return f"meta.json: {err}"
    docs, nbytes, tokens = (meta.get(key, {}) for key in ("documents", "bytes", "tokens"))
    splits = [
        [s, docs.get(s), nbytes.get(s), tokens.get(s), nbytes.get(s, 0) / max(tokens.get(s, 0), 1)]
        for s in ("train", "val")
    ]
    sources = [
        [
            name,
            src.get("spec"),
            src.get("weight"),
            f"{src.get('documents_kept', 0):,} / {src.get('documents_in', 0):,}",
        ]
        + [src.get(s, {}).get("tokens", 0) for s in ("train", "val")]
        + [drops(src.get("dropped", {}))]
        for name, src in meta.get("sources", {}).items()
    ]
    head = (
        f"Pretraining set (meta.json): {meta.get('documents_kept', 0):,} of {meta.get('documents_in', 0):,} "
        f"documents kept; dropped: {drops(meta.get('dropped', {}))}; tokenizer {meta.get('tokenizer')} "
        f"({meta.get('vocab_size')} tokens)."
    )
    columns = ["source", "spec", "weight", "kept / in", "train tokens", "val tokens", "dropped"]
    split_table = table(["split", "documents", "bytes", "tokens", "bytes/token"], splits)
    return "\n\n".join([head, split_table, table(columns, sources)])


def side_set_data(folder: Path, record: str, title: str, unit: str, reply: str) -> str:
    """An SFT or preference set's record (sft_meta.json, prefs_meta.json): its `unit`s (examples, pairs)
    kept and dropped, counts per split."""
    meta = json.loads((folder / record).read_text(encoding="utf-8"))
    splits = [
        [s, *(meta.get(s, {}).get(key) for key in (unit, "tokens", "response_tokens"))]
        for s in ("train", "val")
    ]
    kept, seen = meta.get(f"{unit}_kept", 0), meta.get(f"{unit}_in", 0)
    head = (
        f"{title} ({record}): {kept:,} of {seen:,} {unit} kept; dropped: "
        f"{drops(meta.get('dropped', {}))}; longest {meta.get('longest_tokens')} tokens."
    )
    return head + "\n\n" + table(["split", unit, "tokens", reply], splits)


PREFERENCE_KEYS = (
    "reward_accuracy",
    "preference",
    "reference_preference",
    "margin",
    "dpo_loss",
    "chosen_logp",
    "rejected_logp",
)


def preference_section(rows: list[dict[str, Any]]) -> str:
    """A dpo run's evaluations: on held-out (val) and training pairs, the reward accuracy (the share of
    pairs whose implicit reward prefers the chosen reply), the mean margin, the DPO loss and the policy's
    mean log-probabilities of the chosen and rejected replies; '' for other runs."""
    evals = [r for r in rows if isinstance(r.get("val_reward_accuracy"), (int, float))]
    if not evals:
        return ""
    keys = [f"{split}_{key}" for key in PREFERENCE_KEYS for split in ("val", "train")]
    body = table(["step", *keys], [[r["step"], *(r.get(k, "") for k in keys)] for r in evals])
    last = evals[-1]
    return (
        f"## Preferences\n\nAt step {last['step']}: held-out reward accuracy "
        f"**{last['val_reward_accuracy']:.3f}** (train {last['train_reward_accuracy']:.3f}), mean margin "
        f"{last['val_margin']:.3f}; the chosen reply more likely per token under the tuned model "
        f"{last['val_preference']:.3f} of the time, under the starting one "
        f"{last['val_reference_preference']:.3f}.\n\n{body}"
    )


def training_section(run: Path, rows: list[dict[str, Any]], state: dict[str, Any]) -> str:
    """Steps, tokens seen, wall time and throughput."""
    speeds = [r["tok_per_s"] for r in rows if isinstance(r.get("tok_per_s"), (int, float))]
    mfus = [r["mfu"] for r in rows if isinstance(r.get("mfu"), (int, float))]
    tokens = f"{state['tokens']:,}" if "tokens" in state else "unknown (no checkpoint)"
    lines = [
        "## Training",
        "",
        f"- steps: {state.get('step', '?')} ({state.get('skipped', 0)} skipped for a non-finite loss or "
        f"gradient), {state.get('world_size', 1)} process(es)",
        f"- tokens seen: {tokens}",
    ]
    if "time" in state:
        wall = state["time"] - (run / "config.toml").stat().st_mtime
        since = "from config.toml, written at the start or at the last --resume, to the newest checkpoint"
        lines.append(f"- wall time: {wall:,.1f} s ({since})")
    if speeds:
        lines.append(
            f"- throughput of the training step: median {statistics.median(speeds):,.0f} tokens/s over "
            f"{len(speeds)} logged steps (last {speeds[-1]:,.0f})"
        )
    if mfus:
        lines.append(f"- MFU: median {100 * statistics.median(mfus):.1f}% (last {100 * mfus[-1]:.1f}%)")
    else:
        lines.append("- MFU: not measured (CPU, or a GPU without a known peak)")
    return "\n".join(lines)


def loss_section(run: Path, rows: list[dict[str, Any]]) -> str:
    """loss.png, the final values and the validation rows (evenly spaced when there are many)."""
    plot = "![loss](loss.png)" if (run / "loss.png").is_file() else "(no loss.png)"
    val = [r for r in rows if isinstance(r.get("val_loss"), (int, float))]
    if not val:
        return f"## Loss\n\n{plot}\n\nNo validation rows in metrics.jsonl."
    last, head0 = val[-1], val[-1].get("val_next_loss")
    final = f"Final (step {last['step']}): val loss " + (
        f"{head0:.4f} (next token; the mean over the prediction heads, as trained: {last['val_loss']:.4f})"
        if isinstance(head0, (int, float))
        else f"{last['val_loss']:.4f}"
    )
    if "val_bpb" in last:
        final += f", val bpb **{last['val_bpb']:.4f}**"
    train = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    if train:
        final += f"; train loss {train[-1]['loss']:.4f} at step {train[-1]['step']}"
    shown = val
    if len(val) > VAL_ROWS:
        shown = [val[i * (len(val) - 1) // (VAL_ROWS - 1)] for i in range(VAL_ROWS)]  # first and last kept
    keys = [k for k in ("val_loss", "val_next_loss", "val_bpb") if any(k in r for r in val)]
    body = table(["step", *keys], [[r["step"], *(r.get(k, "") for k in keys)] for r in shown])
    if len(shown) < len(val):
        body += f"\n\n{len(shown)} of {len(val)} evaluations, evenly spaced (all are in metrics.jsonl)."
    return f"## Loss\n\n{plot}\n\n{final}.\n\n{body}"


def evals_table(rows: list[dict[str, Any]]) -> str:
    inputs = [r.get("file") or r.get("data") or ", ".join(r.get("files", [])) for r in rows]
    body = [
        [r.get("task"), r.get("step"), metrics_text(r), i, r.get("time", "")] for r, i in zip(rows, inputs)
    ]
    return table(["task", "step", "result", "input", "time"], body)


def starting_run(cfg: dict[str, Any]) -> Path | None:
    """The run folder a tuned run started from (data.init: a run folder or one of its checkpoints), if it
    is still there."""
    init = cfg.get("data", {}).get("init")
    if not init:
        return None
    path = Path(init)
    for folder in (path, path.parent.parent):
        if (folder / "config.toml").is_file():
            return folder
    return None


def evals_section(run: Path, cfg: dict[str, Any]) -> str:
    """Every row of RUN/evals.jsonl (read like metrics.jsonl: a torn last line is skipped), then those of
    the run it started from (a tuned run's evaluation before tuning)."""
    rows = read_metrics(run / EVALS)
    text = (
        f"## Evaluations\n\nFrom {EVALS}:\n\n" + evals_table(rows)
        if rows
        else (
            f"## Evaluations\n\nNone yet: `euler-train eval --checkpoint {run} TASK ...` appends to {EVALS}."
        )
    )
    start = starting_run(cfg)
    before = read_metrics(start / EVALS) if start is not None else []
    if before:
        text += f"\n\nBefore this run: the evaluations of the run it started from, `{start}`:\n\n"
        text += evals_table(before)
    return text


def fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`."""
    longest = max((len(m) for m in re.findall("`+", text)), default=0)
    return "`" * max(3, longest + 1)


def quoted(title: str, text: str) -> str:
    text = for_terminal(text)  # control characters shown as U+FFFD
    return f"{title}\n\n{fence(text)}\n{text}\n{fence(text)}"


def samples_section(checkpoint: Path | None, state: dict[str, Any], cfg: dict[str, Any], device: str) -> str:
    if checkpoint is None:
        return "## Samples\n\nNo checkpoint to sample from."
    try:
        model = load_for_sampling(str(checkpoint), device, run_section(cfg))
        mode = state.get("mode")
        text = chat_samples(model, cfg, mode) if mode in ("sft", "dpo") else document_samples(model)
    except ValueError as err:  # e.g. a diverged run: logits overflow, the probabilities are NaN
        text = f"No samples: sampling from {checkpoint.name} failed ({err})."
    except MemoryError as err:  # a run sized to fill the GPU leaves no room for a second model (CuPy's too)
        text = (
            f"No samples: {checkpoint.name} did not fit in {device} memory beside the finished run ({err}); "
            f"`euler-train report RUN` writes them again on its own."
        )
    return "## Samples\n\n" + text


def document_samples(model: SamplingModel) -> str:
    """A greedy and seeded continuations of <|endoftext|> (the start of a new document)."""
    tok = model.tokenizer
    start = [tok.special_tokens[EOT]] if EOT in tok.special_tokens else [0]
    n = min(SAMPLE_TOKENS, model.mcfg.context - len(start))
    out = [f"Continuations of `{EOT}` (a new document), {n} new tokens at most:"]
    for seed in (None, *SEEDS):
        temperature = 0.0 if seed is None else 0.8
        args = argparse.Namespace(
            max_new_tokens=n, temperature=temperature, top_k=50, top_p=0.95, repetition_penalty=1.0, seed=seed
        )
        ids = list(stream_ids(model, start, args, stop_ids(tok, (END, EOT))))
        what = "greedy" if seed is None else f"seed {seed}, temperature 0.8, top-k 50, top-p 0.95"
        out.append(quoted(f"{what}:", tok.decode(ids)))
    return "\n\n".join(out)


def held_out_prompts(folder: str | Path, mode: str) -> tuple[list[list[int]], str]:
    """(the held-out prompts of a tuned run's set, which set): an sft run's SFT set, a dpo run's preference
    set (each pair's shared prompt)."""
    if mode == "dpo":
        if not (Path(folder) / PREFS_META).is_file():
            raise ConfigError(f"{folder} has no {PREFS_META}: make a preference set with `euler-data prefs`")
        tokens, mask, offsets, _ = read_prefs(folder, "val")
        chosen = zip(offsets[:-1:2], offsets[1::2])  # row 2i: pair i's prompt and chosen reply
        return [tokens[a:b][: reply_start(mask[a:b])].tolist() for a, b in chosen], "preference set"
    rows, _ = val_examples(folder)
    return [row.ids[: reply_start(row.mask)].tolist() for row in rows], "SFT set"


def chat_samples(model: SamplingModel, cfg: dict[str, Any], mode: str) -> str:
    """Greedy replies to the first held-out prompts of data.dir's SFT set (a dpo run: its preference set)."""
    try:
        prompts, kind = held_out_prompts(cfg["data"]["dir"], mode)
    except (ConfigError, DataError) as err:
        return f"No held-out prompts: {err}"
    if not prompts:
        return f"No held-out prompts: the {kind}'s val split is empty"
    limit = 2 * SAMPLE_TOKENS
    tok = model.tokenizer
    out = [f"Greedy replies ({limit} new tokens at most) to the first held-out prompts of the {kind}:"]
    for ids in prompts[: 1 + len(SEEDS)]:
        prompt = ids[-(model.mcfg.context - 1) :]
        reply, stopped = greedy_reply(model, prompt, min(limit, model.mcfg.context - len(prompt)))
        out.append(quoted("prompt:", tok.decode(prompt)))
        out.append(quoted(f"reply ({'ended with <|end|>' if stopped else 'no <|end|>'}):", tok.decode(reply)))
    return "\n\n".join(out)
