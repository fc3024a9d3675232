"""Section 1.7's GRU chain and its control, at several widths (the appendix's recorded table).

The chapter times, at width 64, one GRU call on a 256-step sequence (the chain: each step needs
the previous step's state) and the same GRU on 256 one-step sequences (the control: the same
FLOPs, run as one batched product). This script repeats both at widths 4, 16, 64 and 256 and
records their CPU times. At width 4 the chain does 256 times fewer FLOPs than at width 64: if
its time were proportional to FLOPs, its gap to the control would shrink 256-fold. What is left
is a fixed cost per step. The appendix reads ``companion/results/ch01_gru_widths.json``, prints
it and quotes the share of the gap left at width 4.

    .venv/bin/python benchmarks/ch01_gru_widths.py

Times depend on the machine (the share left at width 4 varies most), so the chapter asserts
only qualitative properties of the recording, with wide margins. One thread, as in the chapter:
the times measure many small steps, not lost parallelism.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parents[1] / "companion" / "results" / "ch01_gru_widths.json"
SEQ_LEN, WIDTHS, REPEATS = 256, (4, 16, 64, 256), 5


def cpu_ms(fn, repeats: int = REPEATS) -> float:
    """CPU milliseconds of this thread for fn(): the fastest of `repeats` calls after a warm-up
    (the chapter's timer)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return 1e3 * min(times)


def cpu_name() -> str:
    """The CPU's model name where Linux reports it, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    widths = {}
    with torch.no_grad():
        for width in WIDTHS:
            gru = nn.GRU(width, width, batch_first=True)
            x = torch.randn(1, SEQ_LEN, width, generator=gen)  # (1, n, width): one sequence
            chain = cpu_ms(lambda gru=gru, x=x: gru(x))
            control = cpu_ms(lambda gru=gru, x=x: gru(x.transpose(0, 1)))  # (n, 1, width)
            widths[str(width)] = {"chain_ms": chain, "control_ms": control}
            print(f"width {width:>3}: chain {chain:6.2f} ms, control {control:6.2f} ms")
    record = {
        "setup": (
            f"nn.GRU(width, width) on one {SEQ_LEN}-step sequence (chain) and on {SEQ_LEN} "
            f"one-step sequences (control); one thread, no gradients; the fastest of {REPEATS} "
            "calls after a warm-up, in CPU milliseconds"
        ),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "widths": widths,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
