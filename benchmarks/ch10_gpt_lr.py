"""Chapter 10's 600-step GPT with three peak learning rates, scored on validation (CPU, 1 thread).

Section 10.3 sets the GPT's peak learning rate (0.01) by hand, while the count baselines' settings
are searched on validation. This script closes that gap for the one setting that matters most:
it trains the chapter's GPT (``ch10_gpt_seeds.train_gpt``: same model, schedule, batches and
600 steps, seed 0) with peak learning rates 0.003, 0.01 and 0.03 and records each run's
validation perplexity (``val`` split, each sentence read on its own, ``<eos>`` included). It never
reads the test split. It writes ``companion/results/ch10_gpt_lr.json`` (about 1 CPU-minute per
rate on a quiet machine).

Usage: ``python benchmarks/ch10_gpt_lr.py [--rates 0.003 0.01 0.03] [--data-root PATH]``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from ch10_gpt_seeds import REPO, parse_lm_args, train_gpt
from notebook_code import write_record

from companion.data import PAD_ID, LanguageModelData, causal_lm_example

RESULTS = REPO / "companion" / "results" / "ch10_gpt_lr.json"
VAL = "val"


def val_perplexity(gpt: torch.nn.Module, data: LanguageModelData) -> float:
    """Perplexity on the validation split, each sentence read on its own."""
    total = 0.0
    with torch.no_grad():
        for batch in data.batches(VAL, 4096):
            inputs, targets, _ = causal_lm_example(batch)  # (batch, seq_len - 1) each
            nll = F.cross_entropy(gpt(inputs).transpose(1, 2), targets, reduction="none")
            total += float(nll[targets != PAD_ID].sum())
    return math.exp(total / data.num_predictions(VAL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.003, 0.01, 0.03])
    args = parse_lm_args(parser, RESULTS)
    start = time.process_time()

    data = LanguageModelData.from_multi30k(args.data_root, progress=False, splits=("train", VAL))
    runs = []
    for lr in args.rates:
        gpt, seconds = train_gpt(data, 0, args.steps, lr=lr)
        runs.append(
            {
                "lr": lr,
                "val_perplexity": val_perplexity(gpt, data),
                "train_cpu_seconds": round(seconds, 1),
            }
        )
        print(
            f"lr {lr}: validation perplexity {runs[-1]['val_perplexity']:.2f} ({seconds:.0f} CPU-s)",
            flush=True,
        )
    record = {
        "what": "chapter 10's GPT (section 10.3), seed 0, 600 steps, with several peak learning rates; "
        "the validation perplexity of each (the test split is not read)",
        "steps": args.steps,
        "seed": 0,
        "chapter_lr": 0.01,
        "runs": runs,
    }
    write_record(args.out, record, start)


if __name__ == "__main__":
    main()
