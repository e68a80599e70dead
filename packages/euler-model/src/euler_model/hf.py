"""Hugging Face interop: write and read `LlamaForCausalLM` folders.

A folder written by save_hf holds (every file mode 0644)
    config.json             a LlamaConfig (model_type "llama"), plus "euler_mtp_heads": K
    model.safetensors       the Llama weights; head 0 is lm_head.weight
    mtp_heads.safetensors   heads 1..K-1 as "mtp_heads.{k}.weight" (only when K > 1; transformers ignores it),
                            and conditioned heads' P_k as "mtp_heads_cond.{k}.weight" (mtp_conditioned)
    tokenizer.json          when a tokenizer is given, with
    tokenizer_config.json   its eos / pad / other special tokens and the chat template (hf_tokenizer.py)
    generation_config.json  the ids that stop `generate` (eos_token_id, one id or a list) and the pad id
Our RoPE is the rotate-half layout of HF Llama, so q/k projections are stored as they are (no permutation).
load_hf reads such a folder back, or any Llama-architecture folder: without mtp_heads.safetensors the
model has K = 1; a tied model (tie_word_embeddings, or no lm_head.weight) gets head 0 = a copy of the
embedding.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from euler_model.checkpoint import to_host
from euler_model.config import ModelConfig
from euler_model.hf_tokenizer import TokenizerMeta, added_tokens, generation_config, tokenizer_config
from euler_model.params import check_params, param_shapes
from euler_model.safetensors_io import read_safetensors

MTP_FILE = "mtp_heads.safetensors"
FILE_MODE = 0o644  # readable by everyone, whatever the umask or safetensors' own mode (0600)
_LAYER_NAMES = {  # ours -> Hugging Face, inside model.layers.{i}.
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def hf_name(name: str) -> str:
    """Our parameter name -> its Hugging Face Llama name (heads k >= 1 -> mtp_heads.{k}.weight).

    >>> hf_name("layers.3.wq"), hf_name("heads.0"), hf_name("heads.2")
    ('model.layers.3.self_attn.q_proj.weight', 'lm_head.weight', 'mtp_heads.2.weight')
    """
    if name == "embed":
        return "model.embed_tokens.weight"
    if name == "norm":
        return "model.norm.weight"
    if name.startswith("heads."):
        k = int(name.split(".")[1])
        return "lm_head.weight" if k == 0 else f"mtp_heads.{k}.weight"
    if name.startswith("heads_cond."):
        return f"mtp_heads_cond.{name.split('.')[1]}.weight"
    _, i, leaf = name.split(".")
    return f"model.layers.{i}.{_LAYER_NAMES[leaf]}"


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """The config.json dict of a LlamaForCausalLM with our architecture."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "num_hidden_layers": config.n_layers,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.context,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": "float32",
        "euler_mtp_heads": config.n_mtp_heads,
        "euler_mtp_conditioned": config.mtp_conditioned,
    }


def save_hf(
    config: ModelConfig,
    params: dict[str, Any],
    folder: str | Path,
    tokenizer: Any = None,
    dtype: Any = np.float32,
    *,
    eos_tokens: Sequence[str] = (),
    pad_token: str | None = None,
    chat_template: str | None = None,
) -> Path:
    """Write a LlamaForCausalLM folder for params (or any params-shaped dict, e.g. gradients).

    tokenizer: None, a path to a tokenizer.json to copy, or an object with .to_hf(path) (euler-bpe's
    Tokenizer). eos_tokens: names of the special tokens that end a generation (the first is the
    tokenizer's eos_token); pad_token: the padding token's name; chat_template: a Jinja chat template.
    These need a tokenizer, and each name must be one of its special tokens. Returns the folder.
    """
    check_params(config, params, "save_hf")
    meta = None
    if tokenizer is not None:
        tok_text = _tokenizer_text(tokenizer)
        meta = TokenizerMeta.resolve(
            added_tokens(tok_text), eos_tokens, pad_token, chat_template, config.vocab_size
        )
    elif eos_tokens or pad_token is not None or chat_template is not None:
        raise ValueError("save_hf: eos_tokens, pad_token and chat_template need a tokenizer")
    folder = Path(folder)
    if not folder.is_dir():
        folder.mkdir(parents=True)
        folder.chmod(0o755)
    tensors = {hf_name(n): to_host(v).astype(dtype) for n, v in params.items()}
    main = {n: t for n, t in tensors.items() if not n.startswith("mtp_heads")}  # mtp_heads(_cond).k
    written = [_save_tensors(main, folder / "model.safetensors")]
    extra = {n: t for n, t in tensors.items() if n.startswith("mtp_heads")}
    if extra:
        written.append(_save_tensors(extra, folder / MTP_FILE))
    elif (folder / MTP_FILE).is_file():  # left by an earlier export with K > 1: load_hf would read it
        (folder / MTP_FILE).unlink()
    cfg = hf_config(config) | {"dtype": np.dtype(dtype).name}
    if meta is not None:
        cfg |= {"eos_token_id": meta.eos_token_id(), "pad_token_id": meta.pad_id}
        (folder / "tokenizer.json").write_text(tok_text, encoding="utf-8")
        written.append(folder / "tokenizer.json")
        written.append(_write_json(folder / "tokenizer_config.json", tokenizer_config(meta, config.context)))
        written.append(_write_json(folder / "generation_config.json", generation_config(meta)))
    written.append(_write_json(folder / "config.json", cfg))
    for path in written:
        path.chmod(FILE_MODE)
    return folder


def _save_tensors(tensors: dict[str, np.ndarray], path: Path) -> Path:
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def _write_json(path: Path, content: dict[str, Any]) -> Path:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _tokenizer_text(tokenizer: Any) -> str:
    """The tokenizer.json text of a tokenizer.json path or of an object with .to_hf(path)."""
    if hasattr(tokenizer, "to_hf"):
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.to_hf(Path(tmp) / "tokenizer.json")
            return (Path(tmp) / "tokenizer.json").read_text(encoding="utf-8")
    if isinstance(tokenizer, str | os.PathLike) and Path(tokenizer).is_file():
        return Path(tokenizer).read_text(encoding="utf-8")
    raise ValueError(f"save_hf: tokenizer must be a tokenizer.json path or have .to_hf(), got {tokenizer!r}")


def config_from_hf(cfg: dict[str, Any], n_mtp_heads: int = 1, mtp_conditioned: bool = False) -> ModelConfig:
    """Our ModelConfig from a Llama config.json dict; unsupported features raise a ValueError."""
    if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in cfg.get("architectures", []):
        raise ValueError(f"load_hf: not a Llama model (model_type={cfg.get('model_type')!r})")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    problems = [name for name in ("attention_bias", "mlp_bias") if cfg.get(name)]
    if cfg.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={cfg['hidden_act']!r}")
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope scaling {rope}")
    if problems:
        raise ValueError(
            f"load_hf: unsupported Llama features {problems} (we have no biases, SiLU, plain RoPE)"
        )
    heads, dim = cfg["num_attention_heads"], cfg["hidden_size"]
    if cfg.get("head_dim") not in (None, dim // heads):
        raise ValueError(f"load_hf: head_dim={cfg['head_dim']} != hidden_size / n_heads ({dim // heads})")
    return ModelConfig(
        dim=dim,
        n_heads=heads,
        n_kv_heads=cfg.get("num_key_value_heads") or heads,
        n_layers=cfg["num_hidden_layers"],
        ffn_dim=cfg["intermediate_size"],
        context=cfg.get("max_position_embeddings", 2048),
        vocab_size=cfg["vocab_size"],
        n_mtp_heads=n_mtp_heads,
        mtp_conditioned=mtp_conditioned,
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
    )


def _hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"load_hf: {folder} has no model.safetensors nor model.safetensors.index.json"
        )
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(read_safetensors(folder / name, "load_hf"))
    return tensors


def load_hf(folder: str | Path, xp: Any = np, dtype: Any = np.float32) -> tuple[ModelConfig, dict[str, Any]]:
    """Read a LlamaForCausalLM folder (ours or any Llama-architecture model): (config, params).

    K = 1 + the number of heads in mtp_heads.safetensors (K = 1 when that file is absent); the heads are
    conditioned (mtp_conditioned) when it also holds their mtp_heads_cond matrices.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"load_hf: {folder} has no config.json")
    cfg = json.loads((folder / "config.json").read_text())
    tensors = _hf_tensors(folder)
    if (folder / MTP_FILE).is_file():
        tensors.update(read_safetensors(folder / MTP_FILE, "load_hf"))
    n_mtp = 1 + sum(1 for n in tensors if n.startswith("mtp_heads."))
    config = config_from_hf(cfg, n_mtp, any(n.startswith("mtp_heads_cond.") for n in tensors))
    if "lm_head.weight" not in tensors:  # tied embeddings: the output head is the input embedding
        tensors["lm_head.weight"] = tensors.get("model.embed_tokens.weight")
    params = {}
    for name in param_shapes(config):
        if tensors.get(hf_name(name)) is not None:
            params[name] = tensors[hf_name(name)]
    check_params(config, params, f"load_hf({folder})")
    return config, {n: xp.asarray(np.array(v, dtype=dtype)) for n, v in params.items()}
