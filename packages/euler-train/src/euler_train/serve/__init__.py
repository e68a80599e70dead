"""`euler-train serve`: an OpenAI-compatible HTTP server over a checkpoint, requests decoded together.

engine.py decodes (continuous batching over the decode state's rows); api.py speaks the OpenAI HTTP API
(Starlette routes, run by uvicorn).
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn

from euler_train.config import ConfigError
from euler_train.sampling import load_for_sampling, note_if_not_tuned
from euler_train.serve.api import Server, Settings
from euler_train.serve.engine import Engine


def check_address(host: str, port: int) -> None:
    """ConfigError (one line) when the address cannot be listened on: taken, or not this machine's."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def run_serve(args: argparse.Namespace) -> int:
    check_address(args.host, args.port)  # before the model is loaded
    model = load_for_sampling(args.checkpoint, args.device)
    note_if_not_tuned(model)  # chat completions on a model that never saw the chat format
    engine = Engine(model, args.max_batch, args.speculative)
    name = model.folder.parent.parent.name if model.folder.parent.name == "checkpoints" else model.folder.name
    settings = Settings(f"euler-{name}", args.api_key, args.max_body_bytes, args.max_tokens)
    app = Server(model, engine, settings).app()
    print(
        f"euler-train serve: {settings.model_id} ({model.folder}) on http://{args.host}:{args.port}/v1, "
        f"{args.max_batch} rows decoded together on {args.device}"
        + (f", the MTP heads drafting {engine.fed - 1} a step" if engine.tree is not None else ""),
        file=sys.stderr,
    )
    # SIGINT / SIGTERM: uvicorn stops taking connections, lets the requests in flight finish (10 s at most),
    # closes the engine (the app's lifespan), then ends the process by the same signal (exit 130 / 143)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10)
    return 0
