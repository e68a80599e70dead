"""export-hf of real checkpoints: transformers' tokenizer chats like euler, and HF generate stops at <|end|>.

The chat model is really trained: conftest's `chat_run`, `euler-train sft` (a subprocess) on top of the tiny
pretrain run, on "What does NAME do?" questions answered by the first words of NAME's docstring, long
enough that its greedy answers end with <|end|> (checked below against euler's own greedy decoding).
"""

from __future__ import annotations

import json

import pytest

from euler_data import CHAT_TEMPLATE, encode_chat
from euler_model.hf import FILE_MODE, MTP_FILE
from euler_train.sampling import load_for_sampling
from tests.train.conftest import docstrings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FILES = ["config.json", "generation_config.json", "model.safetensors", MTP_FILE]
FILES = sorted([*FILES, "tokenizer.json", "tokenizer_config.json"])
QUESTIONS = [f"What does {name} do?" for name, _ in docstrings()[:6]]


def export(cli, run, out):
    proc = cli("export-hf", "--checkpoint", str(run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def chat_ids(hf_tok, messages) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # transformers 5 returns a dict


@pytest.mark.slow
def test_hf_generate_on_an_sft_export_stops_at_end_like_euler(chat_run, tmp_path, cli) -> None:
    import euler_model

    folder = export(cli, chat_run, tmp_path / "hf")
    assert sorted(p.name for p in folder.iterdir()) == FILES
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {FILE_MODE}
    ours = load_for_sampling(str(chat_run))
    tok, context = ours.tokenizer, ours.mcfg.context
    end, eot = tok.special_tokens["<|end|>"], tok.special_tokens["<|endoftext|>"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert (hf_tok.eos_token, hf_tok.pad_token, hf_tok.chat_template) == (
        "<|end|>",
        "<|endoftext|>",
        CHAT_TEMPLATE,
    )
    model = transformers.LlamaForCausalLM.from_pretrained(folder).float().eval()
    assert model.generation_config.eos_token_id == [end, eot]
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        ids = encode_chat(tok, messages, add_generation_prompt=True)[0]
        assert chat_ids(hf_tok, messages) == ids
        room = context - len(ids)
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=room,
                do_sample=False,
            )
        new = out[0, len(ids) :].tolist()
        assert new[-1] == end and len(new) < room, (question, hf_tok.decode(new))
        greedy = list(
            euler_model.generate(ours.mcfg, ours.params, ids, room, temperature=0.0, stop_tokens=(end, eot))
        )
        assert new == [*greedy, end]
        assert hf_tok.decode(new, skip_special_tokens=True) == tok.decode(greedy)


@pytest.mark.slow
def test_the_sft_export_chats_with_euler_ids_over_several_turns(chat_run, tmp_path, cli) -> None:
    folder = export(cli, chat_run, tmp_path / "hf")
    tok = load_for_sampling(str(chat_run)).tokenizer
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    answers = ["Return the", "Create a new parser.", "It\nsplits  text\n\n into lines."]
    history: list[dict[str, str]] = []
    for question, answer in zip(QUESTIONS, answers):
        history.append({"role": "user", "content": question})
        assert chat_ids(hf_tok, history) == encode_chat(tok, history, add_generation_prompt=True)[0]
        history.append({"role": "assistant", "content": answer})


def test_a_pretrain_export_ends_at_endoftext(tiny_run, tmp_path, cli) -> None:
    folder = export(cli, tiny_run, tmp_path / "hf")
    assert sorted(p.name for p in folder.iterdir()) == FILES
    tok = load_for_sampling(str(tiny_run)).tokenizer
    eot = tok.special_tokens["<|endoftext|>"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.pad_token_id == eot
    assert transformers.GenerationConfig.from_pretrained(folder).eos_token_id == eot
    config = json.loads((folder / "config.json").read_text())
    assert config["eos_token_id"] == eot and config["pad_token_id"] == eot
    text = "The json module encodes and decodes."
    assert hf_tok.encode(text) == tok.encode(text)
