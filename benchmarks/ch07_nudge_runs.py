"""Section 7.7's toy model, retrained with its weights nudged as another CPU would round them.

The chapter trains a small Pre-LN Transformer for 200 steps on the reversal task and compares
greedy decoding with a beam of 3 on 300 test sequences. Training is chaotic: a CPU that rounds
sums differently trains a measurably different model. This script repeats the chapter's training
exactly (same data, seeds and schedule) and, for nudge seed s > 0, adds Gaussian noise of relative
size 1e-6 (times each tensor's mean absolute value) to every weight right after the first
optimiser step; s = 0 is the chapter's own run, unnudged. For each run it prints and records the
share of test sequences entirely right with greedy decoding, with the beam of 3 under fairseq's
stopping rule (the package's default: stop at 3 finished hypotheses) and with the beam of 3 under
the waiting rule (``stop="bound"``: stop once no open hypothesis can still win). It writes
``companion/results/ch07_nudge_runs.json``, which the chapter reads, shows and asserts on
(section 7.7.2 and the appendix, A.2). Each run also trains the same toy without the factor sqrt(d_model)
(both embeddings' ``scale`` set to 1, everything else unchanged, the same nudge) and records its greedy
share and both models' mean loss over the last 20 steps (the appendix, A.1, reads these).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch07_nudge_runs.py 0 1 2 3 4 5 6 7 8
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from companion.data import PAD_ID, CopyReverseDataset, collate_batch
from companion.decode import beam_search, greedy_decode
from companion.model import Transformer, TransformerConfig
from companion.train import adam, inverse_sqrt_warmup, train_step
from companion.utils import set_seed, set_threads

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch07_nudge_runs.json"
STEPS, MIN_LEN, MAX_LEN, NUDGE = 200, 3, 10, 1e-6


def run(nudge_seed: int, factor: bool = True, init_seed: int = 0, tie: bool = True) -> dict:
    """Train the chapter's toy (nudged unless nudge_seed is 0); exact-match shares on the test set.

    ``factor=False``: both embeddings' scale set to 1 (no sqrt(d_model)); only greedy is decoded.
    ``init_seed``: the seed of the initialisation and of the data order (0: the chapter's run;
    ``benchmarks/ch07_seed_runs.py`` varies it). ``tie=False``: a separate generator (the package's
    Xavier initialisation), only greedy decoded, keys ``greedy_untied[_no_factor]`` and
    ``loss_untied[_no_factor]`` (``benchmarks/ch07_untied_runs.py``)."""
    train_data = CopyReverseDataset(
        "reverse", num_examples=STEPS * 64, min_len=MIN_LEN, max_len=MAX_LEN, seed=1
    )
    test_data = CopyReverseDataset(
        "reverse", num_examples=300, min_len=MIN_LEN, max_len=MAX_LEN, seed=2
    )
    vocab = train_data.vocab
    set_seed(init_seed)
    toy = Transformer(TransformerConfig(
        src_vocab=train_data.vocab_size, tgt_vocab=train_data.vocab_size, d_model=64, num_heads=4,
        num_layers=2, d_ff=256, dropout=0.0, norm_first=True, tie_embeddings=tie,
        src_pad_id=PAD_ID, tgt_pad_id=PAD_ID,
    ))  # fmt: skip
    if not factor:
        toy.src_embedding.scale = toy.tgt_embedding.scale = 1.0
    loader = DataLoader(train_data, batch_size=64, shuffle=True, collate_fn=collate_batch,
                        generator=torch.Generator().manual_seed(init_seed))  # fmt: skip
    optimizer = adam(toy.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, inverse_sqrt_warmup(d_model=64, warmup_steps=100)
    )
    noise = torch.Generator().manual_seed(nudge_seed)
    losses = []
    for step, (s, t) in enumerate(loader):
        losses.append(train_step(toy, s, t, optimizer, scheduler, pad_id=PAD_ID).loss)
        if step == 0 and nudge_seed:
            with torch.no_grad():
                for p in toy.parameters():
                    p.add_(torch.randn(p.shape, generator=noise) * NUDGE * p.abs().mean())
    toy.eval()
    test_src, _ = collate_batch([test_data[i] for i in range(len(test_data))])
    references = [vocab.decode(test_data[i][1]) for i in range(len(test_data))]

    def exact_match(output):
        return float(np.mean([vocab.decode(row) == ref for row, ref in zip(output, references)]))

    greedy = exact_match(greedy_decode(toy, test_src, max_len=MAX_LEN + 2))
    loss = float(np.mean(losses[-20:]))
    if not tie:
        suffix = "" if factor else "_no_factor"
        return {f"greedy_untied{suffix}": greedy, f"loss_untied{suffix}": loss}
    if not factor:
        return {"greedy_no_factor": greedy, "loss_no_factor": loss}
    beam3 = exact_match(beam_search(toy, test_src, beam_size=3, max_len=MAX_LEN + 2))
    beam3_bound = exact_match(
        beam_search(toy, test_src, beam_size=3, max_len=MAX_LEN + 2, stop="bound")
    )
    return {"greedy": greedy, "beam3": beam3, "beam3_bound": beam3_bound, "loss": loss}


def describe(label: str, result: dict) -> str:
    """One printed line for a run's record: greedy, both beams, and the run without the factor."""
    return (
        f"{label}: greedy {result['greedy']:.1%}, beam of 3 {result['beam3']:.1%}, "
        f"with the bound stop {result['beam3_bound']:.1%}; without the factor: greedy "
        f"{result['greedy_no_factor']:.1%}, loss {result['loss_no_factor']:.3f} "
        f"(with it: {result['loss']:.3f})"
    )


def main(seeds: list[int]) -> None:
    set_threads(limit=1)
    record = {
        "setup": "section 7.7's toy: reversal, 3-10 digits, 200 steps of batch 64, Pre-LN, tied, d_model 64, "
        "2 + 2 layers; nudge s > 0: every weight += N(0, 1) * 1e-6 * mean|weight| after step 1 "
        "(generator seed s); s = 0: the chapter's run; exact match on the 300 test sequences; "
        "beam3: beam of 3, fairseq's stop (3 finished); beam3_bound: beam of 3, the waiting stop "
        "(no open hypothesis can still win); loss: mean training loss of the last 20 steps; *_no_factor: "
        "the same run with both embeddings' scale 1 instead of sqrt(d_model)",
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "runs": {},
    }
    for seed in seeds:
        record["runs"][str(seed)] = result = {**run(seed), **run(seed, factor=False)}
        print(describe(f"nudge {seed}", result), flush=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(9)))
