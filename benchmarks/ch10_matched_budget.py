"""Section 10.2's toy test with the number of predictions matched: the masked-LM runs trained longer.

In the chapter's toy test (cell ``f10obj01``) all three runs take the same 400 steps. The causal
LM predicts every one of the 12 symbols of a row; the masked-LM objective predicts only the
~15% selected ones. So at equal steps the causal LM trains on about 6.7 times as many
predictions, and the test cannot tell the objective apart from that number. This script trains
the two masked-LM runs (under the causal mask, and with no mask) for ``400 * 12 / 1.8`` steps
rounded up to 2,700, so that each trains on at least as many predictions as the causal LM did in
400 steps, and records how often each fills the blank and writes a valid row. It writes
``companion/results/ch10_matched_budget.json``; the chapter pairs each seed with the same seed of
``ch10_objectives.json``.

The code is not copied: the script reads the notebook and executes cell ``f10obj01`` up to the
line that marks its end, with ``OBJ_SEED`` replaced by each seed, ``TOY_STEPS`` by 2,700, and
the causal LM's run left out. It also counts the predictions each run trained on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_matched_budget.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ch10_matched_budget.py --seeds 0 1

About 70 CPU-seconds per seed (two runs) on the course's 2-core machine.
"""

from __future__ import annotations

from ch10_toy import (
    ARMS_LINE,
    COUNT_SELECTED,
    COUNTED_RECORD,
    LOSS_LINE,
    ROOT,
    cell_namespace,
    cell_source,
    run_and_record,
    run_cell,
)

OUT = ROOT / "companion" / "results" / "ch10_matched_budget.json"
ARMS = ("masked LM, causal mask", "masked LM")
STEPS = 2700  # 400 steps x 12 symbols / (15% of 12 symbols) = 2,667, rounded up
STEPS_LINE = "TOY_STEPS, start = 400, time.process_time()"


def run_seed(cells: list[dict], seed: int) -> dict:
    """Run section 10.2's cell for the two masked-LM arms, `STEPS` steps each, with `seed`."""
    source = cell_source(cells, seed, (ARMS_LINE, STEPS_LINE, LOSS_LINE))
    source = source.replace(
        ARMS_LINE, 'TOY_ARMS = {"masked LM, causal mask": True, "masked LM": False}', 1
    )
    source = source.replace(STEPS_LINE, f"TOY_STEPS, start = {STEPS}, time.process_time()", 1)
    # count the predictions trained on (the selected symbols), on the line that picks them
    source = source.replace(LOSS_LINE, LOSS_LINE + COUNT_SELECTED, 1)
    predictions = dict.fromkeys(ARMS, 0)
    namespace = run_cell(source, cell_namespace(PREDICTIONS=predictions))
    results = namespace["toy_results"]
    return {
        "seed": seed,
        "steps": STEPS,
        "predictions_trained_on": predictions,
        "blank_accuracy": {arm: results[arm][0] for arm in ARMS},
        "valid_rows": {arm: results[arm][1] for arm in ARMS},
        "cpu_seconds": round(namespace["toy_seconds"], 1),
    }


def main() -> None:
    run_and_record(
        __doc__,
        OUT,
        run_seed,
        lambda run: (
            f"predictions {run['predictions_trained_on']}, blank {run['blank_accuracy']}, "
            f"valid rows {run['valid_rows']}"
        ),
        {
            "description": "Section 10.2's toy test (the chapter's cell f10obj01), the two masked-LM runs "
            "only (under the causal mask, and with no mask), trained for 2,700 steps instead of 400 so that "
            "each trains on at least as many predictions as the causal LM's 400 steps (400 x 64 x 12 = "
            "307,200); the share of blanks each fills (2,000 test rows) and of rows each writes validly (500 samples)",
        }
        | COUNTED_RECORD,
    )


if __name__ == "__main__":
    main()
