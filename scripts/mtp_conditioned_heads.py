"""Would a drafting head draft better if it saw the next token? An experiment on a trained checkpoint.

Speculative decoding (euler_model's decode_step.py) drafts the token two places ahead with MTP head
1 at the hidden state h_t whose head 0 gave the next token g. Head 1 is a plain linear map of h_t, so it
must guess past g without knowing it. This script keeps the trained trunk frozen and fits, on its hidden
states of the train split:
  - "head 1 refit": the same linear head, W1 h_t, from the checkpoint's W1 (the control);
  - "head 1 + P e(next)": W1 (h_t + P e_{x_{t+1}}), e the model's input embedding, P a new (C, C) matrix
    (zero at the start, so it starts as the control);
both with the same Adam steps on the cross-entropy of x_{t+2}. Each head, and the checkpoint's own head 1,
is judged by the acceptance a one-draft speculative chain would get: on greedy continuations of val
prompts, how often its draft at t (given the greedy x_{t+1}) equals the greedy x_{t+2}; and by its
teacher-forced accuracy on val windows. Everything runs in NumPy (float32).

    python scripts/mtp_conditioned_heads.py --checkpoint CKPT --data runs/data/ts512 \\
        [--windows 4000 --epochs 10 --lr 1e-3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from euler_data.meta import open_split
from euler_model import generate, load_checkpoint
from euler_model.model import trunk_forward


def hidden(cfg, params, tokens: np.ndarray) -> np.ndarray:
    """The final-normed hidden states (B, T, C) of token windows (B, T)."""
    return np.asarray(trunk_forward(cfg, params, tokens, recompute=True)[0], dtype=np.float32)


def training_rows(cfg, params, train: np.ndarray, windows: int, rng) -> tuple[np.ndarray, ...]:
    """h_t (N, C), x_{t+1} (N,), x_{t+2} (N,) of `windows` random context-long windows of the train split."""
    t = cfg.context
    starts = rng.integers(0, len(train) - t, windows)
    h, next1, next2 = [], [], []
    for i in range(0, windows, 50):
        w = np.stack([train[s : s + t] for s in starts[i : i + 50]])
        hw = hidden(cfg, params, w)
        h.append(hw[:, : t - 2].reshape(-1, hw.shape[-1]))
        next1.append(w[:, 1 : t - 1].reshape(-1))
        next2.append(w[:, 2:].reshape(-1))
    return np.concatenate(h), np.concatenate(next1), np.concatenate(next2)


def fit(rows, embed, w_start, conditioned: bool, epochs: int, lr: float, rng, batch: int = 4096):
    """Adam on the cross-entropy of x_{t+2}: W (V, C) from w_start, and P (C, C) from 0 when conditioned."""
    h_all, next1, next2 = rows
    c = h_all.shape[1]
    params = {"W": w_start.copy(), "P": np.zeros((c, c), np.float32)}
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(h_all))
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            e = embed[next1[idx]]  # (n, C)
            a = h_all[idx] + e @ params["P"].T if conditioned else h_all[idx]  # (n, C)
            z = a @ params["W"].T  # (n, V)
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(idx)), next2[idx]] -= 1.0
            dz = p / len(idx)  # d mean cross-entropy / dz
            grads = {"W": dz.T @ a}
            if conditioned:
                grads["P"] = (dz @ params["W"]).T @ e
            step += 1
            for name, g in grads.items():
                m, v = moments[name]
                m[...] = 0.9 * m + 0.1 * g
                v[...] = 0.999 * v + 0.001 * g * g
                params[name] -= lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    return params["W"], (params["P"] if conditioned else None)


def draft_input(h: np.ndarray, next_ids: np.ndarray, embed: np.ndarray, p: np.ndarray | None) -> np.ndarray:
    """What head 1 multiplies: h, plus P e(next) for a conditioned head."""
    return h if p is None else h + embed[next_ids] @ p.T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="the euler-data dataset the model was trained on")
    ap.add_argument("--windows", type=int, default=4000, help="train windows the heads are fitted on")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--prompts", type=int, default=48, help="val prompts continued greedily")
    args = ap.parse_args()
    try:
        cfg, params, _ = load_checkpoint(args.checkpoint)
        train = np.concatenate(open_split(args.data, "train")).astype(np.int64)
        val = np.concatenate(open_split(args.data, "val")).astype(np.int64)
    except (OSError, ValueError) as err:  # a missing or bad checkpoint or dataset: one line, exit 2
        ap.error(str(err).splitlines()[0])
    if cfg.n_mtp_heads < 2:
        ap.error(f"the model has no drafting head (n_mtp_heads {cfg.n_mtp_heads})")
    params = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    embed, w1, t = params["embed"], params["heads.1"], cfg.context
    rng = np.random.default_rng(0)
    rows = training_rows(cfg, params, train, args.windows, rng)
    print(f"# {args.checkpoint}: {len(rows[0]):,} train positions, C {rows[0].shape[1]}, V {embed.shape[0]}")
    start = time.perf_counter()
    heads = {
        "checkpoint head 1": (w1, None),
        "head 1 refit": fit(rows, embed, w1, False, args.epochs, args.lr, rng),
        "head 1 + P e(next)": fit(rows, embed, w1, True, args.epochs, args.lr, rng),
    }
    print(f"# fitted in {time.perf_counter() - start:.0f} s ({args.epochs} epochs, lr {args.lr})")
    continued = []  # prompt + greedy continuation, to the context
    for s in rng.integers(0, len(val) - 16, args.prompts):
        prompt = val[s : s + 16].tolist()
        continued.append(np.asarray(prompt + list(generate(cfg, params, prompt, t - 17, temperature=0.0))))
    windows = np.stack([val[s : s + t] for s in rng.integers(0, len(val) - t, 60)])
    h_windows = hidden(cfg, params, windows)[:, : t - 2]
    for name, (w, p) in heads.items():
        hits = drafts = 0
        for seq in continued:
            h = hidden(cfg, params, seq[None])[0]
            at = np.arange(15, len(seq) - 2)  # drafts made after the prompt
            guess = np.argmax(draft_input(h[at], seq[at + 1], embed, p) @ w.T, axis=-1)
            hits += int((guess == seq[at + 2]).sum())
            drafts += len(at)
        guess = np.argmax(draft_input(h_windows, windows[:, 1 : t - 1], embed, p) @ w.T, axis=-1)
        accuracy = float((guess == windows[:, 2:]).mean())
        print(
            f"{name:20s} acceptance on greedy continuations {hits / drafts:.1%} ({drafts} drafts); "
            f"teacher-forced val accuracy {accuracy:.1%}"
        )


if __name__ == "__main__":
    main()
