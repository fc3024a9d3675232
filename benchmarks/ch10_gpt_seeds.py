"""Chapter 10's 600-step GPT trained with several seeds (CPU, 1 thread).

Chapter 10 (section 10.3) trains a 2-layer decoder-only model on the English side of Multi30k
for 600 steps with seed 0 and finds that it beats an interpolated Kneser–Ney 4-gram by a few
standard errors of the paired difference. That standard error covers which test sentences were
drawn, not the training run. This script repeats the chapter's training (same model, schedule
and scoring) with ``--seeds`` (1 and 2 by default; seed 0 is the chapter's own run): a seed
fixes the initial weights and where the training windows start. For each run it keeps the test perplexity and the summed negative
log-probability of every ``test_2016_flickr`` sentence (each read on its own, ``<eos>``
included), so that the chapter can pair each run with its own Kneser–Ney 4-gram sentence by
sentence. It writes ``companion/results/ch10_gpt_seeds.json`` (about 1 CPU-minute per seed on a quiet machine).

Usage: ``python benchmarks/ch10_gpt_seeds.py [--seeds 1 2] [--steps 600] [--data-root PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from companion.data import BOS_ID, EOS_ID, PAD_ID, LanguageModelData, causal_lm_example
from companion.families import DecoderOnlyTransformer
from companion.model import TransformerConfig
from companion.train import sequence_loss
from companion.utils import set_seed

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "companion" / "results" / "ch10_gpt_seeds.json"
TEST = "test_2016_flickr"


def train_gpt(
    data: LanguageModelData, seed: int, steps: int, lr: float = 1e-2
) -> tuple[DecoderOnlyTransformer, float]:
    """The chapter's GPT and training loop, with ``seed`` for the weights and the window starts
    (``lr``: the peak learning rate; the chapter's is 0.01)."""
    stream = torch.tensor([t for s in data.ids["train"] for t in (BOS_ID, *s, EOS_ID)])  # (total,)
    config = TransformerConfig(tgt_vocab=data.vocab_size, tgt_pad_id=PAD_ID, d_model=64, num_heads=4,
                               num_layers=2, d_ff=256, dropout=0.0, norm_first=True, positional="rope",
                               tie_embeddings=True)  # fmt: skip
    set_seed(seed)
    gpt = DecoderOnlyTransformer(config)
    window, rows = 64, 16
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=lr, weight_decay=0.01)
    factor = lambda step: min(1.0, (step + 1) / 30) * max(0.1, 1 - step / steps)  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    places = torch.Generator().manual_seed(seed)
    start = time.process_time()
    gpt.train()
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - window - 1, (rows,), generator=places)
        batch = stream[starts[:, None] + torch.arange(window + 1)]  # (rows, window + 1)
        inputs, targets, _ = causal_lm_example(batch)
        loss = sequence_loss(gpt(inputs), targets, PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    gpt.eval()
    return gpt, time.process_time() - start


def sentence_losses(gpt: DecoderOnlyTransformer, data: LanguageModelData) -> list[float]:
    """(sentences,) summed negative log-probability of each test sentence, in the split's order."""
    losses = [math.nan] * len(data.ids[TEST])
    with torch.no_grad():
        for batch, indices in zip(data.batches(TEST, 4096), data.index_batches(TEST, 4096)):
            inputs, targets, _ = causal_lm_example(batch)  # (batch, seq_len - 1) each
            nll = F.cross_entropy(gpt(inputs).transpose(1, 2), targets, reduction="none")
            for r, s in enumerate(indices):
                losses[s] = float(nll[r, targets[r] != PAD_ID].sum())
    return losses


def parse_lm_args(parser: argparse.ArgumentParser, out: Path) -> argparse.Namespace:
    """Add the GPT scripts' shared options (--steps, --data-root, --out), parse them, and run
    torch on one thread, as every recorded run of chapter 10 does."""
    parser.add_argument("--steps", type=int, default=600)
    default_root = os.environ.get("MULTI30K_ROOT") or REPO.parent / "shared" / "data" / "multi30k"
    parser.add_argument("--data-root", type=Path, default=Path(default_root))
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    torch.set_num_threads(1)
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parse_lm_args(parser, RESULTS)

    data = LanguageModelData.from_multi30k(
        args.data_root, progress=False, splits=("train", "val", TEST)
    )
    predictions = data.num_predictions(TEST)
    runs = []
    for seed in args.seeds:
        gpt, seconds = train_gpt(data, seed, args.steps)
        losses = sentence_losses(gpt, data)
        runs.append({
            "seed": seed,
            "test_perplexity": math.exp(sum(losses) / predictions),
            "sentence_nll": [round(x, 6) for x in losses],
            "train_cpu_seconds": round(seconds, 1),
        })  # fmt: skip
        print(
            f"seed {seed}: test perplexity {runs[-1]['test_perplexity']:.2f} ({seconds:.0f} CPU-s)",
            flush=True,
        )
        # written after every seed, so that an interrupted run keeps its finished seeds
        record = {
            "what": "chapter 10's GPT (section 10.3) trained with several seeds; sentence_nll: the summed "
            "negative log-probability of each test sentence (<eos> included), in the split's order",
            "steps": args.steps,
            "test_sentences": len(data.ids[TEST]),
            "test_predictions": predictions,
            "runs": runs,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "threads": 1,
            "date": date.today().isoformat(),
        }
        args.out.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
