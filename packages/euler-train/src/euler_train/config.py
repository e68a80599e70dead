"""Run configuration: TOML presets, `--set key=value` overrides, validation that names the key.

A run config is a `RunConfig`: one dataclass per TOML table, whose fields are every key with its default
and type (the one place defaults are written); `[model]` is the exception: besides `preset` it takes any
field of euler-model's `ModelConfig`, which euler-model validates when the run is planned. Presets, files
and `--set` are merged as TOML-shaped dicts, then checked once and made a RunConfig.

>>> cfg = resolve_config("tiny", overrides=["train.lr=3e-4"])
>>> cfg.train.lr
0.0003
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from euler_train.checkpoint import write_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A run config that cannot run; the message names the offending key."""


def note(text: str) -> None:
    """A one-line note to the user on stderr."""
    print(f"euler-train: note: {text}", file=sys.stderr)


# config.toml's array of changes made on --resume: {step, key, was, now}, each at the step it took effect
HISTORY = "history"


@dataclass
class DataConfig:
    """[data]: what a run reads."""

    dir: str = ""  # dataset folder made by euler-data (pretrain) or the SFT set folder (sft)
    init: str = ""  # sft: checkpoint folder to start from


@dataclass
class TrainConfig:
    """[train]: the optimizer, its schedule and the step."""

    steps: int = 50  # optimizer steps
    batch_size: int = 4  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # floor of the cosine decay
    warmup_steps: int = 5  # linear warmup from 0 to lr
    weight_decay: float = 0.1  # decoupled, on matrices only (ndim >= 2)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    optimizer: str = "adamw"  # "adamw", or "muon": Muon for the blocks' matrices, AdamW for the rest
    muon_lr: float = 0.02  # Muon's peak learning rate (same schedule as lr); x sqrt(max(1, rows/cols))
    muon_momentum: float = 0.95  # Muon's Nesterov momentum
    seed: int = 0  # every random choice is a function of (seed, step)
    on_nonfinite: str = "stop"  # "stop" the run or "skip" the step on a NaN/inf loss or gradient
    cuda_graph: bool = True  # training on one GPU: capture the whole step once, replay it (graph_step.py)
    zero: int = 0  # 1: ZeRO stage 1, each process keeps its share of the optimizer state (zero.py)
    recompute: bool = False  # keep only each layer's input, re-run the layer in the backward (less memory)
    # bf16 / fp8: keep each norm's output and the SwiGLU product for the backward instead of re-making
    # them there (faster, 2C + F more bf16 values per token and layer)
    keep_activations: bool = False
    # bf16 / fp8 with AdamW on one GPU: the gradients of the layers' matrices and the heads are bf16, as
    # autocast's are before their cast (less to write and to read, 2 bytes a weight less memory)
    bf16_grads: bool = False
    # run.precision fp8: "current" casts each FP8 operand with its own maximum (a cast pass a tensor);
    # "delayed": SwiGLU writes its FP8 outputs directly, scaled from their last 16 steps' maxima
    fp8_scaling: str = "current"
    dpo_beta: float = 0.1  # dpo: the loss's beta (the weight of the reward margins against the reference)
    dpo_sft_weight: float = 0.0  # dpo: + this times the chosen replies' NLL per token (0: DPO alone)


@dataclass
class EvalConfig:
    """[eval]: validation loss and bits per byte during training."""

    every: int = 25  # steps between evaluations (and at the last step); 0: only at the last step
    batches: int = 4  # validation batches per evaluation
    enabled: bool = True  # false (--no-eval): never evaluate, e.g. for a dataset without a val split


@dataclass
class CheckpointConfig:
    """[checkpoint]: when checkpoints are written and which are kept."""

    every: int = 25  # steps between checkpoints (and at the last step); 0: only at the end
    keep_last: int = 3  # newest checkpoints kept
    keep_best: bool = True  # also keep the one with the lowest validation loss


@dataclass
class LogConfig:
    """[log]: what a run shows and writes besides checkpoints."""

    every: int = 1  # steps between metrics.jsonl lines
    tensorboard: bool = True  # write event files when tensorboardX is installed
    progress: bool = True  # tqdm progress bar


@dataclass
class DeviceConfig:
    """[run]: where and in what precision a run computes."""

    device: str = "cpu"  # cpu | gpu | auto
    precision: str = "fp32"  # fp32 | tf32 | bf16 | fp8 (GPU only for tf32 / bf16 / fp8)
    attention_kernel: str = "auto"  # bf16 FlashAttention: auto | sm90 (Hopper's) | mma (mma.sync, to compare)
    gemm_tuning: bool = True  # time cuBLASLt's algorithms for each kind of bf16 product, keep the fastest
    gpus: int = 1  # data-parallel processes, one per GPU
    memory_check: bool = True  # refuse a step whose estimated memory exceeds what is available


def run_section(cfg: dict[str, Any]) -> DeviceConfig:
    """A recorded config's [run] table as a DeviceConfig (a key an older run did not record at its default).

    >>> run_section({"run": {"device": "gpu", "precision": "bf16"}}).attention_kernel
    'auto'
    """
    known = {f.name for f in fields(DeviceConfig)}
    return DeviceConfig(**{k: v for k, v in cfg.get("run", {}).items() if k in known})


@dataclass
class RunConfig:
    """A resolved run config, one typed section per TOML table (`config.toml` is `dumps` of it).

    model: `preset` plus any field of euler-model's `ModelConfig` as an override (e.g. n_layers = 2),
    which euler-model validates itself when the run is planned (runspec.build_model_config).
    """

    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    run: DeviceConfig = field(default_factory=DeviceConfig)

    @classmethod
    def from_dict(cls, sections: dict[str, dict[str, Any]]) -> RunConfig:
        """From validated sections (every key present, of its type)."""
        kinds = {f.name: f.default_factory for f in fields(cls)}
        return cls(**{name: dict(sections[name]) if name == "model" else kinds[name](**sections[name])
                      for name in kinds})  # fmt: skip

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The sections as plain dicts, in TOML's order."""
        return asdict(self)


# Every key of a run config, with its default; the default's type is the key's type.
DEFAULTS: dict[str, dict[str, Any]] = RunConfig().to_dict()


# Presets: only what differs from DEFAULTS.
def large_preset(model: str, batch_size: int, lr: float, min_lr: float) -> dict[str, dict[str, Any]]:
    """A larger size's run preset: 5000 bf16 steps on one GPU, warmup 200 then cosine from lr to min_lr.
    They keep their bf16 activations and take bf16 weight gradients (faster a step for little memory:
    docs/benchmarks/train_gpu.md); where that does not fit, the memory check says which to set false."""
    return {
        "model": {"preset": model},
        "train": {"steps": 5000, "batch_size": batch_size, "lr": lr, "min_lr": min_lr, "warmup_steps": 200,
                  "keep_activations": True, "bf16_grads": True},
        "eval": {"every": 250, "batches": 20},
        "checkpoint": {"every": 500},
        "log": {"every": 10},
        "run": {"device": "gpu", "precision": "bf16"},
    }  # fmt: skip


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {"model": {"preset": "tiny"}},
    "small": {
        "model": {"preset": "small"},
        "train": {"steps": 600, "batch_size": 16, "lr": 2e-3, "min_lr": 2e-4, "warmup_steps": 30},
        "eval": {"every": 100, "batches": 8},
        "checkpoint": {"every": 100},
        "log": {"every": 5},
    },
    "gpu": {
        "model": {"preset": "gpu"},
        "train": {"steps": 5000, "batch_size": 32, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 200},
        "eval": {"every": 250, "batches": 20},
        "checkpoint": {"every": 500},
        "log": {"every": 10},
        "run": {"device": "gpu", "precision": "tf32"},
    },
    # the larger sizes, bf16 on one GPU (large_preset); peak learning rates from GPT-3's table for the
    # nearest sizes (350M: 3e-4, 1.3B: 2e-4, 2.7B: 1.6e-4), not tuned here
    "350m": large_preset("350m", batch_size=16, lr=3e-4, min_lr=3e-5),
    "1b": large_preset("1b", batch_size=8, lr=2e-4, min_lr=2e-5),
    "3b": large_preset("3b", batch_size=4, lr=1.6e-4, min_lr=1.6e-5),  # 4 x 2048 tokens: fits 80 GiB
}

CHOICES: dict[str, tuple[str, ...]] = {
    "train.on_nonfinite": ("stop", "skip"),
    "train.optimizer": ("adamw", "muon"),
    "train.fp8_scaling": ("current", "delayed"),
    "train.zero": (0, 1),
    "run.device": ("cpu", "gpu", "auto"),
    "run.precision": ("fp32", "tf32", "bf16", "fp8"),
    "run.attention_kernel": ("auto", "sm90", "mma"),
}
POSITIVE = ("train.steps", "train.batch_size", "train.grad_accum", "run.gpus", "eval.batches")
NON_NEGATIVE = (
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.weight_decay",
    "train.eps",
    "train.grad_clip",
    "train.muon_lr",
    "train.seed",
    "eval.every",
    "checkpoint.every",
    "checkpoint.keep_last",
    "log.every",
)


def parse_value(text: str) -> Any:
    """A `--set` value as TOML (numbers, booleans, quoted strings, arrays), else the bare string.

    >>> parse_value("3e-4"), parse_value("true"), parse_value("data/x")
    (0.0003, True, 'data/x')
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split `section.key=value` into (section, key, value); ConfigError if malformed."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.lr=3e-4")
    dotted, text = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {item!r}: the key must be section.key, e.g. train.lr")
    return parts[0], parts[1], parse_value(text.strip())


def merge(base: dict[str, dict[str, Any]], update: dict[str, Any], origin: str) -> None:
    """Merge `update` into `base` in place, rejecting unknown sections/keys with their full name."""
    for section, values in update.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{origin}: unknown section {section!r} (known: {', '.join(DEFAULTS)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: {section!r} must be a table of keys, got {values!r}")
        for key, value in values.items():
            if section != "model" and key not in DEFAULTS[section]:
                known = ", ".join(DEFAULTS[section])
                raise ConfigError(f"{origin}: unknown key {section}.{key} (known in [{section}]: {known})")
            base[section][key] = value


def sft_overlay(cfg: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What `sft` changes in a preset: a third of its peak learning rate, a short warmup, 200 steps with
    evaluations and checkpoints every 50 (fine-tuning moves a pretrained model a little, on little data)."""
    lr = cfg["train"]["lr"] / 3
    return {
        "train": {"steps": 200, "lr": lr, "min_lr": lr / 10, "warmup_steps": 10},
        "eval": {"every": 50},
        "checkpoint": {"every": 50},
    }


def dpo_overlay(cfg: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What `dpo` changes in a preset besides sft_overlay: a tenth of sft's learning rate (preference
    tuning moves an SFT model less still), and its GPU step eager unless train.cuda_graph is set true
    (capturing the dpo step is opt-in until its GPU tests have run: euler-train's README)."""
    lr = cfg["train"]["lr"] / 10
    return {"train": {"lr": lr, "min_lr": lr / 10, "cuda_graph": False}}


def preset_config(name: str, mode: str = "pretrain") -> dict[str, dict[str, Any]]:
    """DEFAULTS with the named preset applied (and, for `sft` and `dpo`, sft_overlay on top; for `dpo`
    dpo_overlay after it)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    cfg = copy.deepcopy(DEFAULTS)
    merge(cfg, PRESETS[name], f"preset {name}")
    if mode in ("sft", "dpo"):
        merge(cfg, sft_overlay(cfg), "sft defaults")
    if mode == "dpo":
        merge(cfg, dpo_overlay(cfg), "dpo defaults")
    return cfg


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; ConfigError on a syntax error or a missing file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path}: {err}") from None


def resolve_config(
    preset: str | None = "tiny",
    base: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    mode: str = "pretrain",
) -> RunConfig:
    """Preset (with sft_overlay when mode is "sft") -> TOML file contents (`base`) -> `--set` overrides ->
    plain flags; then validate (types, choices, ranges) and check the rules across keys.

    `flags` maps dotted keys to values (None entries are ignored), e.g. {"train.steps": 10}.
    A preset's train.bf16_grads gives way to the run's own settings where they do not allow it (say,
    --precision tf32); set explicitly, it is checked like any other key.
    """
    cfg = preset_config(preset or "tiny", mode)
    chosen = {f"{s}.{k}" for s, values in (base or {}).items() if isinstance(values, dict) for k in values}
    if base:
        merge(cfg, base, "config file")
    for item in overrides or []:
        section, key, value = parse_override(item)
        merge(cfg, {section: {key: value}}, f"--set {item}")
        chosen.add(f"{section}.{key}")
    for dotted, value in (flags or {}).items():
        if value is not None:
            section, key = dotted.split(".")
            merge(cfg, {section: {key: value}}, f"--{key.replace('_', '-')}")
            chosen.add(dotted)
    config = validate(cfg)
    if "train.bf16_grads" not in chosen and config.train.bf16_grads and not bf16_grads_allowed(config):
        config.train.bf16_grads = False
    check_rules(config)
    return config


def cpu_world() -> bool:
    """EULER_COMM=socket: several CPU processes stand in for GPUs (tests, debugging; see socket_comm.py)."""
    return os.environ.get("EULER_COMM") == "socket"


def check_type(dotted: str, value: Any, default: Any) -> Any:
    """Return value coerced to the default's type (int -> float allowed); ConfigError naming the key."""
    want = type(default)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
        raise ConfigError(f"{dotted} must be {want.__name__}, got {type(value).__name__} {value!r}")
    return value


def validate(cfg: dict[str, dict[str, Any]]) -> RunConfig:
    """Types, choices and ranges of every key (ints become floats where floats are expected), as a
    RunConfig."""
    for section, keys in DEFAULTS.items():
        for key, default in keys.items():
            cfg[section][key] = check_type(f"{section}.{key}", cfg[section][key], default)
    for dotted, allowed in CHOICES.items():
        section, key = dotted.split(".")
        if cfg[section][key] not in allowed:
            raise ConfigError(f"{dotted} must be one of {allowed}, got {cfg[section][key]!r}")
    for dotted in POSITIVE + NON_NEGATIVE:
        section, key = dotted.split(".")
        low = 1 if dotted in POSITIVE else 0
        if cfg[section][key] < low:
            raise ConfigError(f"{dotted} must be >= {low}, got {cfg[section][key]!r}")
    return RunConfig.from_dict(cfg)


def check_rules(cfg: RunConfig) -> None:
    """The rules across keys, each with one message: the place every combination is checked."""
    train, run = cfg.train, cfg.run
    if train.min_lr > train.lr:
        raise ConfigError(f"train.min_lr ({train.min_lr}) must not exceed train.lr")
    for beta in ("beta1", "beta2", "muon_momentum"):
        if not 0.0 <= getattr(train, beta) < 1.0:
            raise ConfigError(f"train.{beta} must be in [0, 1), got {getattr(train, beta)!r}")
    if run.device == "cpu" and run.precision != "fp32":
        raise ConfigError(f"run.precision={run.precision!r} needs run.device=gpu (CPU is fp32)")
    if not train.dpo_beta > 0:
        raise ConfigError(f"train.dpo_beta must be > 0, got {train.dpo_beta!r}")
    if not train.dpo_sft_weight >= 0:
        raise ConfigError(f"train.dpo_sft_weight must be >= 0, got {train.dpo_sft_weight!r}")
    if train.fp8_scaling == "delayed" and run.precision != "fp8":
        raise ConfigError(
            "train.fp8_scaling='delayed' scales FP8 operands: it needs run.precision=fp8, not "
            f"{run.precision!r}"
        )
    check_bf16_grads(cfg)
    if run.device == "cpu" and run.gpus > 1 and not cpu_world():
        raise ConfigError(f"run.gpus={run.gpus} needs run.device=gpu")


def check_bf16_grads(cfg: RunConfig) -> None:
    """train.bf16_grads: only where something reads bf16 gradients (AdamW's kernels on one GPU)."""
    train, run = cfg.train, cfg.run
    if not train.bf16_grads:
        return
    if run.precision not in ("bf16", "fp8"):
        raise ConfigError(
            f"train.bf16_grads needs bf16 or fp8 products (run.precision bf16 or fp8), not {run.precision}"
        )
    clashes = {
        "train.optimizer": (train.optimizer, "adamw"),
        "train.zero": (train.zero, 0),
        "run.gpus": (run.gpus, 1),
    }
    for dotted, (value, needed) in clashes.items():
        if value != needed:
            raise ConfigError(
                f"train.bf16_grads is for AdamW on one GPU: it needs {dotted}={needed!r}, not {value!r} "
                "(set train.bf16_grads=false)"
            )


def bf16_grads_allowed(cfg: RunConfig) -> bool:
    """Whether the rest of the config would allow train.bf16_grads = true."""
    try:
        check_bf16_grads(replace(cfg, train=replace(cfg.train, bf16_grads=True)))
    except ConfigError:
        return False
    return True


def format_value(value: Any) -> str:
    """One TOML literal (strings, booleans, numbers, flat lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    return str(value)


def dumps(cfg: RunConfig, history: list[dict[str, Any]] = ()) -> str:
    """The config (and its `[[history]]` of changes) as TOML text that `tomllib` reads back the same."""
    lines: list[str] = []
    for section, values in cfg.to_dict().items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {format_value(value)}" for key, value in values.items()]
        lines.append("")
    for change in history:
        lines.append(f"[[{HISTORY}]]")
        lines += [f"{key} = {format_value(value)}" for key, value in change.items()]
        lines.append("")
    return "\n".join(lines)


def save_config(cfg: RunConfig, path: str | Path, history: list[dict[str, Any]] = ()) -> None:
    """Write the resolved config, and the changes made to it on --resume, as TOML: whole or not at all
    (the history cannot be made again), a failed write one line (FolderUnwritable)."""
    text = dumps(cfg, history)
    write_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def recorded_config(path: str | Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """A run's config.toml: (the config it runs with now, the changes made on --resume, oldest first)."""
    doc = load_toml(path)
    history = doc.pop(HISTORY, [])
    if not isinstance(history, list) or not all(isinstance(c, dict) for c in history):
        raise ConfigError(f"{path}: [[{HISTORY}]] must be an array of tables")
    return doc, history
