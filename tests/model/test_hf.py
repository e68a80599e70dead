"""HF interop: save_hf folders load in transformers with equal logits; load_hf reads Llama folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from euler_model import init_params, load_hf, logits, preset, save_hf
from euler_model.hf import MTP_FILE

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


def random_weights(cfg, seed):
    p = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    # visibly non-trivial norms and larger weights, so that a mis-mapped tensor shows in the logits
    return {
        k: (1 + 0.2 * rng.standard_normal(v.shape)).astype(np.float32) if k.endswith("norm") else v * 5
        for k, v in p.items()
    }


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 4, "rope_theta": 500.0, "norm_eps": 1e-6}])
def test_save_hf_loads_in_transformers_with_equal_logits(tmp_path, overrides) -> None:
    cfg = preset("tiny", **overrides)
    params = random_weights(cfg, 0)
    save_hf(cfg, params, tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(["config.json", MTP_FILE, "model.safetensors"])
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).float().eval()
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, cfg.context))
    ours = logits(cfg, params, tokens)
    np.testing.assert_allclose(hf_logits(model, tokens), ours, rtol=1e-5, atol=1e-5)
    back_cfg, back = load_hf(tmp_path)  # the MTP heads come back from their own file
    assert back_cfg == cfg
    for k in params:
        np.testing.assert_array_equal(back[k], params[k])


def test_any_params_shaped_dict_exports(tmp_path) -> None:
    cfg = preset("tiny")
    grads = {k: np.full(v.shape, i, np.float32) for i, (k, v) in enumerate(init_params(cfg).items())}
    save_hf(cfg, grads, tmp_path / "grads")
    _, back = load_hf(tmp_path / "grads")
    for k in grads:
        np.testing.assert_array_equal(back[k], grads[k])


def test_tokenizer_is_written(tmp_path) -> None:
    cfg = preset("tiny")
    tok_file = tmp_path / "tok.json"
    tok_file.write_text('{"model": {"type": "BPE"}}')

    class FakeTokenizer:
        def to_hf(self, path):
            path.write_text('{"from": "to_hf"}')

    save_hf(cfg, init_params(cfg), tmp_path / "a", tokenizer=tok_file)
    save_hf(cfg, init_params(cfg), tmp_path / "b", tokenizer=FakeTokenizer())
    assert json.loads((tmp_path / "a" / "tokenizer.json").read_text()) == {"model": {"type": "BPE"}}
    assert json.loads((tmp_path / "b" / "tokenizer.json").read_text()) == {"from": "to_hf"}
    with pytest.raises(ValueError, match="tokenizer"):
        save_hf(cfg, init_params(cfg), tmp_path / "c", tokenizer=123)


def llama(tmp_path, tie: bool, theta: float, dtype=torch.float32):
    """A randomly initialised LlamaForCausalLM made by transformers, saved to a folder."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=24,
        rms_norm_eps=1e-6,
        rope_theta=theta,
        tie_word_embeddings=tie,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms and weights
            p.add_(0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(tmp_path)
    return model.to(dtype)


@pytest.mark.parametrize("tie, theta", [(False, 10000.0), (True, 500000.0)])
def test_load_hf_reproduces_a_transformers_llama(tmp_path, tie, theta) -> None:
    model = llama(tmp_path, tie, theta)
    cfg, params = load_hf(tmp_path)
    assert cfg.n_mtp_heads == 1 and cfg.rope_theta == theta and cfg.dim == 32 and cfg.n_kv_heads == 2
    if tie:
        np.testing.assert_array_equal(params["heads.0"], params["embed"])
    tokens = np.random.default_rng(2).integers(0, 96, (2, 24))
    np.testing.assert_allclose(logits(cfg, params, tokens), hf_logits(model, tokens), rtol=1e-5, atol=1e-5)


def test_load_hf_reads_sharded_folders(tmp_path) -> None:
    model = llama(tmp_path / "one", False, 10000.0)
    model.save_pretrained(tmp_path / "shards", max_shard_size="40KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    cfg, params = load_hf(tmp_path / "shards")
    cfg_one, whole = load_hf(tmp_path / "one")
    assert cfg == cfg_one
    for k in whole:
        np.testing.assert_array_equal(params[k], whole[k])


def test_load_hf_reads_bfloat16(tmp_path) -> None:
    model = llama(tmp_path, False, 10000.0, dtype=torch.bfloat16)
    _, params = load_hf(tmp_path)
    want = model.model.layers[1].mlp.down_proj.weight.detach().float().numpy()
    np.testing.assert_array_equal(params["layers.1.w_down"], want)


def test_load_hf_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_hf(tmp_path)
    cfg = preset("tiny")
    save_hf(cfg, init_params(cfg), tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(conf | {"attention_bias": True}))
    with pytest.raises(ValueError, match="unsupported Llama features"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(conf | {"intermediate_size": 40}))
    with pytest.raises(ValueError, match=r"wrong shapes \['layers.0.w_gate: \(32, 16\) != \(40, 16\)"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    (tmp_path / "model.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_hf(tmp_path)
