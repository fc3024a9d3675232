"""The guess of chapter 7's appendix (A.1), tested: does the factor sqrt(d_model) hurt only where the model starts by copying?

The appendix (A.1) finds that the tied toy of section 7.7 (Pre-LN, 2 + 2 layers) trains to more right answers
without the factor (``benchmarks/ch07_seed_runs.py``), and that with the factor it starts by copying
the token the decoder was just fed. Its guess: the model must first unlearn that copying. Post-LN
copies less with depth (section 7.4's step 3). This script trains the same toy in the paper's Post-LN
layout, with 2 + 2 layers (which still copies) and 3 + 3 layers (which copies far less), each with and
without the factor (both embeddings' ``scale`` set to 1), from independent seeds s (``set_seed(s)``
before the model is built, the data loader shuffled by a generator seeded with s). Task, schedule,
step budget and the 300 test sequences are section 7.7's. For each run it records the share of real
target positions where the untrained model puts the fed token on top, the share of test sequences
greedy decoding gets entirely right after training, and the mean loss of the last 20 steps. It writes
``companion/results/ch07_post_ln_runs.json``, which the chapter reads, shows and asserts on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch07_post_ln_runs.py 0 1 2 3 4 5 6 7
"""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from companion.data import PAD_ID, CopyReverseDataset, collate_batch
from companion.decode import greedy_decode
from companion.model import Transformer, TransformerConfig
from companion.train import adam, inverse_sqrt_warmup, train_step
from companion.utils import set_seed, set_threads

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch07_post_ln_runs.json"
STEPS, MIN_LEN, MAX_LEN, D_MODEL = 200, 3, 10, 64


def run(seed: int, num_layers: int, factor: bool) -> dict:
    """Train section 7.7's toy in the Post-LN layout; the copy rate at initialisation, greedy exact
    match on the test set and the mean loss of the last 20 steps."""
    train_data = CopyReverseDataset(
        "reverse", num_examples=STEPS * 64, min_len=MIN_LEN, max_len=MAX_LEN, seed=1
    )
    test_data = CopyReverseDataset(
        "reverse", num_examples=300, min_len=MIN_LEN, max_len=MAX_LEN, seed=2
    )
    vocab = train_data.vocab
    set_seed(seed)
    toy = Transformer(TransformerConfig(
        src_vocab=train_data.vocab_size, tgt_vocab=train_data.vocab_size, d_model=D_MODEL, num_heads=4,
        num_layers=num_layers, d_ff=256, dropout=0.0, norm_first=False, tie_embeddings=True,
        src_pad_id=PAD_ID, tgt_pad_id=PAD_ID,
    ))  # fmt: skip
    toy.src_embedding.scale = toy.tgt_embedding.scale = math.sqrt(D_MODEL) if factor else 1.0
    test_src, test_tgt = collate_batch([test_data[i] for i in range(len(test_data))])
    fed, real = test_tgt[:, :-1], test_tgt[:, 1:] != PAD_ID
    toy.eval()
    with torch.no_grad():
        init_copy = (toy(test_src, fed).argmax(-1) == fed)[real].float().mean().item()
    toy.train()
    loader = DataLoader(train_data, batch_size=64, shuffle=True, collate_fn=collate_batch,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    optimizer = adam(toy.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, inverse_sqrt_warmup(d_model=D_MODEL, warmup_steps=100)
    )
    losses = [train_step(toy, s, t, optimizer, scheduler, pad_id=PAD_ID).loss for s, t in loader]
    toy.eval()
    references = [vocab.decode(test_data[i][1]) for i in range(len(test_data))]
    output = greedy_decode(toy, test_src, max_len=MAX_LEN + 2)
    greedy = float(np.mean([vocab.decode(row) == ref for row, ref in zip(output, references)]))
    return {"init_copy": init_copy, "greedy": greedy, "loss": float(np.mean(losses[-20:]))}


def main(seeds: list[int]) -> None:
    set_threads(limit=1)
    record = {
        "setup": "section 7.7's toy (reversal, 3-10 digits, 200 steps of batch 64, tied, d_model 64) in the "
        "Post-LN layout with N + N layers, N = 2 and 3, with and without the factor sqrt(d_model); seed s: "
        "set_seed(s) before the model is built and the training loader shuffled by Generator().manual_seed(s); "
        "init_copy: share of real target positions where the untrained model's top token is the token fed; "
        "greedy: exact match on the 300 test sequences; loss: mean training loss of the last 20 steps",
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "runs": {},
    }
    for seed in seeds:
        result = {}
        for num_layers in (2, 3):
            for factor in (True, False):
                key = f"post{num_layers}_{'factor' if factor else 'no_factor'}"
                result[key] = run(seed, num_layers, factor)
        record["runs"][str(seed)] = result
        print(f"seed {seed}: " + "; ".join(
            f"{key} copy {r['init_copy']:.0%} greedy {r['greedy']:.1%} loss {r['loss']:.3f}"
            for key, r in result.items()
        ), flush=True)  # fmt: skip
        OUT.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(8)))
