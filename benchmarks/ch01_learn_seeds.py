"""Section 1.6 stage E (gradient descent finds the turn), repeated over seeds.

The chapter trains $W_Q$ and $W_K$ of its previous-token head for one seed live (seed 0), and
runs two controls once: the loss without query 2, and $W_V$ learned too. This script repeats
the same three trainings (300 steps of plain gradient descent, learning rate 0.3, 32 sentences
of random word vectors per step, the chapter's position code and $W_V$) for seeds 0 to 5 and
records, per seed: the turn and stretch read from the position block of $W_Q W_K^\top$, the
last loss, the least weight that a query of the chapter's sentence puts on the previous token,
the turn without query 2 in the loss, and the turn and last loss with $W_V$ learned too. It
writes them to ``companion/results/ch01_learn_seeds.json``, which the chapter's appendix reads,
shows and asserts on (its seed 0 row must match the chapter's live run).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch01_learn_seeds.py 0 1 2 3 4 5

Another CPU rounds sums differently; the trainings converge to the same head, so the numbers
move only in their last digits.
"""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

import torch

from companion.attention import scaled_dot_product_attention

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch01_learn_seeds.json"

VOCAB_SIZE, D_MODEL, SEQ_LEN, STEPS, BATCH, LEARNING_RATE = 8, 4, 7, 300, 32, 0.3
STEP_ANGLE = math.pi / 6  # θ = 30°, as in the chapter


def chapter_setup() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chapter's position code (7, 2), its sentence with positions (7, 6) and stage C's W_V."""
    gen = torch.Generator().manual_seed(0)  # the chapter's generator: the embedding comes first
    token_embedding = torch.randn(VOCAB_SIZE, D_MODEL, generator=gen)  # (vocab_size, d_model)
    vocab = ["I", "like", "machine", "learning", "and", "deep", "is", "fun"]
    tokens = "I like machine learning and deep learning".split()
    x_words = token_embedding[torch.tensor([vocab.index(t) for t in tokens])]  # (7, d_model)
    positions = torch.arange(1, SEQ_LEN + 1, dtype=torch.float32)  # (7,)
    code = torch.stack([torch.cos(STEP_ANGLE * positions), torch.sin(STEP_ANGLE * positions)], -1)
    w_v = torch.zeros(D_MODEL + 2, D_MODEL)  # (d_model + 2, d_model): hands over the word
    w_v[:D_MODEL] = torch.eye(D_MODEL)
    return code, torch.cat([x_words, code], dim=-1), w_v


def turn_and_stretch(block: torch.Tensor) -> tuple[float, float]:
    """block (2, 2) read as κ turn(−θ): the turn θ in degrees, and the stretch κ (the chapter's)."""
    turn = math.degrees(math.atan2(block[1, 0] - block[0, 1], block[0, 0] + block[1, 1]))
    return turn, math.hypot((block[0, 0] + block[1, 1]) / 2, (block[1, 0] - block[0, 1]) / 2)


def train(seed: int, code: torch.Tensor, w_v_fixed: torch.Tensor, first_query: int, learn_v: bool):
    """The chapter's training loop; returns W_Q, W_K, W_V (detached) and the last loss."""
    gen = torch.Generator().manual_seed(seed)
    init_std = 1 / math.sqrt(D_MODEL)
    widths = (2, 2, D_MODEL) if learn_v else (2, 2)
    weights = [
        (init_std * torch.randn(D_MODEL + 2, w, generator=gen)).requires_grad_() for w in widths
    ]
    w_v = weights[2] if learn_v else w_v_fixed
    for _ in range(STEPS):
        words = torch.randn(BATCH, SEQ_LEN, D_MODEL, generator=gen)  # (32, 7, d_model)
        x = torch.cat([words, code.expand(BATCH, -1, -1)], dim=-1)  # (32, 7, d_model + 2)
        out = scaled_dot_product_attention(x @ weights[0], x @ weights[1], x @ w_v, scale=1.0)[0]
        loss = ((out[:, first_query:] - words[:, first_query - 1 : -1]) ** 2).sum(-1).mean()
        loss.backward()
        with torch.no_grad():
            for weight in weights:
                weight -= LEARNING_RATE * weight.grad
                weight.grad = None
    return weights[0].detach(), weights[1].detach(), w_v.detach(), loss.item()


def one_seed(seed: int) -> dict[str, float]:
    """The three trainings of section 1.6 for one seed."""
    code, x_pos, w_v = chapter_setup()
    w_q, w_k, _, loss = train(seed, code, w_v, first_query=1, learn_v=False)
    turn, stretch = turn_and_stretch((w_q @ w_k.T)[D_MODEL:, D_MODEL:])
    weights = torch.softmax((x_pos @ w_q) @ (x_pos @ w_k).T, dim=-1)  # (7, 7), unscaled
    after_first = torch.arange(1, SEQ_LEN)  # (6,): queries 2 to 7
    prev_min = weights[after_first, after_first - 1].min().item()
    w_q2, w_k2, _, _ = train(seed, code, w_v, first_query=2, learn_v=False)
    turn_no2 = turn_and_stretch((w_q2 @ w_k2.T)[D_MODEL:, D_MODEL:])[0]
    w_qv, w_kv, _, loss_v = train(seed, code, w_v, first_query=1, learn_v=True)
    turn_v = turn_and_stretch((w_qv @ w_kv.T)[D_MODEL:, D_MODEL:])[0]
    return {
        "turn": turn,
        "stretch": stretch,
        "loss": loss,
        "prev_min": prev_min,
        "turn_no2": turn_no2,
        "turn_with_v": turn_v,
        "loss_with_v": loss_v,
    }


def main(seeds: list[int]) -> None:
    torch.set_num_threads(1)
    record = {
        "setup": f"{STEPS} steps of gradient descent, learning rate {LEARNING_RATE}, {BATCH} "
        "sentences of random word vectors per step; turn and stretch read from W_Q W_K^T's "
        "position block; prev_min on the chapter's sentence",
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "seeds": {},
    }
    for seed in seeds:
        record["seeds"][str(seed)] = row = one_seed(seed)
        print(seed, {k: round(v, 4) for k, v in row.items()}, flush=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or list(range(6)))
