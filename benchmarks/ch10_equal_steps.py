"""Section 10.2's toy test with equal steps and equal predictions: bigger batches for the masked LM.

In the chapter's toy test (cell ``f10obj01``) all three runs take 400 steps of 64 rows. The causal
LM predicts all 12 symbols of a row, the masked-LM objective only the ~15% selected ones, so the
causal LM trains on about 6.7 times as many predictions. ``ch10_matched_budget.py`` matches the
predictions by training the masked runs for 2,700 steps, which also gives them 6.75 times the
optimizer steps. This script matches the predictions and keeps the steps: the masked LM under the
causal mask takes the same 400 steps, each on 432 rows (64 x 6.75) instead of 64, so it trains on
at least as many predictions as the causal LM, with as many updates. It records how often it fills
the blank and writes a valid row; the chapter pairs each seed with the same seed of
``ch10_objectives.json``. Learning rate and everything else are unchanged.

The code is not copied: the script reads the notebook and executes cell ``f10obj01`` up to the
line that marks its end, with ``OBJ_SEED`` replaced by each seed, the batch line by 432 rows, and
only the masked LM under the causal mask kept. It also counts the predictions it trained on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_equal_steps.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_equal_steps.py --seeds 0 1

About 30 CPU-seconds per seed on the course's 2-core machine.
"""

from __future__ import annotations

from ch10_toy import (
    ARMS_LINE,
    COUNT_SELECTED,
    COUNTED_RECORD,
    LOSS_LINE,
    ROOT,
    cell_source,
    describe_counted,
    run_and_record,
    run_one_arm,
)

OUT = ROOT / "companion" / "results" / "ch10_equal_steps.json"
ARM = "masked LM, causal mask"
ROWS = 432  # 64 rows x 6.75: 400 steps x 432 rows x ~1.8 selected symbols >= 400 x 64 x 12
BATCH_LINE = "rows = toy_rows(64, rows_drawn)"


def run_seed(cells: list[dict], seed: int) -> dict:
    """Run section 10.2's cell for the masked LM under the causal mask, `ROWS` rows a step."""
    source = cell_source(cells, seed, (ARMS_LINE, BATCH_LINE, LOSS_LINE))
    source = source.replace(ARMS_LINE, f'TOY_ARMS = {{"{ARM}": True}}', 1)
    source = source.replace(BATCH_LINE, f"rows = toy_rows({ROWS}, rows_drawn)", 1)
    source = source.replace(LOSS_LINE, LOSS_LINE + COUNT_SELECTED, 1)
    return run_one_arm(source, ARM, seed, rows_per_step=ROWS)


def main() -> None:
    run_and_record(
        __doc__,
        OUT,
        run_seed,
        describe_counted,
        {
            "description": "Section 10.2's toy test (the chapter's cell f10obj01), the masked LM under the "
            "causal mask only, 400 steps as in the chapter but 432 rows a step instead of 64, so that it "
            "trains on at least as many predictions as the causal LM's 400 steps (400 x 64 x 12 = 307,200) "
            "with as many optimizer steps; the share of blanks it fills (2,000 test rows) and of rows it "
            "writes validly (500 samples)",
        }
        | COUNTED_RECORD,
    )


if __name__ == "__main__":
    main()
