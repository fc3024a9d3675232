"""Section 10.2's toy test, direct control: a causal LM whose loss sees only ~15% of its targets.

In the chapter's toy test (cell ``f10obj01``) the causal LM writes valid rows more often than the
masked-LM runs. Three things differ between them: the masked runs read corrupted rows (15% of
the symbols hidden or swapped), predict only those ~15% of the symbols, and (without the causal
mask) see both sides. ``ch10_matched_budget.py`` trains the masked runs 6.75 times longer, which
changes the number of steps and rows as well as the number of predictions. This control changes
the number of predictions alone: the causal LM of the cell, with the same 400 steps, the same
clean rows, the same initial weights and the causal mask, but its loss taken only at the symbols
the masked-LM objective would have selected in that row (the same selection generator, so the
same positions and the same count, about 15%). It writes
``companion/results/ch10_sparse_targets.json``; the chapter pairs each seed with the same seed of
``ch10_objectives.json``.

The code is not copied: the script reads the notebook and executes cell ``f10obj01`` up to the
line that marks its end, with ``OBJ_SEED`` replaced by each seed, only the causal LM's run, and
its loss line replaced by the sparse one.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_sparse_targets.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_sparse_targets.py --seeds 0 1

About 5 CPU-seconds per seed on the course's 2-core machine.
"""

from __future__ import annotations

from ch10_toy import (
    ARMS_LINE,
    COUNTED_RECORD,
    ROOT,
    cell_source,
    describe_counted,
    run_and_record,
    run_one_arm,
)

OUT = ROOT / "companion" / "results" / "ch10_sparse_targets.json"
ARM = "causal LM"
LOSS_LINE = "loss = sequence_loss(model(inputs), targets, PAD_ID)"
# The same selection the masked-LM runs draw for these rows (same generator, same call), moved
# one position left: the causal LM predicts rows[:, p] at output p - 1. The inputs stay clean.
SPARSE_LOSS = (
    "_, picked, _ = masked_lm_example(rows, mask_id=TOY_MASK, vocab_size=toy_config.tgt_vocab, "
    "special_ids=TOY_SPECIAL, generator=masking); keep = (picked != PAD_ID)[:, 1:]; "
    "PREDICTIONS[objective] += int(keep.sum()); "
    "loss = F.cross_entropy(model(inputs)[keep], targets[keep])"
)


def run_seed(cells: list[dict], seed: int) -> dict:
    """Run section 10.2's cell for the causal LM only, its loss on the masked-LM selection, `seed`."""
    source = cell_source(cells, seed, (ARMS_LINE, LOSS_LINE))
    source = source.replace(ARMS_LINE, 'TOY_ARMS = {"causal LM": True}', 1)
    source = source.replace(LOSS_LINE, SPARSE_LOSS, 1)
    return run_one_arm(source, ARM, seed)


def main() -> None:
    run_and_record(
        __doc__,
        OUT,
        run_seed,
        describe_counted,
        {
            "description": "Section 10.2's toy test (the chapter's cell f10obj01), the causal LM only, "
            "400 steps on the same clean rows with the causal mask, its loss taken only at the ~15% of "
            "symbols the masked-LM objective selects in each row (the same selection); the share of "
            "blanks it fills (2,000 test rows) and of rows it writes validly (500 samples)",
        }
        | COUNTED_RECORD,
    )


if __name__ == "__main__":
    main()
