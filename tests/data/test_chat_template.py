"""CHAT_TEMPLATE (Jinja, for Hugging Face's apply_chat_template) renders exactly what render_chat does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_data import CHAT_TEMPLATE, render_chat
from euler_data.chat import ROLES

jinja2 = pytest.importorskip("jinja2")
sandbox = pytest.importorskip("jinja2.sandbox")

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)
conversations = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": text}), max_size=5)


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


@pytest.mark.parametrize("bad", [[{"role": "system", "content": "x"}], [{"role": "user", "content": ["x"]}]])
def test_the_template_refuses_what_render_chat_refuses(bad) -> None:
    with pytest.raises(ValueError, match="render_chat"):
        render_chat(bad)
    with pytest.raises(jinja2.TemplateError, match=r"role: user\|assistant"):
        render(bad, True, True)
