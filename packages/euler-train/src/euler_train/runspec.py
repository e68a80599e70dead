"""Everything a run needs, checked before any work: dataset, tokenizer, model shapes, init checkpoint.

A run is planned here, in one place: `plan_from_args` resolves a command line's config (`config_from_args`:
preset, the run's recorded config on --resume, --config, --set, flags) and `plan_run` turns a resolved
config into a `RunSpec` or raises ConfigError naming the key; it reads only small files (meta.json,
trainer_state.json, checksums), so a bad run fails in well under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from euler_bpe import Tokenizer
from euler_model import ModelConfig, preset
from euler_train.args import TRAIN_FLAGS
from euler_train.batches import TUNING_SETS, check_kind, split_tokens
from euler_train.checkpoint import STATE, CheckpointError, CheckpointManager, read_state
from euler_train.config import (
    PRESETS,
    ConfigError,
    RunConfig,
    TrainConfig,
    load_toml,
    recorded_config,
    resolve_config,
)
from euler_train.modelio import resolve_checkpoint
from euler_train.runfolder import describe_run


@dataclass
class RunSpec:
    """A validated plan: the model config, where the data and tokenizer are, what to start from."""

    cfg: RunConfig
    run_dir: Path
    mode: str  # "pretrain" | "sft" | "dpo"
    mcfg: Any  # euler_model.ModelConfig
    tokenizer_path: Path
    fingerprint: str | None
    init: Path | None  # sft, dpo: the checkpoint folder to start from
    resume_from: Path | None  # --resume: the newest valid checkpoint of this run
    overwrite: bool = False  # --overwrite: the run folder's old run is deleted before training starts
    history: list[dict[str, Any]] = dataclasses.field(
        default_factory=list
    )  # config changes, each at its step
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # those this --resume makes


def dataset_fingerprint(folder: Path, mode: str) -> str | None:
    """The tokenizer fingerprint recorded in the set's record (meta.json / sft_meta.json /
    prefs_meta.json), else computed from tokenizer.json."""
    meta_path = folder / (TUNING_SETS[mode].record if mode in TUNING_SETS else "meta.json")
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if isinstance(meta.get("tokenizer_fingerprint"), str):
            return meta["tokenizer_fingerprint"]
    return tokenizer_info(folder / "tokenizer.json")[1]


def tokenizer_info(path: Path) -> tuple[int, str]:
    """(vocab_size, fingerprint) of a tokenizer.json."""
    tok = Tokenizer.load(path)
    return tok.vocab_size, tok.fingerprint


def model_overrides(cfg: RunConfig) -> dict[str, Any]:
    """The [model] keys other than `preset`, checked against ModelConfig's fields."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    overrides = {k: v for k, v in cfg.model.items() if k != "preset"}
    for key in overrides:
        if key not in known:
            raise ConfigError(f"unknown key model.{key} (ModelConfig fields: {', '.join(sorted(known))})")
    return overrides


def build_model_config(cfg: RunConfig, vocab_size: int) -> Any:
    """preset + overrides, vocab_size defaulting to the tokenizer's; ConfigError for impossible shapes."""
    overrides = model_overrides(cfg)
    if overrides.get("vocab_size", vocab_size) < vocab_size:
        raise ConfigError(
            f"model.vocab_size={overrides['vocab_size']} is smaller than the dataset tokenizer's "
            f"vocabulary ({vocab_size})"
        )
    overrides.setdefault("vocab_size", vocab_size)
    try:
        return preset(cfg.model["preset"], **overrides)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"[model] (preset {cfg.model['preset']!r}): {err}") from None


def check_data(cfg: RunConfig, mode: str) -> Path:
    """data.dir exists and holds the right kind of set for this mode."""
    if not cfg.data.dir:
        raise ConfigError("data.dir is not set: pass --data DIR (a folder made by euler-data)")
    folder = Path(cfg.data.dir)
    if not folder.is_dir():
        raise ConfigError(f"data.dir {folder} does not exist")
    check_kind(folder, mode)
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"data.dir {folder} has no tokenizer.json")
    return folder


def check_splits(cfg: RunConfig, mcfg: Any, folder: Path, mode: str) -> None:
    """ConfigError when the train split (or, with evaluation on, the val split) cannot fill one batch row:
    a pretrain row is a window of context + K tokens; an SFT split needs at least one example."""
    window = mcfg.context + mcfg.n_mtp_heads
    for split in ("train", "val") if cfg.eval.enabled else ("train",):
        if mode in TUNING_SETS:
            record, unit = TUNING_SETS[mode].record, TUNING_SETS[mode].unit
            meta = json.loads((folder / record).read_text(encoding="utf-8"))
            have = int(meta.get(split, {}).get(unit, 0))
            short = f"{have} {unit}" if have < 1 else None
        else:
            have = split_tokens(folder, split)
            short = (
                f"{have} tokens, fewer than one window of {window} (model.context {mcfg.context} + "
                f"{mcfg.n_mtp_heads} heads)"
                if have < window
                else None
            )
        if short:
            fix = (
                "prepare it with a larger --val-fraction, lower model.context, or pass --no-eval"
                if split == "val"
                else "prepare more data or lower model.context"
            )
            raise ConfigError(f"data.dir {folder}: the {split} split holds {short}; {fix}")


def check_fingerprint(where: str, state_fp: str | None, data_fp: str | None) -> None:
    """ConfigError when a checkpoint's tokenizer differs from the dataset's."""
    if state_fp and data_fp and state_fp != data_fp:
        raise ConfigError(
            f"tokenizer mismatch: {where} was trained with tokenizer {state_fp[:12]}…, but data.dir's "
            f"tokenizer is {data_fp[:12]}…; prepare the data with the checkpoint's tokenizer.json"
        )


def check_same_model(where: Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """ConfigError naming the model keys that differ between a checkpoint and the config."""
    diff = [
        f"model.{k}: checkpoint {saved.get(k)!r}, config {v!r}"
        for k, v in wanted.items()
        if saved.get(k) != v
    ]
    if diff:
        raise ConfigError(f"--resume: checkpoint {where} has another model shape ({'; '.join(diff)})")


def check_same_global_batch(where: Path, saved: dict[str, Any], train: TrainConfig, world: int) -> None:
    """ConfigError unless this run reads the checkpoint's rows: a step's rows are drawn as one global batch
    of batch_size x processes per micro-batch (euler_data's loaders), so a resume on another number of
    processes must keep that product and grad_accum (older checkpoints, which lack them, are not checked)."""
    if "global_batch" not in saved:
        return
    want, accum = saved["global_batch"], saved["grad_accum"]
    have = train.batch_size * world
    if (have, train.grad_accum) == (want, accum):
        return
    if want % world:
        fix = f"run it on a number of processes that divides {want}"
    else:
        fix = f"on {world} process(es) pass --batch-size {want // world} --grad-accum {accum}"
    raise ConfigError(
        f"--resume: checkpoint {where} was trained with a global batch of {want} sequences (batch_size x "
        f"processes) and grad_accum {accum}, this run has {have} ({train.batch_size} x {world}) and "
        f"{train.grad_accum}; to continue it exactly {fix}"
    )


def find_resume(run_dir: Path) -> Path | None:
    try:
        return CheckpointManager(run_dir / "checkpoints").latest_valid()
    except CheckpointError as err:
        raise ConfigError(f"--resume: {err}") from None


def check_run_folder(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """A new run starts only in a folder without a run, unless --overwrite; --resume needs no check."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: pick one")
    there = None if resume or overwrite else describe_run(run_dir)
    if there:
        raise ConfigError(
            f"run folder {run_dir} already holds a run ({there}): pass --resume to continue it, "
            "--overwrite to delete it and start again, or another --out"
        )


def plan_run(
    cfg: RunConfig,
    run_dir: str | Path,
    mode: str,
    resume: bool = False,
    overwrite: bool = False,
    world: int = 1,
) -> RunSpec:
    """Validate data, tokenizer, model, checkpoints and the run folder for a pretrain or sft run of
    `world` processes."""
    run_dir = Path(run_dir)
    folder = check_data(cfg, mode)
    data_fp = dataset_fingerprint(folder, mode)
    vocab, _ = tokenizer_info(folder / "tokenizer.json")
    init = None
    if mode in ("sft", "dpo"):
        init = _sft_init(cfg, data_fp, mode)
        mcfg = ModelConfig.from_dict(read_state(init)["model_config"])
        if vocab > mcfg.vocab_size:
            raise ConfigError(
                f"tokenizer mismatch: data has {vocab} tokens, data.init's model {mcfg.vocab_size}"
            )
        _sft_model_section(cfg, mcfg, mode)
    else:
        mcfg = build_model_config(cfg, vocab)
    check_splits(cfg, mcfg, folder, mode)
    resume_from = find_resume(run_dir) if resume else None
    saved = read_state(resume_from) if resume_from is not None else {}
    history, changes = [], []
    if resume and (run_dir / "config.toml").is_file():  # the run's own record first, then its checkpoint
        recorded, history = recorded_config(run_dir / "config.toml")
        changes = resume_changes(run_dir, recorded, cfg, saved.get("step", 0))
    if resume_from is not None:
        check_fingerprint(f"checkpoint {resume_from}", saved.get("tokenizer_fingerprint"), data_fp)
        check_same_model(resume_from, saved.get("model_config", {}), mcfg.to_dict())
        check_same_global_batch(resume_from, saved, cfg.train, world)
        if saved.get("optimizer", "adamw") != cfg.train.optimizer:
            raise ConfigError(
                f"--resume: checkpoint {resume_from} was trained with train.optimizer="
                f"{saved.get('optimizer', 'adamw')!r}, the config asks for {cfg.train.optimizer!r}"
            )
    check_run_folder(run_dir, resume, overwrite)
    tok_path = folder / "tokenizer.json"
    return RunSpec(
        cfg, run_dir, mode, mcfg, tok_path, data_fp, init, resume_from, overwrite, history + changes, changes
    )


# What makes a run the run it is: a resume that asks for other values is another run (another --out).
FIXED_ON_RESUME = ("model", "data.init")
UNRECORDED = ("log.progress",)  # how the run is shown, not what it computes


def resume_changes(run_dir: Path, recorded: dict, cfg: RunConfig, step: int) -> list[dict[str, Any]]:
    """The keys a --resume changes from the run's config.toml, each as {step, key, was, now}; ConfigError
    for a key that makes another run (the model's shape or preset, sft's starting checkpoint)."""
    changes = []
    for section, values in cfg.to_dict().items():
        saved = recorded.get(section, {})
        fixed = section in FIXED_ON_RESUME
        for key, now in values.items():
            dotted = f"{section}.{key}"
            if (key not in saved and not fixed) or dotted in UNRECORDED or saved.get(key) == now:
                continue
            if fixed or dotted in FIXED_ON_RESUME:
                was = saved[key] if key in saved else _preset_value(recorded, key)
                raise ConfigError(
                    f"--resume: {run_dir} was run with {dotted}={was!r} and keeps it (asked for {now!r}); "
                    "to train another model, start a new run with another --out"
                )
            changes.append({"step": step, "key": dotted, "was": saved[key], "now": now})
    return changes


def _preset_value(recorded: dict, key: str) -> Any:
    """A model field's value in the preset a run's config.toml names (None where it names none known)."""
    name = recorded.get("model", {}).get("preset")
    return getattr(preset(name), key, None) if name in PRESETS else None


def _sft_model_section(cfg: RunConfig, mcfg: Any, mode: str) -> None:
    """sft and dpo take the model from data.init: [model] may only repeat it; it is recorded in
    config.toml."""
    shape = mcfg.to_dict()
    diff = [
        f"model.{k}={v!r} (data.init has {shape[k]!r})"
        for k, v in model_overrides(cfg).items()
        if shape[k] != v
    ]
    if diff:
        raise ConfigError(f"{mode} takes the model shape from data.init; cannot change {', '.join(diff)}")
    cfg.model.update(shape)


def _sft_init(cfg: RunConfig, data_fp: str | None, mode: str) -> Path:
    """The starting checkpoint of sft or dpo: data.init (a checkpoint or run folder), verified, same
    tokenizer."""
    if not cfg.data.init:
        what = "an SFT" if mode == "dpo" else "a pretrain"
        raise ConfigError(
            f"data.init is not set: {mode} needs --init CHECKPOINT ({what} checkpoint or run folder)"
        )
    try:
        init = resolve_checkpoint(cfg.data.init)
    except CheckpointError as err:
        raise ConfigError(f"data.init: {err}") from None
    check_fingerprint(f"data.init {init}", read_state(init).get("tokenizer_fingerprint"), data_fp)
    return init


def plan_from_args(args: argparse.Namespace, world: int) -> RunSpec:
    """The plan of a pretrain or sft command line: its config resolved (config_from_args) and planned for
    the processes it runs on: --gpus N from a single process launches N, else the `world` it is part of."""
    cfg = config_from_args(args)
    processes = cfg.run.gpus if cfg.run.gpus > 1 and world == 1 else world
    return plan_run(cfg, args.out, args.command, args.resume, args.overwrite, processes)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """preset -> RUN/config.toml when resuming -> --config -> --set -> plain flags. Without --preset the
    preset is the one of those files, or for sft the one data.init was trained with. A resumed run keeps
    its preset (plan_run records or refuses the other changes)."""
    saved = Path(args.out) / "config.toml"
    recorded = recorded_config(saved)[0] if args.resume and saved.is_file() else None
    base = recorded
    if args.config:
        base = merge_files(base or {}, recorded_config(args.config)[0])
    flags = {key: getattr(args, name, None) for name, key in TRAIN_FLAGS.items()}
    if recorded is not None and args.preset is not None:  # asked of a resumed run: resume_changes judges it
        flags["model.preset"] = args.preset
    if args.no_progress:
        flags["log.progress"] = False
    if args.no_eval:
        flags["eval.enabled"] = False
    if base is not None and args.preset is None:
        args.preset = base.get("model", {}).get("preset", "tiny") if base.get("model") else None
    if args.preset is None and args.command in ("sft", "dpo") and args.init:
        args.preset = init_preset(Path(args.init))
    return resolve_config(args.preset or "tiny", base, args.set, flags, mode=args.command)


def merge_files(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Two config files' contents, `update`'s keys over `base`'s, section by section."""
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in update.items():
        merged[section] = {**merged.get(section, {}), **values} if isinstance(values, dict) else values
    return merged


def init_preset(init: Path) -> str | None:
    """The preset recorded in the config.toml of the run that `init` (a run or checkpoint folder) belongs
    to, or None when there is none."""
    run = init.parents[1] if (init / STATE).is_file() else init  # a checkpoint: RUN/checkpoints/step_N
    if not (run / "config.toml").is_file():
        return None
    preset = load_toml(run / "config.toml").get("model", {}).get("preset")
    return preset if preset in PRESETS else None
