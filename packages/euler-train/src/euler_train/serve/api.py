"""`euler-train serve`'s HTTP API: the OpenAI chat and completions endpoints over the engine (engine.py).

    GET  /v1/models             the one model served
    POST /v1/chat/completions   messages in the model's own chat template; streamed (server-sent events,
                                the OpenAI chunk format) or not; n, logprobs / top_logprobs
    POST /v1/completions        a plain prompt continued; logprobs as the legacy API has them
    GET  /health                {"status", "rows_busy", "rows", "steps"}
    GET  /                      the chat page (page/): replies streamed, each token coloured by the model's
                                probability of it, the alternatives it beat on a click, time to first
                                token and tokens/s, the settings, the conversation as JSON

Starlette serves it (uvicorn runs it). Bad input gets a 400 in the OpenAI error shape
({"error": {"message", "type", "param", "code"}}) naming the field, before anything is queued: JSON that
does not parse, a known field of the wrong type or out of range, a prompt that leaves the context no room.
Fields the API has and this server does not take (a penalty other than 0, echo, best_of) are refused the
same way, never silently ignored; fields it does not know are ignored, as OpenAI's clients send extras.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from euler_model.sampling import Picker
from euler_train.sampling import END, EOT, SamplingModel, encode_prompt, prompt_ids, stop_ids
from euler_train.serve.engine import Engine, Request

PAGE = Path(__file__).parent / "page"  # the chat page's files
STREAM_INTERVAL_S = 0.02  # a stream's chunks at most this often: tokens that come faster share one
MAX_STOPS = 4  # stop strings a request may give (the API's limit)
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs at most (completions' logprobs: 5)


class BadRequest(ValueError):
    """A request the server refuses: its status, message and the field it names."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "") -> None:
        super().__init__(message)
        self.param, self.status = param, status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")


def error_response(err: BadRequest) -> JSONResponse:
    body = {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": None}}
    return JSONResponse(body, status_code=err.status)


@dataclass
class Settings:
    """What the server was started with (the command line's flags)."""

    model_id: str
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_tokens: int | None = None  # a request's max_tokens at most (None: the context's room)


# --- reading a request -------------------------------------------------------------------------------
def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number, got {json.dumps(value)}", name)
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise BadRequest(f"{name} must be in {bound}, got {value}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {json.dumps(value)}", name)
    if value < low or (high is not None and value > high):
        within = f"between {low} and {high}" if high is not None else f">= {low}"
        raise BadRequest(f"{name} must be {within}, got {value}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {json.dumps(value)}", name)
    return value


def _stops(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequest("stop must be a non-empty string or a list of them", "stop")
    if len(items) > MAX_STOPS:
        raise BadRequest(f"stop takes at most {MAX_STOPS} strings, got {len(items)}", "stop")
    return items


def _unsupported(body: dict) -> None:
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise BadRequest(f"{name} is not supported by this server (use repetition_penalty)", name)
    if body.get("echo"):
        raise BadRequest("echo is not supported by this server", "echo")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("best_of is not supported by this server", "best_of")
    if body.get("logit_bias"):
        raise BadRequest("logit_bias is not supported by this server", "logit_bias")


def _messages(body: dict) -> list[dict[str, str]]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise BadRequest("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(
                f"messages[{i}] needs a role of system, user or assistant", f"messages[{i}].role"
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones joined
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", f"messages[{i}]")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", f"messages[{i}].content")
        out.append({"role": m["role"], "content": content})
    if out[-1]["role"] == "assistant":
        raise BadRequest("the last message must be the user's (or the system's)", "messages")
    return out


@dataclass
class Job:
    """One request, read and checked: its prompt ids and how to decode it."""

    prompt: list[int]
    limit: int
    picker: Picker
    seed: int | None
    n: int
    stream: bool
    stops: list[str]
    top_logprobs: int | None
    include_usage: bool = False
    ignore_eos: bool = False  # an extension (vLLM's): <|end|> and <|endoftext|> do not end it (benchmarks)


def read_job(body: Any, model: SamplingModel, settings: Settings, chat: bool, slots: int) -> Job:
    """The request body checked into a Job (BadRequest naming the first problem)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model_name = body.get("model")
    if model_name is not None and not isinstance(model_name, str):
        raise BadRequest("model must be a string", "model")
    _unsupported(body)
    tok, context = model.tokenizer, model.mcfg.context
    if chat:
        ids = encode_prompt(tok, _messages(body))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = list(prompt)
            if min(ids) < 0 or max(ids) >= model.mcfg.vocab_size:
                raise BadRequest(f"prompt token ids must be in [0, {model.mcfg.vocab_size})", "prompt")
        elif isinstance(prompt, str):
            ids = prompt_ids(tok, prompt) or [tok.special_tokens[EOT]]
        else:
            raise BadRequest("prompt must be a string (or one list of token ids)", "prompt")
    room = context - len(ids)
    if room < 1:
        raise BadRequest(
            f"the prompt has {len(ids)} tokens; the model's context holds {context}, with room for at least "
            "one new token",
            "messages" if chat else "prompt",
        )
    most = room if settings.max_tokens is None else min(room, settings.max_tokens)
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    limit = _integer(body, name, None, 1)
    if limit is not None and limit > most:
        why = (
            f"the context's room after the {len(ids)}-token prompt" if most == room else "this server's limit"
        )
        raise BadRequest(f"{name} is {limit}; at most {most} ({why})", name)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", 0, 0)  # an extension (vLLM's): 0 or absent is no cut
    penalty = _number(body, "repetition_penalty", 1.0, 0.0, 10.0, low_open=True)
    seed = _integer(body, "seed", None, 0, 2**63 - 1)
    n = _integer(body, "n", 1, 1, slots)
    stream = _flag(body, "stream")
    if chat:
        top = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) if _flag(body, "logprobs") else None
        if body.get("top_logprobs") and not _flag(body, "logprobs"):
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    else:
        top = _integer(body, "logprobs", None, 0, 5)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    picker = Picker(temperature, top_k or None, top_p if top_p < 1.0 else None, penalty)
    usage, ignore_eos = bool(options.get("include_usage")), _flag(body, "ignore_eos")
    return Job(ids, limit or most, picker, seed, n, stream, _stops(body), top, usage, ignore_eos)


# --- one choice's text -------------------------------------------------------------------------------
@dataclass
class Choice:
    """What one row produced so far: its tokens, its text (stop strings applied) and why it ended."""

    tok: Any
    stops: list[str]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of text already streamed
    logprobs: list[dict] = field(default_factory=list)
    finish: str | None = None

    def __post_init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int, logprob: float | None, top: list[tuple[int, float]], spec: Any = None) -> bool:
        """Take a new token (spec: the engine's (drafted, rejected) when it speculates); True when a stop
        string ended the text."""
        self.tokens.append(token)
        self.text += self.decoder.decode(self.tok.token_bytes(token))
        if logprob is not None:
            self.logprobs.append({"token": token, "logprob": logprob, "top": top, "spec": spec})
        for stop in self.stops:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.finish = self.text[:at], "stop"
                return True
        return False

    def ready(self, final: bool) -> str:
        """Text not streamed yet that no stop string can still take back (all of it when final)."""
        hold = 0 if final or not self.stops else max(len(s) for s in self.stops) - 1
        end = max(self.sent, len(self.text) - hold)
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def end(self, reason: str) -> None:
        """The row ended (the engine's reason); a stop string that ended the text first keeps "stop"."""
        if self.finish is None:
            self.text += self.decoder.decode(b"", final=True)  # a character left unfinished: U+FFFD
            self.finish = reason


def token_text(tok: Any, token: int) -> tuple[str, list[int]]:
    raw = tok.token_bytes(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tok: Any, entries: list[dict]) -> dict:
    """The chat API's logprobs of some tokens; where the server speculates, each entry also says whether
    the token was an accepted draft of the MTP heads (`drafted`) and which draft head 0 turned down after
    it (`rejected_draft`, or null): fields of this server's, beside the API's."""

    def one(token: int, logprob: float) -> dict:
        text, raw = token_text(tok, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = []
    for e in entries:
        item = {**one(e["token"], e["logprob"]), "top_logprobs": [one(t, lp) for t, lp in e["top"]]}
        if e.get("spec") is not None:
            drafted, rejected = e["spec"]
            item["drafted"] = drafted
            item["rejected_draft"] = None if rejected is None else token_text(tok, rejected)[0]
        content.append(item)
    return {"content": content}


def completion_logprobs(tok: Any, entries: list[dict], start: int = 0) -> dict:
    """The completions API's logprobs of some tokens; `start`: the offset of the first one in the text (a
    stream's later chunks)."""
    texts = [token_text(tok, e["token"])[0] for e in entries]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{token_text(tok, t)[0]: lp for t, lp in e["top"]} for e in entries],
        "text_offset": offsets,
    }


# --- the app -----------------------------------------------------------------------------------------
class Server:
    """The routes over one engine."""

    def __init__(self, model: SamplingModel, engine: Engine, settings: Settings) -> None:
        self.model, self.engine, self.settings = model, engine, settings
        self.stop_tokens = set(stop_ids(model.tokenizer, (END, EOT)))
        self.mail: list[tuple[asyncio.Queue, tuple]] = []  # engine events not yet handed to their requests
        self.mail_lock = threading.Lock()
        self.mail_due = False  # a delivery is scheduled on the event loop

    def _post(self, loop: Any, events: asyncio.Queue, event: tuple) -> None:
        """From the engine's thread: queue an event for a request; the event loop is woken once for all the
        events of a step, not once for each."""
        with self.mail_lock:
            self.mail.append((events, event))
            if self.mail_due:
                return
            self.mail_due = True
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.mail_lock:
            mail, self.mail, self.mail_due = self.mail, [], False
        for events, event in mail:
            events.put_nowait(event)

    def app(self) -> Starlette:
        routes = [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/", self.page, methods=["GET"]),
            Mount("/static", StaticFiles(directory=PAGE), name="static"),
        ]
        return Starlette(routes=routes, exception_handlers={BadRequest: self._bad}, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        """The engine stops with the server (after uvicorn has let the requests in flight finish)."""
        yield
        await asyncio.to_thread(self.engine.close)

    async def _bad(self, _: HttpRequest, err: Exception) -> Response:
        return error_response(err)  # type: ignore[arg-type]

    def _check_key(self, request: HttpRequest) -> None:
        key = self.settings.api_key
        if key and request.headers.get("authorization", "") != f"Bearer {key}":
            raise BadRequest(
                "a valid API key is needed (Authorization: Bearer KEY)",
                status=401,
                kind="authentication_error",
            )

    async def _body(self, request: HttpRequest) -> Any:
        self._check_key(request)
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(f"the body has {declared} bytes; this server takes at most {limit}", status=413)
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise BadRequest(f"the body is over {limit} bytes, this server's limit", status=413)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BadRequest(f"the body is not valid JSON: {err}") from None

    async def models(self, request: HttpRequest) -> Response:
        self._check_key(request)
        card = {"id": self.settings.model_id, "object": "model", "created": 0, "owned_by": "euler"}
        return JSONResponse({"object": "list", "data": [card]})

    async def page(self, _: HttpRequest) -> Response:
        """The chat page (page/: static files shipped in the package, nothing from the network)."""
        return FileResponse(PAGE / "index.html")

    async def health(self, _: HttpRequest) -> Response:
        status = "ok" if self.engine.error is None and self.engine.thread.is_alive() else "failed"
        return JSONResponse(
            {
                "status": status,
                "rows_busy": self.engine.busy_rows(),
                "rows": self.engine.slots,
                "steps": self.engine.steps,
            },
            status_code=200 if status == "ok" else 500,
        )

    async def chat(self, request: HttpRequest) -> Response:
        return await self._serve(request, chat=True)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._serve(request, chat=False)

    async def _serve(self, request: HttpRequest, chat: bool) -> Response:
        job = read_job(await self._body(request), self.model, self.settings, chat, self.engine.slots)
        if self.engine.error is not None:
            raise BadRequest(f"the decoding engine failed: {self.engine.error}", status=500)
        events: asyncio.Queue = asyncio.Queue()
        choices, rows = self._submit(job, events, asyncio.get_running_loop())
        head = {
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
            "created": int(time.time()),
            "model": self.settings.model_id,
        }
        if job.stream:
            stream = self._stream(job, chat, head, events, choices, rows)
            return StreamingResponse(stream, media_type="text/event-stream")
        try:
            await self._wait(request, events, choices, rows)
        finally:
            for row in rows:
                row.cancelled = True  # a no-op for the rows that ended; frees those of a client that left
        if any(c.finish == "not_finite" for c in choices):
            raise BadRequest("the model's probabilities are not finite (NaN or inf logits)", status=500)
        if any(c.finish == "error" for c in choices):
            raise BadRequest(f"the decoding engine failed: {self.engine.error}", status=500)
        return JSONResponse(self._whole(job, chat, head, choices))

    def _submit(self, job: Job, events: asyncio.Queue, loop: Any) -> tuple[list[Choice], list[Request]]:
        choices, rows = [], []
        for i in range(job.n):
            choice = Choice(self.model.tokenizer, job.stops)

            def on_token(token: int, logprob: float | None, top: list, spec: Any, i: int = i) -> None:
                self._post(loop, events, ("token", i, token, logprob, top, spec))

            def on_end(reason: str, i: int = i) -> None:
                self._post(loop, events, ("end", i, reason, None, None, None))

            seed = None if job.seed is None else job.seed + i
            stops = set() if job.ignore_eos else self.stop_tokens
            row = Request(job.prompt, job.limit, job.picker, stops, seed, on_token, on_end, job.top_logprobs)
            choices.append(choice)
            rows.append(row)
            self.engine.submit(row)
        return choices, rows

    @staticmethod
    def _take(event: tuple, choices: list[Choice], rows: list[Request]) -> None:
        """Apply one engine event to its choice."""
        kind, i, a, b, c, d = event
        if kind == "token" and choices[i].finish is None:
            if choices[i].add(a, b, c, d):
                rows[i].cancelled = True  # a stop string: the row ends at the next step
        elif kind == "end":
            choices[i].end(a)

    async def _wait(self, request: HttpRequest, events: asyncio.Queue, choices: list, rows: list) -> None:
        """Until every choice has ended (a client that leaves cancels its rows)."""
        ended = 0
        while ended < len(choices):
            try:
                event = await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            self._take(event, choices, rows)
            ended += event[0] == "end"

    def _usage(self, job: Job, choices: list[Choice]) -> dict:
        completion = sum(len(c.tokens) for c in choices)
        prompt = len(job.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _whole(self, job: Job, chat: bool, head: dict, choices: list[Choice]) -> dict:
        tok, out = self.model.tokenizer, []
        for i, c in enumerate(choices):
            if chat:
                lp = chat_logprobs(tok, c.logprobs) if job.top_logprobs is not None else None
                out.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": lp,
                        "finish_reason": c.finish,
                    }
                )
            else:
                lp = completion_logprobs(tok, c.logprobs) if job.top_logprobs is not None else None
                out.append({"index": i, "text": c.text, "logprobs": lp, "finish_reason": c.finish})
        kind = "chat.completion" if chat else "text_completion"
        return {**head, "object": kind, "choices": out, "usage": self._usage(job, choices)}

    async def _stream(
        self,
        job: Job,
        chat: bool,
        head: dict,
        events: asyncio.Queue,
        choices: list[Choice],
        rows: list[Request],
    ) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        tok = self.model.tokenizer

        offsets = [0] * len(choices)  # completions: each choice's text before its next chunk's tokens

        def chunk(i: int, piece: str, finish: str | None, entries: list[dict], first: bool = False) -> str:
            lp = None
            if job.top_logprobs is not None and entries:
                lp = chat_logprobs(tok, entries) if chat else completion_logprobs(tok, entries, offsets[i])
                if not chat:  # the next chunk's tokens start where these end
                    offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            if chat:
                delta = (
                    {"role": "assistant", "content": piece}
                    if first
                    else ({"content": piece} if piece else {})
                )
                choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": i, "text": piece, "logprobs": lp, "finish_reason": finish}
            return "data: " + json.dumps({**head, "object": kind, "choices": [choice]}) + "\n\n"

        try:
            if chat:
                for i in range(len(choices)):
                    yield chunk(i, "", None, [], first=True)
            ended, logged = [False] * len(choices), [0] * len(choices)
            sent_at = [0.0] * len(choices)  # when each choice's last chunk went out (0: none yet)
            while not all(ended):
                batch = [await events.get()]
                while not events.empty():  # what else came meanwhile goes out in the same chunks
                    batch.append(events.get_nowait())
                for event in batch:
                    self._take(event, choices, rows)
                    ended[event[1]] |= event[0] == "end"
                now = time.monotonic()
                for i, c in enumerate(choices):
                    if not ended[i] and sent_at[i] and now - sent_at[i] < STREAM_INTERVAL_S:
                        continue  # tokens that come faster than that go out together
                    piece, entries = c.ready(ended[i]), c.logprobs[logged[i] :]
                    if piece or entries or (ended[i] and sent_at[i] >= 0):
                        logged[i], sent_at[i] = len(c.logprobs), now if not ended[i] else -1.0
                        yield chunk(i, piece, c.finish if ended[i] else None, entries)
            if job.include_usage:
                yield (
                    "data: "
                    + json.dumps({**head, "object": kind, "choices": [], "usage": self._usage(job, choices)})
                    + "\n\n"
                )
            yield "data: [DONE]\n\n"
        finally:
            for row in rows:
                row.cancelled = True  # a client that left mid-stream frees its rows at the next step
