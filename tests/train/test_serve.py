"""`euler-train serve` over a socket: the official `openai` client against a live server (a subprocess of
the real CLI on 127.0.0.1), streamed and not, against `euler-train generate`; concurrent requests;
bad requests; a client that leaves mid-stream; the API key."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

openai = pytest.importorskip("openai")

MODULES = "json re csv heapq bisect shutil enum pathlib string random difflib decimal calendar textwrap"
QUESTIONS = [f"What does {name} do?" for name in [*MODULES.split(), "zipfile", "pydoc"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON body) of one request over a plain HTTP connection."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def health(base: str) -> dict:
    return call(base, "GET", "/health")[1]


def start(checkpoint, *flags: str) -> tuple[subprocess.Popen, str]:
    """The server as a subprocess of the CLI; (process, its base URL) once /health answers."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "euler_train.cli",
        "serve",
        "--checkpoint",
        str(checkpoint),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen([*argv, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if call(base, "GET", "/health")[0] == 200:
                return proc, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not come up")


def stop(proc: subprocess.Popen) -> bool:
    """SIGTERM; whether the server ended by it (uvicorn ends the process by the signal once drained)."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30) in (-signal.SIGTERM, 128 + signal.SIGTERM)


@pytest.fixture(scope="module")
def server(chat_run):
    proc, base = start(chat_run, "--max-batch", "16")
    yield base
    assert stop(proc)


def client(base: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def generate(cli, checkpoint, prompt: str, *flags: str) -> str:
    done = cli("generate", "--checkpoint", str(checkpoint), "--chat", "--prompt", prompt, *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout.removesuffix("\n")


def test_chat_streamed_and_not_equal_generate(server, chat_run, cli):
    c = client(server)
    assert [m.id for m in c.models.list().data] == [f"euler-{chat_run.name}"]
    ask = {"model": "euler", "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 30}
    whole = c.chat.completions.create(**ask, temperature=0)
    text = whole.choices[0].message.content
    chunks = c.chat.completions.create(**ask, temperature=0, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text and streamed == text
    assert text == generate(cli, chat_run, QUESTIONS[0], "--temperature", "0", "--max-new-tokens", "30")
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 5
    # sampled with every filter and a seed: what generate samples with the same seed
    sampled = {"temperature": 0.9, "top_p": 0.9, "seed": 3, "extra_body": {"top_k": 20}}
    got = c.chat.completions.create(**ask, **sampled).choices[0].message.content
    flags = (
        "--temperature",
        "0.9",
        "--top-p",
        "0.9",
        "--top-k",
        "20",
        "--seed",
        "3",
        "--max-new-tokens",
        "30",
    )
    assert got == generate(cli, chat_run, QUESTIONS[0], *flags)


@pytest.fixture(scope="module")
def pretrained(tiny_run):
    """A server of the pretrained (not chat-tuned) model: plain completions run on."""
    proc, base = start(tiny_run, "--max-batch", "4")
    yield base
    assert stop(proc)


def test_completions_with_logprobs_and_stop_strings(pretrained, server):
    c = client(pretrained)
    ask = {"model": "euler", "prompt": "The json module", "max_tokens": 8, "temperature": 0}
    done = c.completions.create(**ask, logprobs=3)
    choice, lp = done.choices[0], done.choices[0].logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == done.usage.completion_tokens == 8
    assert choice.finish_reason == "length"
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert (
            logprob <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(logprob)
        )  # greedy: the top
    parts = list(c.completions.create(**ask, stream=True, logprobs=3))
    assert "".join(p.choices[0].text for p in parts if p.choices) == choice.text
    streamed = [p.choices[0].logprobs for p in parts if p.choices and p.choices[0].logprobs]
    assert [o for part in streamed for o in part.text_offset] == lp.text_offset  # offsets into the whole text
    word = choice.text[len(choice.text) // 2 :][:3]  # a stop string from the middle of the text
    cut = c.completions.create(**ask, stop=[word])
    assert (
        cut.choices[0].text == choice.text[: choice.text.find(word)]
        and cut.choices[0].finish_reason == "stop"
    )
    streamed = c.completions.create(**ask, stop=[word], stream=True)
    assert "".join(p.choices[0].text for p in streamed if p.choices) == cut.choices[0].text
    chat_model = client(server)  # its replies end with <|end|> early; ignore_eos (an extension) goes on
    long = chat_model.completions.create(**{**ask, "max_tokens": 30}, extra_body={"ignore_eos": True})
    assert long.usage.completion_tokens == 30 and long.choices[0].finish_reason == "length"
    chat = client(server).chat.completions.create(
        model="euler", messages=[{"role": "user", "content": QUESTIONS[1]}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_sixteen_concurrent_streams_each_equal_its_request_alone(server):
    c = client(server)

    def ask(question: str, stream: bool) -> str:
        kw = {"model": "euler", "messages": [{"role": "user", "content": question}], "max_tokens": 24,
              "temperature": 0}  # fmt: skip
        if not stream:
            return c.chat.completions.create(**kw).choices[0].message.content
        return "".join(
            ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**kw, stream=True)
        )

    alone = [ask(q, stream=False) for q in QUESTIONS]
    together: list[str | None] = [None] * len(QUESTIONS)

    def run(i: int) -> None:
        together[i] = ask(QUESTIONS[i], stream=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(QUESTIONS))]
    steps_before = health(server)["steps"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone
    steps = health(server)["steps"] - steps_before
    assert steps < sum(24 for _ in QUESTIONS) / 4  # the rows shared their decode steps


BAD = [
    (b"{not json", 400, None, "not valid JSON"),
    (json.dumps([1, 2]).encode(), 400, None, "JSON object"),
    ({"messages": "hi"}, 400, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "string"),
    ({"temperature": "hot"}, 400, "temperature", "number"),
    ({"temperature": -1}, 400, "temperature", "[0.0, 2.0]"),
    ({"top_p": 0}, 400, "top_p", "(0.0, 1.0]"),
    ({"max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"max_tokens": 10_000}, 400, "max_tokens", "room"),
    ({"n": 99}, 400, "n", "between 1 and 16"),
    ({"stop": 7}, 400, "stop", "string"),
    ({"stream": "yes"}, 400, "stream", "true or false"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ({"top_logprobs": 50, "logprobs": True}, 400, "top_logprobs", "between 0 and 20"),
    ({"messages": [{"role": "user", "content": "word " * 200}]}, 400, "messages", "context"),
]


@pytest.mark.parametrize("body, status, param, words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_request_gets_one_clear_error_and_the_server_stays_up(server, body, status, param, words):
    if isinstance(body, dict):
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], **body}).encode()
    got, reply = call(server, "POST", "/v1/chat/completions", body)
    assert got == status, reply
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    assert health(server)["status"] == "ok"
    assert (
        client(server)
        .chat.completions.create(model="euler", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        .choices
    )


def test_a_client_that_leaves_mid_stream_frees_its_row(server):
    body = {"messages": [{"role": "user", "content": QUESTIONS[2]}], "max_tokens": 40, "stream": True,
            "temperature": 1.0, "seed": 1}  # fmt: skip
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"}
    )
    reply = conn.getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: ")
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client leaves with the reply half read
    conn.close()
    deadline = time.monotonic() + 10
    while health(server)["rows_busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert health(server)["rows_busy"] == 0


def test_an_api_key_is_asked_for_when_set_and_a_taken_port_is_one_line(chat_run, cli):
    proc, base = start(chat_run, "--api-key", "sesame", "--max-batch", "2")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(base, "wrong").models.list()
        assert (
            client(base, "sesame")
            .chat.completions.create(
                model="euler", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            .choices
        )
        port = base.rsplit(":", 1)[1]
        taken = cli("serve", "--checkpoint", str(chat_run), "--port", port)
        assert taken.returncode == 2 and len(taken.stderr.strip().splitlines()) == 1
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr
    finally:
        assert stop(proc)


def chromium() -> tuple[str, str] | None:
    """(the Chromium binary, its driver) where Debian's chromium and chromium-driver are installed."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.mark.skipif(
    chromium() is None, reason="needs Chromium and its driver (Debian: chromium chromium-driver)"
)
def test_the_page_streams_a_reply_and_shows_each_tokens_probability_and_the_drafts(
    server, chat_run, tmp_path
):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(flag)
    proc, speculating = start(chat_run, "--speculative", "--max-batch", "2")
    page = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)
    try:
        page.get(f"{speculating}/")
        wait = WebDriverWait(page, 60)
        wait.until(lambda p: p.find_element(By.ID, "model").text.startswith("euler-"))
        page.find_element(By.ID, "temperature").clear()
        page.find_element(By.ID, "temperature").send_keys("0")
        page.find_element(By.ID, "max_tokens").clear()
        page.find_element(By.ID, "max_tokens").send_keys("30")
        page.find_element(By.ID, "message").send_keys(QUESTIONS[0])
        page.find_element(By.ID, "send").click()
        wait.until(lambda p: p.find_elements(By.CSS_SELECTOR, ".turn.assistant[data-done='true']"))
        reply = page.find_element(By.CSS_SELECTOR, ".turn.assistant")
        tokens = reply.find_elements(By.CSS_SELECTOR, ".tok")
        want = client(server).chat.completions.create(
            model="euler", messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=30, temperature=0
        )  # the plain server's reply: the same text
        assert tokens and reply.find_element(By.CSS_SELECTOR, ".text").text == want.choices[0].message.content
        assert "tokens/s" in reply.find_element(By.CSS_SELECTOR, ".stats").text
        tokens[0].click()  # the inspector: the token's probability and the alternatives it beat
        detail = page.find_element(By.ID, "detail").text
        assert "probability" in detail and "alternatives" in detail
        assert len(page.find_elements(By.CSS_SELECTOR, "#detail tr")) == 1 + 5  # header + top 5
        drafted = reply.find_elements(By.CSS_SELECTOR, ".tok.drafted")
        assert drafted and "accepted" in reply.find_element(By.CSS_SELECTOR, ".stats").text
        drafted[0].click()
        assert "Drafted by the MTP heads and accepted" in page.find_element(By.ID, "detail").text
        page.save_screenshot(str(tmp_path / "chat_page.png"))
        assert (tmp_path / "chat_page.png").stat().st_size > 10_000
    finally:
        page.quit()
        assert stop(proc)


def test_sigterm_lets_the_request_in_flight_finish(tiny_run):
    proc, base = start(tiny_run, "--max-batch", "2")
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": "euler", "prompt": "The json module", "max_tokens": 40, "temperature": 0, "stream": True}
    conn.request(
        "POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"}
    )
    reply = conn.getresponse()
    first = reply.readline()
    assert first.startswith(b"data: ")
    proc.send_signal(signal.SIGTERM)  # with the reply begun (a tiny model may have made all of it by now)
    whole = (first + reply.read()).decode()
    conn.close()
    assert whole.rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in whole
    assert proc.wait(timeout=30) in (-signal.SIGTERM, 128 + signal.SIGTERM)


def test_the_engine_ends_a_request_whose_probabilities_are_not_finite_and_goes_on():
    """NaN logits: a sampled request ends as not_finite; a greedy one beside it still gets its tokens."""
    import numpy as np

    import euler_model
    from euler_model.sampling import Picker
    from euler_train.sampling import SamplingModel
    from euler_train.serve.engine import Engine, Request

    cfg = euler_model.preset("tiny")
    params = euler_model.init_params(cfg, seed=0)
    params["heads.0"][5] = np.nan  # one row of the head: every logit vector has a NaN
    engine = Engine(SamplingModel(cfg, params, tokenizer=None), slots=2)
    ends: dict[str, str] = {}
    got: dict[str, list[int]] = {"greedy": [], "sampled": []}
    done = threading.Event()

    def request(name: str, picker: Picker) -> Request:
        def end(reason: str) -> None:
            ends[name] = reason
            if len(ends) == 2:
                done.set()

        return Request([1, 2, 3], 4, picker, set(), 0, lambda t, lp, top, spec: got[name].append(t), end)

    try:
        engine.submit(request("sampled", Picker(temperature=1.0)))
        engine.submit(request("greedy", Picker(temperature=0.0)))
        assert done.wait(30)
    finally:
        engine.close()
    assert ends == {"sampled": "not_finite", "greedy": "length"} and len(got["greedy"]) == 4
    with pytest.raises(ValueError, match="prompt tokens"):
        engine.submit(Request(list(range(cfg.context)), 1, Picker(), set(), 0, print, print))


def test_speculative_serving_gives_plain_decodings_tokens_and_marks_the_drafts(chat_run, server):
    """--speculative: the MTP heads draft and each step verifies; greedy and seeded-sampled replies equal the
    plain server's, and each token says whether it was an accepted draft."""
    proc, base = start(chat_run, "--speculative", "--max-batch", "4")
    try:
        fast, plain = client(base), client(server)
        drafted = 0
        for question in QUESTIONS[:6]:
            for sampled in ({"temperature": 0}, {"temperature": 0.8, "seed": 5, "top_p": 0.95}):
                ask = {
                    "model": "euler",
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 30,
                }
                want = plain.chat.completions.create(**ask, **sampled).choices[0].message.content
                reply = fast.chat.completions.create(**ask, **sampled, logprobs=True, top_logprobs=1)
                assert reply.choices[0].message.content == want
                entries = [t.model_dump() for t in reply.choices[0].logprobs.content]
                assert all(isinstance(t["drafted"], bool) for t in entries)
                drafted += sum(t["drafted"] for t in entries)
        assert drafted > 0  # the heads' drafts were accepted: tokens came without a forward of their own
        streamed = fast.chat.completions.create(**ask, temperature=0, stream=True)
        assert (
            "".join(ch.choices[0].delta.content or "" for ch in streamed)
            == plain.chat.completions.create(**ask, temperature=0).choices[0].message.content
        )
    finally:
        assert stop(proc)


def test_completion_logprobs_offsets_continue_from_the_text_before():
    """A stream's later chunk: its tokens' text_offset count from the start of the whole completion."""
    from euler_train.serve.api import completion_logprobs

    class Bytes:
        def token_bytes(self, token: int) -> bytes:
            return {1: b"ab", 2: b"c", 3: b"def"}[token]

    entries = [{"token": t, "logprob": -1.0, "top": [(t, -1.0)]} for t in (1, 2, 3)]
    whole = completion_logprobs(Bytes(), entries)
    assert whole["text_offset"] == [0, 2, 3] and whole["tokens"] == ["ab", "c", "def"]
    first, rest = completion_logprobs(Bytes(), entries[:1]), completion_logprobs(Bytes(), entries[1:], 2)
    assert first["text_offset"] + rest["text_offset"] == whole["text_offset"]
