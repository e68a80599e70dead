"""`euler-train serve` under load: aggregate tokens/s of N concurrent streams against generate_batch at
batch N on the same weights, prompts and lengths, and the time to first token under that load.

The server runs as a subprocess of the real CLI (`--max-batch N`) on 127.0.0.1. N clients (threads with
plain HTTP connections) each send streamed /v1/completions requests back to back for --seconds: the
same --prompt-len random token ids as generate_batch gets, greedy, --new-tokens each with `ignore_eos`
(every row makes all of them, as in bench_generate.py). The server's figure is every token streamed over
the window's wall time (HTTP, JSON, server-sent events and each request's prefill included: a sustained
load, the batch kept full as requests end and new ones join); generate_batch's is the tokens of one call
over its time (prefill included), best of --repeats, in this process. BLAS runs one thread on both sides.
The load averages before and after are printed.

Run (from the repository root):
  hatch run bench:python benchmarks/bench_serve.py --checkpoint runs/small --streams 8
  hatch run bench:python benchmarks/bench_serve.py --checkpoint runs/gpu --device gpu --streams 32
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"  # before NumPy loads

import numpy as np

from euler_model import generate_batch
from euler_train.sampling import load_for_sampling


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: str, device: str, streams: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [sys.executable, "-m", "euler_train.cli", "serve", "--checkpoint", checkpoint, "--port", str(port),
            "--device", device, "--max-batch", str(streams)]  # fmt: skip
    log = tempfile.TemporaryFile()  # the server's stderr: its tail is shown if it does not come up
    proc = subprocess.Popen(argv, stderr=log, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    log.seek(0)
    tail = log.read().decode(errors="replace")[-3000:]
    raise SystemExit(f"the server did not come up (exit {proc.returncode}); its stderr ends:\n{tail}")


def one_stream(port: int, prompt: list[int], n: int, out: dict, sent_at: float) -> None:
    """One streamed completion; out gets its tokens, first-token time and end time (from sent_at)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "euler", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"content-type": "application/json"}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    reply = conn.getresponse()
    first = None
    for line in reply:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["text"] and first is None:
            first = time.monotonic() - sent_at
        if chunk.get("usage"):
            out["tokens"] = chunk["usage"]["completion_tokens"]
    out["ttft"], out["end"] = first, time.monotonic() - sent_at
    conn.close()


def sustained(port: int, prompts: list[list[int]], n: int, seconds: float) -> tuple[float, int, list[float]]:
    """(wall seconds, tokens, times to first token) of one client per prompt sending it back to back until
    `seconds` have passed (requests begun by then finish and count)."""
    start = time.monotonic()
    outs: list[list[dict]] = [[] for _ in prompts]

    def client(prompt: list[int], done: list[dict]) -> None:
        while time.monotonic() - start < seconds:
            out: dict = {}
            one_stream(port, prompt, n, out, time.monotonic())
            done.append(out)

    threads = [threading.Thread(target=client, args=(p, o)) for p, o in zip(prompts, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = [o for done in outs for o in done]
    return time.monotonic() - start, sum(o["tokens"] for o in requests), [o["ttft"] for o in requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="the server's load lasts this long")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    model = load_for_sampling(args.checkpoint, args.device)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.mcfg.vocab_size, args.prompt_len).tolist() for _ in range(args.streams)]
    n = min(args.new_tokens, model.mcfg.context - args.prompt_len)

    def batch() -> float:
        t0 = time.perf_counter()
        out = generate_batch(model.mcfg, model.params, prompts, n, temperature=0.0, precision=model.precision)
        assert all(len(c.tokens) == n for c in out)
        return time.perf_counter() - t0

    batch()  # warm-up
    batch_s = min(batch() for _ in range(args.repeats))
    tokens = args.streams * n
    print(f"generate_batch, batch {args.streams}: {tokens / batch_s:,.0f} tok/s ({batch_s:.3f} s)")
    proc, port = start_server(args.checkpoint, args.device, args.streams)
    try:
        sustained(port, prompts, n, 1.0)  # warm-up
        seconds, served, ttfts = sustained(port, prompts, n, args.seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rate = served / seconds
    ratio = rate * batch_s / tokens
    print(f"serve, {args.streams} streams: {rate:,.0f} tok/s ({served:,} tokens in {seconds:.1f} s, "
          f"{len(ttfts)} requests) = {ratio:.2f}x generate_batch")  # fmt: skip
    median, most = statistics.median(ttfts), max(ttfts)
    print(f"time to first token under that load: median {median * 1000:.0f} ms, max {most * 1000:.0f} ms")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
