"""HellaSwag and ARC: multiple choice scored by the log-probability of each candidate given the context.

Files are the official JSON lines: HellaSwag ``{"ctx": ..., "endings": [4 strings], "label": 0..3}``
(the label may be a string, as in the Hugging Face copy); ARC (Hugging Face ``allenai/ai2_arc``)
``{"question": ..., "choices": {"text": [...], "label": ["A", ...]}, "answerKey": "A"}``.

Each candidate is the context followed by a space and the candidate text, as lm-eval-harness and llm.c
build them: HellaSwag's context is ``ctx`` as written, ARC's is ``"Question: {question}\\nAnswer:"``. The
context and " " + candidate are encoded separately (llm.c's way) and the candidate's score is the sum of
the log-probabilities of its tokens given everything before them. ``acc`` counts items whose highest
score is the label; ``acc_norm`` divides each score by the candidate text's length in UTF-8 bytes first
(lm-eval's ``acc_norm`` divides by its length in characters: the same for ASCII text). Ties go to the
first candidate, as numpy's argmax.

>>> accuracy([Item("c", ["ab", "abcdef"], 1, 1)], [[-2.0, -3.0]])
(0.0, 1.0)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from euler_train.config import ConfigError
from euler_train.evals.scoring import Row, score_rows
from euler_train.sampling import SamplingModel, note


@dataclass(frozen=True)
class Item:
    context: str
    choices: list[str]  # candidate texts, without the space that joins them to the context
    label: int  # index of the right candidate
    line: int  # its line in the file, for messages


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; ConfigError naming the line that is not JSON."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    rows = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            rows.append((number, json.loads(raw.decode("utf-8"))))
        except UnicodeDecodeError:
            raise ConfigError(f"{path} line {number}: not UTF-8") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} line {number}: not JSON ({err.msg})") from None
    if not rows:
        raise ConfigError(f"{path}: no items (the file is empty)")
    return rows


def _field(obj: Any, name: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if name not in obj:
        raise ConfigError(f"{where}: missing field {name!r}")
    if not isinstance(obj[name], kind) or isinstance(obj[name], bool):
        raise ConfigError(f"{where}: field {name!r} must be a {kind.__name__}, got {obj[name]!r:.60}")
    return obj[name]


def _texts(values: list, name: str, where: str) -> list[str]:
    """A list of at least two non-empty strings."""
    if len(values) < 2 or not all(isinstance(v, str) and v.strip() for v in values):
        raise ConfigError(f"{where}: {name} must hold two or more non-empty strings, got {values!r:.80}")
    return values


def _context(text: str, name: str, where: str) -> str:
    if not text.strip():
        raise ConfigError(f"{where}: field {name!r} is empty")
    return text


def hellaswag_item(obj: Any, where: str, line: int) -> Item:
    """An Item of a HellaSwag record: context `ctx`, candidates `endings`, answer `label` (int or digits)."""
    ctx = _context(_field(obj, "ctx", str, where), "ctx", where)
    endings = _texts(_field(obj, "endings", list, where), "endings", where)
    label = obj.get("label")
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)
    if label is None or not isinstance(label, int) or isinstance(label, bool):
        raise ConfigError(f"{where}: field 'label' must be an index into endings, got {label!r}")
    if not 0 <= label < len(endings):
        raise ConfigError(f"{where}: label {label} is out of range for {len(endings)} endings")
    return Item(ctx, endings, label, line)


def arc_item(obj: Any, where: str, line: int) -> Item:
    """An Item of an ARC record: `question`, `choices.text` / `choices.label`, `answerKey` among labels."""
    question = _context(_field(obj, "question", str, where), "question", where)
    choices = _field(obj, "choices", dict, where)
    texts = _texts(_field(choices, "text", list, f"{where}: choices"), "choices.text", where)
    labels = _field(choices, "label", list, f"{where}: choices")
    if len(labels) != len(texts) or len(set(map(str, labels))) != len(labels):
        raise ConfigError(
            f"{where}: choices.label must name each of the {len(texts)} texts once, got {labels}"
        )
    key = _field(obj, "answerKey", str, where)
    if key not in labels:
        raise ConfigError(f"{where}: answerKey {key!r} is not one of choices.label {labels}")
    return Item(f"Question: {question}\nAnswer:", texts, labels.index(key), line)


READERS = {"hellaswag": hellaswag_item, "arc": arc_item}


def read_items(path: str | Path, task: str) -> list[Item]:
    """Every item of a HellaSwag or ARC JSON-lines file; ConfigError naming the first bad line."""
    path = Path(path)
    read = READERS[task]
    return [read(obj, f"{path} line {number}", number) for number, obj in read_jsonl(path)]


def candidate_rows(tok: Any, items: list[Item], context: int) -> list[Row]:
    """One row per candidate, items in order: context tokens (not scored) + " " + candidate (scored).
    ConfigError when a candidate alone does not fit the model's context."""
    rows = []
    for item in items:
        ctx = tok.encode(item.context)
        for k, choice in enumerate(item.choices):
            cont = tok.encode(" " + choice)
            if len(cont) > context:
                raise ConfigError(
                    f"line {item.line}: candidate {k} is {len(cont)} tokens, more than the model's context "
                    f"({context}): it cannot be scored"
                )
            ids = np.array(ctx + cont, dtype=np.int64)
            rows.append(Row(ids, np.concatenate([np.zeros(len(ctx), np.int8), np.ones(len(cont), np.int8)])))
    return rows


def per_item(items: list[Item], values: np.ndarray) -> list[list[float]]:
    """The flat per-candidate values split back into one list per item."""
    bounds = np.cumsum([0] + [len(item.choices) for item in items])
    return [values[a:b].tolist() for a, b in itertools.pairwise(bounds)]


def accuracy(items: list[Item], logprobs: list[list[float]]) -> tuple[float, float]:
    """(acc, acc_norm): share of items whose best candidate is the label, by summed log-probability and
    by log-probability per UTF-8 byte of the candidate text."""
    hits, hits_norm = 0, 0
    for item, scores in zip(items, logprobs):
        lengths = np.array([len(c.encode("utf-8")) for c in item.choices], dtype=np.float64)
        hits += int(np.argmax(scores)) == item.label
        hits_norm += int(np.argmax(np.asarray(scores) / lengths)) == item.label
    return hits / len(items), hits_norm / len(items)


def item_logprobs(
    model: SamplingModel, items: list[Item], batch_size: int, progress: Callable[[int], None] | None = None
) -> tuple[list[list[float]], int]:
    """The summed log-probability of every candidate of every item, and how many candidates' contexts
    were cut to fit the model's context (said on stderr)."""
    rows = candidate_rows(model.tokenizer, items, model.mcfg.context)
    scores = score_rows(model, rows, batch_size, progress)
    if scores.cut:
        note(
            f"{scores.cut} of {len(rows)} candidates are longer than the model's context + 1 "
            f"({model.mcfg.context + 1} tokens): their contexts were cut to the last tokens that fit"
        )
    return per_item(items, scores.logprob), scores.cut


def evaluate_multiple_choice(
    model: SamplingModel, items: list[Item], batch_size: int, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """acc, acc_norm and counts of one task file's items."""
    logprobs, cut = item_logprobs(model, items, batch_size, progress)
    acc, acc_norm = accuracy(items, logprobs)
    n_candidates = sum(len(item.choices) for item in items)
    return {
        "n": len(items),
        "acc": acc,
        "acc_norm": acc_norm,
        "candidates": n_candidates,
        "contexts_cut": cut,
    }
