"""Lever experiments for the translator's 10-minute CPU run (not a test; see README.md).

Trains the ``cpu`` configuration for its time budget with one change, then scores test 2016
with greedy decoding and beam search, for the final weights and (with ``--average``) for
the mean of weight snapshots taken during the last part of the run. One JSON line per run is
appended to ``--log``.

    python benchmarks/translator_levers.py --name baseline
    python benchmarks/translator_levers.py --name lr1 --set lr_factor=1.0
    python benchmarks/translator_levers.py --name bpe8k --bpe 8000   # needs `pip install tokenizers`
    python benchmarks/translator_levers.py --name avg --average 0.3
    python benchmarks/translator_levers.py --name no_attn --set seed=1 attention_dropout=0.0
    python benchmarks/translator_levers.py --summarise runs/translator_levers.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import companion.run as training
from companion.configs import get_config
from companion.metrics import Translator, bootstrap_bleu


class SubwordTokenizer:
    """A joint German-English BPE (``tokenizers``, Metaspace pre-tokenizer: exact round trip)."""

    def __init__(self, sentences: list[str], vocab_size: int) -> None:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        self.tokenizer = Tokenizer(models.BPE())
        self.tokenizer.normalizer = normalizers.NFC()
        self.tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        self.tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False)
        self.tokenizer.train_from_iterator(sentences, trainer)

    def tokenize(self, text: str) -> list[str]:
        return self.tokenizer.encode(text).tokens

    def detokenize(self, tokens: list[str]) -> str:
        return self.tokenizer.decoder.decode(list(tokens))


def summarise(log: str) -> None:
    """Mean, lowest and highest of each run name's steps, validation loss and test BLEU."""
    runs: dict[str, list[dict]] = {}
    for line in Path(log).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        runs.setdefault(record["name"], []).append(record)
    columns = {  # name: (value of a record, decimals)
        "steps": (lambda r: r["steps"], 0),
        "val loss": (lambda r: r["val_loss"], 3),
        "greedy": (lambda r: r["final_beam1"][0], 1),
        "beam 4": (lambda r: r["final_beam4"][0], 1),
    }
    print(f"{'name':24s} {'runs':>4s} " + " ".join(f"{c:>22s}" for c in columns))
    for name, records in runs.items():
        cells = []
        for get, digits in columns.values():
            values = [get(r) for r in records]
            mean = sum(values) / len(values)
            cells.append(f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})")
        print(f"{name:24s} {len(records):4d} " + " ".join(f"{c:>22s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summarise", metavar="LOG", help="print a log's table and stop")
    parser.add_argument("--name")
    parser.add_argument("--data-root", default="../shared/data/multi30k")
    parser.add_argument("--budget", type=float, default=510.0, help="seconds of training")
    parser.add_argument("--bpe", type=int, default=0, help="joint BPE vocabulary (0: words)")
    parser.add_argument("--average", type=float, default=0.0, help="average the last fraction")
    parser.add_argument("--average-every", type=int, default=50, help="snapshot every N steps")
    parser.add_argument("--set", nargs="*", default=[], help="config changes, e.g. lr_factor=1.0")
    parser.add_argument("--log", default="runs/translator_levers.jsonl")
    args = parser.parse_args()
    if args.summarise:
        summarise(args.summarise)
        return
    if not args.name:
        parser.error("--name is required (or --summarise LOG)")
    changes = dict(item.split("=", 1) for item in args.set)
    config = get_config(
        "cpu", time_budget=args.budget, **{k: json.loads(v) for k, v in changes.items()}
    )
    start = time.perf_counter()

    if args.bpe:
        from companion.data import load_multi30k

        train_pairs = load_multi30k("train", args.data_root, progress=False)
        tokenizer = SubwordTokenizer([s for pair in train_pairs for s in pair], args.bpe)
        prepare = training.prepare_multi30k

        def prepare_with_bpe(root=None, **kwargs):
            return prepare(root, **{**kwargs, "tokenizer": tokenizer, "min_freq": 1})

        training.prepare_multi30k = prepare_with_bpe

    snapshots: dict = {"sum": None, "count": 0, "first_step": None}

    class AveragingTrainer(training.Trainer):
        def train_step(self, src, tgt):
            stats = super().train_step(src, tgt)
            now = time.perf_counter()
            snapshots["first_step"] = snapshots["first_step"] or now
            late = now - snapshots["first_step"] > (1 - args.average) * args.budget
            if args.average and late and self.step % args.average_every == 0:
                state = {k: v.detach().double() for k, v in self.model.state_dict().items()}
                if snapshots["sum"] is None:
                    snapshots["sum"] = {k: v.clone() for k, v in state.items()}
                else:
                    for k, v in state.items():
                        snapshots["sum"][k] += v
                snapshots["count"] += 1
            return stats

    training.Trainer = AveragingTrainer
    run = training.train(config, None, data_root=args.data_root, progress=False, evaluate=False)
    r = run.results
    record = {
        "name": args.name,
        "args": vars(args),
        "steps": r["steps"],
        "epochs": round(r["epochs"], 3),
        "train_seconds": round(r["train_seconds"], 1),
        "val_loss": round(r["val_loss"], 4),
        "parameters": r["parameters"],
        "vocab": [len(run.data.src_vocab), len(run.data.tgt_vocab)],
    }
    references = [pair[1] for pair in run.data.test_pairs]
    sources = [pair[0] for pair in run.data.test_pairs]
    models = {"final": run.model}
    if snapshots["count"]:
        averaged = copy.deepcopy(run.model)
        state = averaged.state_dict()
        averaged.load_state_dict(
            {k: (v / snapshots["count"]).to(state[k].dtype) for k, v in snapshots["sum"].items()}
        )
        models["average"] = averaged
        record["snapshots"] = snapshots["count"]
    for tag, model in models.items():
        for beam in (1, 4):
            translator = Translator(
                model, run.data.tokenizer, run.data.src_vocab, run.data.tgt_vocab,
                beam_size=beam, length_penalty=config.length_penalty,
            )  # fmt: skip
            interval = bootstrap_bleu(translator.translate(sources), references)
            record[f"{tag}_beam{beam}"] = [
                round(x, 2) for x in (interval.score, interval.low, interval.high)
            ]
    record["total_seconds"] = round(time.perf_counter() - start)
    print(json.dumps(record), flush=True)
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "a") as log:
        log.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
