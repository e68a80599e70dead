"""HF interop: save_hf folders load in transformers with equal logits; load_hf reads Llama folders."""

from __future__ import annotations

import inspect
import json
import os
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer
from euler_data import CHAT_TEMPLATE, encode_chat, render_chat
from euler_model import init_params, load_hf, logits, preset, save_hf
from euler_model.hf import FILE_MODE, MTP_FILE

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


# --- the tokenizer side: special tokens, chat template, stop ids, file modes ---------------------------
CHAT_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
CHAT_FILES = sorted([*CHAT_FILES, MTP_FILE, "tokenizer_config.json"])
CONVERSATIONS = [
    [{"role": "user", "content": "What does json do?"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
    [
        {"role": "user", "content": "What does textwrap.dedent do?"},
        {"role": "assistant", "content": "It removes common leading\n    whitespace.\n\n"},
        {"role": "user", "content": "And   indent?\tIt adds  "},
        {"role": "assistant", "content": "Prefixes, e.g. '    '. 日本 🎉"},
        {"role": "user", "content": ""},
    ],
]


@pytest.fixture(scope="module")
def chat_tok() -> Tokenizer:
    """A chat tokenizer trained on real text (stdlib sources: prose, code, many whitespace merges)."""
    sources = [inspect.getsource(m) for m in (json, textwrap, inspect)]
    return Tokenizer.train(sources, vocab_size=400, special_tokens=CHAT_SPECIAL_TOKENS)


def export_chat(folder, tok: Tokenizer, eos=("<|end|>", "<|endoftext|>")):
    cfg = preset("tiny", vocab_size=tok.vocab_size)
    meta = {"eos_tokens": eos, "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}
    return save_hf(cfg, init_params(cfg, seed=0), folder, tokenizer=tok, **meta)


@pytest.fixture(scope="module")
def hf_chat(tmp_path_factory, chat_tok):
    """The exported folder's tokenizer as transformers' AutoTokenizer loads it."""
    folder = export_chat(tmp_path_factory.mktemp("hf") / "chat", chat_tok)
    return transformers.AutoTokenizer.from_pretrained(folder)


def hf_chat_ids(hf_tok, messages, add_generation_prompt: bool) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # transformers 5 returns a dict


def test_auto_tokenizer_has_the_special_tokens_eos_pad_and_template(hf_chat, chat_tok) -> None:
    ids = chat_tok.special_tokens
    assert hf_chat.eos_token == "<|end|>" and hf_chat.eos_token_id == ids["<|end|>"]
    assert hf_chat.pad_token == "<|endoftext|>" and hf_chat.pad_token_id == ids["<|endoftext|>"]
    assert hf_chat.bos_token is None
    assert sorted(hf_chat.all_special_tokens) == sorted(CHAT_SPECIAL_TOKENS)
    assert hf_chat.chat_template == CHAT_TEMPLATE
    assert len(hf_chat) == chat_tok.vocab_size
    for name, i in ids.items():  # each special is one token, in text as in decoding
        assert hf_chat.encode(f"a{name}b") == chat_tok.encode(f"a{name}b", allowed_special="all")
        assert hf_chat.decode([i]) == name


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one", "two", "five"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_apply_chat_template_gives_euler_chat_ids(hf_chat, chat_tok, messages, add_generation_prompt) -> None:
    ids = encode_chat(chat_tok, messages, add_generation_prompt=add_generation_prompt)[0]
    assert hf_chat_ids(hf_chat, messages, add_generation_prompt) == ids
    assert hf_chat.decode(ids) == render_chat(messages, add_generation_prompt=add_generation_prompt)


def test_a_byte_level_tokenizer_chats_with_the_same_ids(tmp_path) -> None:
    tok = Tokenizer.byte_level(CHAT_SPECIAL_TOKENS)  # euler-data prepare --tokenizer bytes
    hf_tok = transformers.AutoTokenizer.from_pretrained(export_chat(tmp_path, tok))
    assert hf_tok.eos_token_id == tok.special_tokens["<|end|>"] and len(hf_tok) == 260
    for messages in CONVERSATIONS:
        assert (
            hf_chat_ids(hf_tok, messages, True) == encode_chat(tok, messages, add_generation_prompt=True)[0]
        )


# The two encodings agree on content that neither begins with whitespace (HF tokenizes the role's newline
# together with it, euler encodes the newline alone) nor holds a special token's text (HF matches it).
content = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30).filter(
    lambda t: not t[:1].isspace() and not any(s in t for s in CHAT_SPECIAL_TOKENS)
)


@given(contents=st.lists(content, min_size=1, max_size=4))
def test_apply_chat_template_equals_encode_chat_on_any_such_content(hf_chat, chat_tok, contents) -> None:
    messages = [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]
    ids = encode_chat(chat_tok, messages, add_generation_prompt=True)[0]
    assert hf_chat_ids(hf_chat, messages, True) == ids


def test_the_two_documented_differences(hf_chat, chat_tok) -> None:
    """Content that begins with whitespace, or holds a special token's text, may encode otherwise in HF."""
    for text in ["    self", "a <|user|> b"]:
        messages = [{"role": "user", "content": text}]
        ids = encode_chat(chat_tok, messages, add_generation_prompt=True)[0]
        hf_ids = hf_chat_ids(hf_chat, messages, True)
        assert hf_ids != ids and hf_chat.decode(hf_ids) == hf_chat.decode(ids) == render_chat(messages, True)


def test_the_config_files_name_the_stop_and_pad_ids(tmp_path, chat_tok) -> None:
    end, eot = chat_tok.special_tokens["<|end|>"], chat_tok.special_tokens["<|endoftext|>"]
    chat = export_chat(tmp_path / "chat", chat_tok)
    gen = transformers.GenerationConfig.from_pretrained(chat)
    assert gen.eos_token_id == [end, eot] and gen.pad_token_id == eot and gen.bos_token_id is None
    config = transformers.AutoConfig.from_pretrained(chat)
    assert config.eos_token_id == [end, eot] and config.pad_token_id == eot
    pretrain = export_chat(tmp_path / "pretrain", chat_tok, eos=("<|endoftext|>",))
    assert transformers.GenerationConfig.from_pretrained(pretrain).eos_token_id == eot
    assert transformers.AutoTokenizer.from_pretrained(pretrain).eos_token == "<|endoftext|>"


@pytest.mark.parametrize("umask", [0o077, 0o022])
def test_every_file_is_written_0644_whatever_the_umask(tmp_path, chat_tok, umask) -> None:
    old = os.umask(umask)
    try:
        folder = export_chat(tmp_path / "out", chat_tok)
    finally:
        os.umask(old)
    assert sorted(p.name for p in folder.iterdir()) == CHAT_FILES
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
    assert modes == {name: oct(FILE_MODE) for name in CHAT_FILES} and FILE_MODE == 0o644
    assert oct(folder.stat().st_mode & 0o777) == oct(0o755)


def test_tokenizer_metadata_errors_write_nothing(tmp_path, chat_tok) -> None:
    cfg = preset("tiny", vocab_size=chat_tok.vocab_size)
    params = init_params(cfg)
    with pytest.raises(ValueError, match=r"\['<\|stop\|>'\] are not special tokens of the tokenizer"):
        save_hf(cfg, params, tmp_path / "a", tokenizer=chat_tok, eos_tokens=["<|stop|>"])
    with pytest.raises(ValueError, match="need a tokenizer"):
        save_hf(cfg, params, tmp_path / "b", eos_tokens=["<|end|>"])
    with pytest.raises(ValueError, match="a sequence of names"):
        save_hf(cfg, params, tmp_path / "c", tokenizer=chat_tok, eos_tokens="<|end|>")
    small = preset("tiny", vocab_size=chat_tok.vocab_size - 2)  # <|assistant|> and <|end|> beyond it
    with pytest.raises(ValueError, match=r"outside the model's vocab \(398\)"):
        save_hf(small, init_params(small), tmp_path / "d", tokenizer=chat_tok, eos_tokens=["<|end|>"])
    assert list(tmp_path.iterdir()) == []


def test_a_re_export_with_one_head_drops_the_old_mtp_file(tmp_path) -> None:
    save_hf(preset("tiny"), init_params(preset("tiny")), tmp_path)
    one = preset("tiny", n_mtp_heads=1)
    save_hf(one, init_params(one), tmp_path)
    assert not (tmp_path / MTP_FILE).exists() and load_hf(tmp_path)[0] == one
