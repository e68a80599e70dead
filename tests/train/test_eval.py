"""`euler-train eval` against an independent computation: the checkpoint exported with `export-hf` and
scored by transformers' LlamaForCausalLM (log-softmax of its logits), on HellaSwag / ARC fixtures written
here in the official formats from real text (the standard library's docstrings), on a dataset's val split
and a text file (bits per byte), and on an SFT model's held-out split (response bpb, stop rate)."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pytest

from euler_data.sft import read_sft
from euler_train.batches import bytes_per_token
from euler_train.evals.multiple_choice import item_logprobs, read_items
from euler_train.evals.scoring import Row, score_rows
from euler_train.sampling import load_for_sampling
from tests.train.conftest import docstrings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONTEXT = 64  # tiny_run's model.context


def words(text: str, start: int, stop: int) -> str:
    return " ".join(text.split()[start:stop])


def hellaswag_records() -> list[dict]:
    """12 items: the first 6 words of a docstring, its next 4 words among 4 words of 3 other docstrings;
    a 13th whose context (120 words) is longer than the model's context. Labels int and, once, a string."""
    docs = [d for _, d in docstrings() if len(d.split()) >= 130]
    records = []
    for i in range(13):
        ctx = words(docs[i], 0, 120 if i == 12 else 6)
        true = words(docs[i], 120 if i == 12 else 6, 124 if i == 12 else 10)
        others = [words(docs[(i + 5 * k) % len(docs)], 6, 10) for k in (1, 2, 3)]
        label = i % 4
        records.append(
            {
                "ind": i,
                "activity_label": "Python docs",
                "ctx_a": ctx,
                "ctx_b": "",
                "ctx": ctx,
                "endings": [*others[:label], true, *others[label:]],
                "source_id": f"doc~{i}",
                "split": "val",
                "split_type": "indomain",
                "label": str(label) if i == 3 else label,
            }
        )
    return records


def arc_records() -> list[dict]:
    """10 questions "What does NAME do?" with the first 3 words of 4 docstrings as choices."""
    docs = docstrings()
    records = []
    for i in range(10):
        key = i % 4
        texts = [words(docs[(i + 11 * k) % len(docs)][1], 0, 3) for k in range(1, 4)]
        texts.insert(key, words(docs[i][1], 0, 3))
        labels = ["1", "2", "3", "4"] if i == 5 else ["A", "B", "C", "D"]
        records.append(
            {
                "id": f"Docs_{i}",
                "question": f"What does {docs[i][0]} do?",
                "choices": {"text": texts, "label": labels},
                "answerKey": labels[key],
            }
        )
    return records


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_run):
    """A copy of tiny_run (eval appends to RUN/evals.jsonl; the shared run stays as it is)."""
    return shutil.copytree(tiny_run, tmp_path_factory.mktemp("eval") / "run")


@pytest.fixture(scope="module")
def hf(run, tmp_path_factory, cli):
    """(LlamaForCausalLM, its tokenizer) of the run's checkpoint, through export-hf."""
    out = tmp_path_factory.mktemp("hf") / "model"
    proc = cli("export-hf", "--checkpoint", str(run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    model = transformers.LlamaForCausalLM.from_pretrained(out).float().eval()
    return model, transformers.AutoTokenizer.from_pretrained(out)


def hf_logprobs(model, ids: list[int]) -> np.ndarray:
    """log p(ids[i] | ids[:i]) for i >= 1, from transformers (float64 copy of the float32 values)."""
    with torch.no_grad():
        z = model(torch.tensor([ids[:-1]])).logits[0]  # (T, V)
    picked = torch.log_softmax(z, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return picked.double().numpy()


def reference_scores(model, tok, records, task) -> tuple[list[list[float]], float, float, int]:
    """Per-candidate summed log-probabilities, acc, acc_norm and the candidates longer than the context + 1,
    built from the raw records."""
    logprobs, hits, hits_norm, cut = [], 0, 0, 0
    for r in records:
        if task == "hellaswag":
            context, choices, label = r["ctx"], r["endings"], int(r["label"])
        else:
            context, choices = f"Question: {r['question']}\nAnswer:", r["choices"]["text"]
            label = r["choices"]["label"].index(r["answerKey"])
        ctx = tok.encode(context)
        scores = []
        for choice in choices:
            cont = tok.encode(" " + choice)
            cut += len(ctx + cont) > CONTEXT + 1
            ids = (ctx + cont)[-(CONTEXT + 1) :]  # the end that fits the context
            scores.append(float(hf_logprobs(model, ids)[-len(cont) :].sum()))
        lengths = np.array([len(c.encode()) for c in choices])
        hits += int(np.argmax(scores)) == label
        hits_norm += int(np.argmax(np.array(scores) / lengths)) == label
        logprobs.append(scores)
    return logprobs, hits / len(records), hits_norm / len(records), cut


@pytest.mark.parametrize("task", ["hellaswag", "arc"])
def test_multiple_choice_scores_equal_transformers(task, run, hf, tmp_path, cli) -> None:
    records = hellaswag_records() if task == "hellaswag" else arc_records()
    path = write_jsonl(tmp_path / f"{task}.jsonl", records)
    proc = cli("eval", "--checkpoint", str(run), task, "--file", path, "--json", "--batch-size", "5")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    ref_logprobs, acc, acc_norm, ref_cut = reference_scores(*hf, records, task)
    assert (result["task"], result["n"], result["candidates"]) == (task, len(records), 4 * len(records))
    assert (result["acc"], result["acc_norm"]) == (acc, acc_norm)
    model = load_for_sampling(str(run))
    ours, cut = item_logprobs(model, read_items(path, task), batch_size=3)
    np.testing.assert_allclose(np.array(ours), np.array(ref_logprobs), rtol=2e-5, atol=2e-5)
    assert result["contexts_cut"] == cut == ref_cut
    if task == "hellaswag":  # item 13's context (120 words) is longer than the model's context
        assert (
            cut >= 4 and f"{cut} of 52 candidates are longer than the model's context + 1 (65" in proc.stderr
        )
    assert result["step"] == 30 and result["checkpoint"].endswith("step_30")


def test_padding_and_batch_size_change_no_score(run) -> None:
    """Rows of many lengths, one per forward or 7 per forward (padded): the same scores."""
    model = load_for_sampling(str(run))
    rng = np.random.default_rng(0)
    rows = []
    for n in [2, 5, 17, 64, 65, 80, 3, 40]:
        mask = (rng.random(n) < 0.6).astype(np.int8)
        rows.append(Row(rng.integers(0, 320, n), mask))
    one, seven = score_rows(model, rows, 1), score_rows(model, rows, 7)
    np.testing.assert_allclose(one.logprob, seven.logprob, rtol=1e-5, atol=1e-5)
    assert one.scored.tolist() == seven.scored.tolist()
    assert one.cut == 1 and one.lost == int(rows[5].mask[1:16].sum())  # the 80-token row loses its first 15
    assert one.scored.tolist() == [
        int(r.mask[1:].sum()) if len(r.ids) <= 65 else int(r.mask[16:].sum()) for r in rows
    ]


def reference_bpb(model, seq: list[int]) -> float:
    """Summed nats of every token but the first, in windows of 65 tokens overlapping by one."""
    total = 0.0
    for start in range(0, len(seq) - 1, CONTEXT):
        total -= hf_logprobs(model, seq[start : start + CONTEXT + 1]).sum()
    return total


def test_bpb_of_the_val_split_and_of_a_text_file_equal_transformers(
    run, hf, dataset, corpus, tmp_path, cli
) -> None:
    model, tok = hf
    proc = cli("eval", "--checkpoint", str(run), "bpb", "--data", str(dataset), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    val = np.fromfile(dataset / "val.bin", dtype=np.uint16).astype(int).tolist()
    loss = reference_bpb(model, val) / (len(val) - 1)  # mean nats per predicted token
    meta = json.loads((dataset / "meta.json").read_text())
    assert result["tokens"] == len(val) - 1
    assert result["bpb"] == pytest.approx(loss / math.log(2) / bytes_per_token(meta, "val"), rel=1e-5)

    text = corpus.read_text(encoding="utf-8")[:3000]
    path = tmp_path / "page.txt"
    path.write_text(text, encoding="utf-8")
    proc = cli("eval", "--checkpoint", str(run), "bpb", str(path), "--json", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    seq = [eot, *tok.encode(text), eot]
    assert (result["tokens"], result["bytes"]) == (len(seq) - 1, len(text.encode()))
    assert result["bpb"] == pytest.approx(
        reference_bpb(model, seq) / math.log(2) / len(text.encode()), rel=1e-5
    )


def test_chat_eval_of_an_sft_model_equals_transformers(chat_run, tmp_path, cli) -> None:
    data = chat_run.parent / "docs"
    proc = cli("eval", "--checkpoint", str(chat_run), "chat", "--data", str(data), "--max-new-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert "stop rate" in proc.stdout and "appended to" in proc.stdout
    result = json.loads((chat_run / "evals.jsonl").read_text().splitlines()[-1])
    out = tmp_path / "hf"
    assert cli("export-hf", "--checkpoint", str(chat_run), "--out", str(out)).returncode == 0
    model = transformers.LlamaForCausalLM.from_pretrained(out).float().eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    end, eot = tok.convert_tokens_to_ids("<|end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    tokens, mask, offsets, _ = read_sft(data, "val")
    nats, n_bytes, stops, lengths = 0.0, 0, 0, []
    for a, b in itertools.pairwise(offsets):
        ids, m = tokens[a:b].astype(int).tolist(), mask[a:b].astype(bool)
        nats -= hf_logprobs(model, ids)[m[1:]].sum()
        n_bytes += len(tok.decode([t for t, on in zip(ids, m) if on and t != end]).encode())
        start = max(i for i in range(1, len(ids)) if m[i] and not m[i - 1])  # the last reply's first token
        prompt = ids[:start]
        with torch.no_grad():
            new = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=min(12, CONTEXT - len(prompt)),
                do_sample=False,
                eos_token_id=[end, eot],
            )[0, len(prompt) :].tolist()
        stops += new[-1] == end
        lengths.append(len(new) - (new[-1] in (end, eot)))
    assert result["n"] == result["held_out"] == len(offsets) - 1
    assert result["stop_rate"] == stops / result["n"] and result["stop_rate"] >= 0.8
    assert result["mean_reply_tokens"] == pytest.approx(sum(lengths) / len(lengths))
    assert result["response_bytes"] == n_bytes
    assert result["response_bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    report = (chat_run / "report.md").read_text()  # written by sft when it finished
    assert "Greedy replies (128 new tokens at most) to the first held-out prompts" in report
    assert "SFT set (sft_meta.json)" in report


def test_malformed_task_files_name_the_line(run, tmp_path, cli) -> None:
    evals = run / "evals.jsonl"
    before = evals.read_text() if evals.exists() else None
    good = json.dumps(hellaswag_records()[0])
    cases = {
        "missing.jsonl": (None, "no such file"),
        "empty.jsonl": ("\n\n", "no items (the file is empty)"),
        "bad_json.jsonl": (f"{good}\n{good}\n{{not json\n", "line 3: not JSON"),
        "no_label.jsonl": (good.replace('"label"', '"lbl"') + "\n", "line 1: field 'label' must be an index"),
        "no_ctx.jsonl": (f"{good}\n" + good.replace('"ctx"', '"context"'), "line 2: missing field 'ctx'"),
        "out_of_range.jsonl": (
            good.replace('"label": 0', '"label": 4'),
            "label 4 is out of range for 4 endings",
        ),
    }
    for name, (text, message) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text, encoding="utf-8")
        proc = cli("eval", "--checkpoint", str(run), "hellaswag", "--file", str(tmp_path / name))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (name, proc.stderr)
    arc = arc_records()[0]
    (tmp_path / "arc.jsonl").write_text(json.dumps({**arc, "answerKey": "E"}), encoding="utf-8")
    proc = cli("eval", "--checkpoint", str(run), "arc", "--file", str(tmp_path / "arc.jsonl"))
    assert proc.returncode == 2 and "answerKey 'E' is not one of choices.label" in proc.stderr
    assert (evals.read_text() if evals.exists() else None) == before


def test_eval_results_are_listed_in_the_report(run, dataset, tmp_path, cli) -> None:
    path = write_jsonl(tmp_path / "arc.jsonl", arc_records())
    for task in (["arc", "--file", path], ["bpb", "--data", str(dataset)]):
        assert cli("eval", "--checkpoint", str(run), *task, "--no-progress").returncode == 0
    rows = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    proc = cli("report", str(run))
    assert proc.returncode == 0, proc.stderr
    report = (run / "report.md").read_text()
    section = report.split("## Evaluations")[1].split("## Samples")[0]
    for row in rows:
        assert f"| {row['task']} | {row['step']} |" in section
    arc = next(r for r in rows if r["task"] == "arc")
    assert f"acc {arc['acc']:.4f}, acc_norm {arc['acc_norm']:.4f}, n 10" in section


def test_the_report_of_a_pretrain_holds_every_section(tiny_run, dataset) -> None:
    from euler_train.checkpoint import read_state
    from euler_train.metrics import read_metrics

    report = (tiny_run / "report.md").read_text()
    heads = [line for line in report.splitlines() if line.startswith("## ")]
    assert heads == ["## Config", "## Data", "## Training", "## Loss", "## Evaluations", "## Samples"]
    assert (tiny_run / "config.toml").read_text().strip() in report
    state = read_state(tiny_run / "checkpoints" / "step_30")
    assert f"tokens seen: {state['tokens']:,}" in report
    rows = read_metrics(tiny_run / "metrics.jsonl")
    assert f"val bpb **{[r for r in rows if 'val_bpb' in r][-1]['val_bpb']:.4f}**" in report
    median = float(np.median([r["tok_per_s"] for r in rows]))
    assert f"median {median:,.0f} tokens/s over {len(rows)} logged steps" in report
    meta = json.loads((dataset / "meta.json").read_text())
    assert (
        f"| val | {meta['documents']['val']:,} | {meta['bytes']['val']:,} | {meta['tokens']['val']:,} |"
        in report
    )
    assert "![loss](loss.png)" in report and (tiny_run / "loss.png").is_file()
    assert report.count("greedy:") == 1 and report.count(", temperature 0.8, top-k 50") == 2


def test_a_report_whose_samples_do_not_fit_in_memory_says_so(tiny_run, monkeypatch) -> None:
    """A run sized to fill the GPU may leave no room for the report's sampling model: the report is still
    written, its samples section says why it has none and how to get them (CuPy's OutOfMemoryError is a
    MemoryError)."""
    from euler_train import report

    def full(*args, **kwargs):
        raise MemoryError("out of memory to allocate 536870912 bytes")

    monkeypatch.setattr(report, "load_for_sampling", full)
    text = report.report_text(tiny_run)
    samples = text.split("## Samples")[1]
    assert "did not fit in cpu memory beside the finished run (out of memory to allocate" in samples
    assert "`euler-train report RUN` writes them again" in samples
    assert "## Evaluations" in text and "greedy:" not in samples
