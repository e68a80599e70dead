"""CHAT_TEMPLATE (Jinja, for Hugging Face's apply_chat_template) renders exactly what render_chat does,
a leading system message included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_data import CHAT_TEMPLATE, encode_chat, render_chat
from euler_data.chat import ROLES

jinja2 = pytest.importorskip("jinja2")
sandbox = pytest.importorskip("jinja2.sandbox")

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
turns = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": text}), max_size=5)
system_first = st.tuples(text, text, turns).map(
    lambda t: [{"role": "system", "content": t[0]}, {"role": "user", "content": t[1]}, *t[2]]
)
conversations = turns | system_first


def raise_exception(message: str):
    raise jinja2.TemplateError(message)


def render(messages, add_generation_prompt: bool, trim: bool) -> str:
    """The template rendered as transformers does it (sandboxed; trim_blocks/lstrip_blocks) or plainly."""
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(CHAT_TEMPLATE)
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("trim", [True, False])
@given(messages=conversations, add_generation_prompt=st.booleans())
def test_the_jinja_template_renders_what_render_chat_does(messages, add_generation_prompt, trim) -> None:
    assert render(messages, add_generation_prompt, trim) == render_chat(messages, add_generation_prompt)


def test_a_multi_turn_conversation_renders_the_documented_text() -> None:
    msgs = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?\n"},
    ]
    want = "<|user|>\nName a colour.<|end|>\n<|assistant|>\nBlue.<|end|>\n<|user|>\nAnother?\n<|end|>"
    assert render(msgs, False, True) == want
    assert render(msgs, True, True) == want + "\n<|assistant|>\n"
    assert render([], True, True) == render_chat([], add_generation_prompt=True) == "<|assistant|>\n"


SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ([{"role": "user", "content": ["x"]}], r"role: system\|user\|assistant"),
        ([{"role": "tool", "content": "x"}], r"role: system\|user\|assistant"),
        ([SYSTEM], "system message must be the first message and be followed by a user message"),
        ([USER, SYSTEM, USER], "system message must be the first"),
        ([SYSTEM, {"role": "assistant", "content": "Yo"}], "followed by a user message"),
        ([SYSTEM, SYSTEM, USER], "followed by a user message"),
    ],
)
def test_the_template_refuses_what_render_chat_refuses(bad, why) -> None:
    with pytest.raises(ValueError, match="render_chat: message"):
        render_chat(bad)
    with pytest.raises(jinja2.TemplateError, match=why):
        render(bad, True, True)


def test_a_system_message_opens_the_first_user_turn() -> None:
    msgs = [SYSTEM, USER, {"role": "assistant", "content": "Hello."}]
    want = "<|user|>\nBe brief.\n\nHi<|end|>\n<|assistant|>\nHello.<|end|>"
    assert render_chat(msgs) == render(msgs, False, True) == want


def test_transformers_apply_chat_template_matches_render_chat_and_encode_chat(tmp_path, tok) -> None:
    transformers = pytest.importorskip("transformers")
    tok.to_hf(tmp_path / "tokenizer.json")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    hf.chat_template = CHAT_TEMPLATE
    conversations = [
        [SYSTEM, USER, {"role": "assistant", "content": "Hello.\n"}, {"role": "user", "content": "Again?"}],
        [SYSTEM, USER],
        [USER, {"role": "assistant", "content": "Yo"}],
    ]
    for msgs in conversations:
        for prompt in (False, True):
            assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt) == render_chat(
                msgs, add_generation_prompt=prompt
            )
            out = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=prompt)
            ids = list(out["input_ids"] if hasattr(out, "keys") else out)  # transformers 5 returns a dict
            assert ids == encode_chat(tok, msgs, add_generation_prompt=prompt)[0]
    with pytest.raises(jinja2.TemplateError, match="followed by a user message"):
        hf.apply_chat_template([SYSTEM], tokenize=False)
