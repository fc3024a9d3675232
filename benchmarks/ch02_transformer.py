"""Chapter 2, section 2.5: does dropping the 1/√d_k slow a real (small) Transformer? (CPU, 1 thread)

Section 2.5 trains a two-matrix retrieval layer. This script trains the course's encoder-decoder
(``companion.model.Transformer``, chapter 7's class) on the reverse task
(``companion.data.CopyReverseDataset``: digit strings of length 1-8, target = the source
reversed), at a small size: ``d_model`` = 64, **one head**, so each head is d_k = 64 wide (the
paper's width), 2 encoder and 2 decoder layers, ``d_ff`` = 128, no dropout, the package's own
initialisation. Two arms, the same steps, seeds 0, 1, 2 (seed s: ``set_seed(s)`` before the
model is built, and the batches drawn by ``Generator().manual_seed(s)``):

* ``scaled``: the model as the package builds it, softmax(q kᵀ/√d_k) v in all 6 attentions;
* ``unscaled``: the same model with the 1/√d_k removed in all 6 attentions. The package is not
  changed: this script wraps each ``MultiHeadAttention.attend`` so that it receives q·√d_k
  (softmax(q√d_k kᵀ/√d_k) = softmax(q kᵀ)); the wrapper is checked against
  ``scaled_dot_product_attention(..., scale=1.0)`` first.

Both arms start from the same weights and see the same batches (Adam, learning rate 1e-3,
batch 64, gradient clipping at norm 1, the package's ``train_step``). Every EVAL_EVERY steps
it records, on 500 held-out pairs (seed 1, none in the training set): the teacher-forced
cross-entropy per token and the share of tokens right. At step 0 it also records the mean
largest attention weight of every attention (encoder self, decoder self, cross), each arm.
The chapter reads ``companion/results/ch02_transformer.json``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch02_transformer.py   # ~70 CPU-s
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebook_code import write_record  # noqa: E402

from companion.attention import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402
from companion.data import PAD_ID, CopyReverseDataset, collate_batch  # noqa: E402
from companion.model import Transformer, TransformerConfig  # noqa: E402
from companion.train import sequence_loss, shift_targets, train_step  # noqa: E402
from companion.utils import set_seed  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch02_transformer.json"
SEEDS = (0, 1, 2)
STEPS, EVAL_EVERY, BATCH, LR = 400, 25, 64, 1e-3
D_MODEL, HEADS, LAYERS, D_FF, MAX_LEN = 64, 1, 2, 128, 8


def remove_scale(model: torch.nn.Module) -> None:
    """Make every attention of ``model`` compute softmax(q kᵀ) v: q·√d_k reaches the package's attend."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            attend = module.attend  # the bound method of the package

            def unscaled_attend(q, k, v, *args, _attend=attend, **kwargs):
                return _attend(q * math.sqrt(q.shape[-1]), k, v, *args, **kwargs)

            module.attend = unscaled_attend


def check_remove_scale() -> None:
    """The wrapped attend equals scaled_dot_product_attention(..., scale=1.0)."""
    gen = torch.Generator().manual_seed(0)
    module = MultiHeadAttention(16, 1, dropout=0.0)
    holder = torch.nn.Sequential(module)
    remove_scale(holder)
    q, k, v = (torch.randn(2, 1, 5, 16, generator=gen) for _ in range(3))  # (batch, heads, len, hd)
    ours, _ = module.attend(q, k, v)
    want, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.allclose(ours, want, atol=1e-5), (ours - want).abs().max()


def top_weights(model: torch.nn.Module, src, dec_in) -> list[float]:
    """Mean largest attention weight of each attention, in module order (step-0 diagnostic)."""
    found: list[float] = []
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    originals = [m.attend for m in modules]
    for module, attend in zip(modules, originals):

        def with_weights(q, k, v, mask=None, *, _attend=attend, **kwargs):
            kwargs["need_weights"] = True
            out, weights = _attend(q, k, v, mask, **kwargs)
            found.append(weights.max(-1).values.mean().item())
            return out, None

        module.attend = with_weights
    with torch.no_grad():
        model(src, dec_in)
    for module, attend in zip(modules, originals):
        module.attend = attend
    return found


def evaluate(model, src, tgt) -> tuple[float, float]:
    """Teacher-forced cross-entropy per token and share of tokens right, held-out pairs."""
    dec_in, labels = shift_targets(tgt)
    model.eval()
    with torch.no_grad():
        logits = model(src, dec_in)  # (batch, tgt_len - 1, vocab)
    model.train()
    real = labels != PAD_ID
    right = ((logits.argmax(-1) == labels) & real).sum() / real.sum()
    return sequence_loss(logits, labels, PAD_ID).item(), right.item()


def reverse_data() -> tuple[CopyReverseDataset, torch.Tensor, torch.Tensor]:
    """The training set and 500 held-out pairs no training source repeats: (train, src, tgt)."""
    train = CopyReverseDataset("reverse", num_examples=20_000, max_len=MAX_LEN, seed=0)
    seen = {tuple(train[i][0]) for i in range(len(train))}
    cand = CopyReverseDataset("reverse", num_examples=2_000, max_len=MAX_LEN, seed=1)
    held = [cand[i] for i in range(len(cand)) if tuple(cand[i][0]) not in seen][:500]
    assert len(held) == 500, len(held)
    val_src, val_tgt = collate_batch(held)  # (500, src_len), (500, tgt_len)
    return train, val_src, val_tgt


def seeded_model(seed: int, vocab_size: int, arm: str) -> Transformer:
    """The chapter's small Transformer after set_seed(seed); arm "unscaled" drops every 1/√d_k."""
    set_seed(seed)
    config = TransformerConfig(
        vocab_size, vocab_size, d_model=D_MODEL, num_heads=HEADS,
        num_layers=LAYERS, d_ff=D_FF, dropout=0.0, src_pad_id=PAD_ID, tgt_pad_id=PAD_ID,
    )  # fmt: skip
    model = Transformer(config)
    if arm == "unscaled":
        remove_scale(model)
    return model


def train_curve(
    model: Transformer, train, val_src, val_tgt, seed: int, lr: float, clip: float | None = 1.0
) -> dict:
    """Train ``model`` with Adam for STEPS steps on batches drawn by Generator().manual_seed(seed),
    clipping at norm ``clip``, evaluating every EVAL_EVERY steps: the held-out loss and share of
    tokens right, and the share of steps whose gradient norm before clipping exceeded 1."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    curve: dict = {"loss": [], "token_accuracy": []}
    above_1 = 0
    for step in range(STEPS + 1):
        if step % EVAL_EVERY == 0:
            loss, acc = evaluate(model, val_src, val_tgt)
            curve["loss"].append(round(loss, 5))
            curve["token_accuracy"].append(round(acc, 5))
        if step < STEPS:
            idx = torch.randint(0, len(train), (BATCH,), generator=gen).tolist()
            src, tgt = collate_batch([train[i] for i in idx])
            stats = train_step(model, src, tgt, optimizer, pad_id=PAD_ID, clip_norm=clip)
            above_1 += stats.grad_norm > 1.0  # would clipping at norm 1 act on this step?
    curve["share_of_steps_norm_above_1"] = round(above_1 / STEPS, 4)
    return curve


def main() -> None:
    torch.set_num_threads(1)
    check_remove_scale()
    start = time.process_time()
    train, val_src, val_tgt = reverse_data()
    runs: dict[str, dict[str, dict[str, list[float]]]] = {"scaled": {}, "unscaled": {}}
    step0_top: dict[str, dict[str, list[float]]] = {"scaled": {}, "unscaled": {}}
    for seed in SEEDS:
        for arm in ("scaled", "unscaled"):
            model = seeded_model(seed, train.vocab_size, arm)
            step0_top[arm][str(seed)] = [
                round(x, 4) for x in top_weights(model, val_src, shift_targets(val_tgt)[0])
            ]
            curve = train_curve(model, train, val_src, val_tgt, seed, LR)
            del curve["share_of_steps_norm_above_1"]  # this record predates the count
            runs[arm][str(seed)] = curve
            print(
                f"seed {seed} {arm}: step-0 top weights {step0_top[arm][str(seed)]}; "
                f"loss {curve['loss'][0]:.3f} -> {curve['loss'][-1]:.4f}, "
                f"tokens right {curve['token_accuracy'][-1]:.3f}",
                flush=True,
            )
    record = {
        "task": f"reverse, digit strings of length 1-{MAX_LEN}, 20,000 training pairs (seed 0), "
        "500 held-out pairs (seed 1, none in the training set)",
        "model": f"companion.model.Transformer, d_model {D_MODEL}, {HEADS} head (d_k = {D_MODEL // HEADS}), "
        f"{LAYERS}+{LAYERS} layers, d_ff {D_FF}, no dropout, the package's initialisation",
        "training": f"Adam lr {LR}, batch {BATCH}, {STEPS} steps, clip norm 1; seed s: set_seed(s) "
        "(initialisation) and Generator().manual_seed(s) (batches); both arms share both",
        "arms": "scaled: softmax(q kT / sqrt(d_k)); unscaled: softmax(q kT) in all 6 attentions",
        "metric": "held-out teacher-forced cross-entropy per token (loss) and share of tokens right",
        "steps": list(range(0, STEPS + 1, EVAL_EVERY)),
        "held_out": runs,
        "step0_mean_top_weight": step0_top,
        "step0_attentions": "module order: encoder self-attention x2, then per decoder layer self, cross",
    }
    write_record(OUT, record, start)


if __name__ == "__main__":
    main()
