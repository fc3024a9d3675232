"""Print per-notebook execution times from nbval's JUnit report and the book build log.

Usage: python .ci/report_times.py JUNIT_XML [BUILD_LOG]
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def nbval_times(junit: Path) -> dict[str, float]:
    """Sum nbval's per-cell test times by notebook."""
    times: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("classname", "") + "::" + case.get("name", "")
        match = re.search(r"(book[/.][\w.-]+?)(?:\.ipynb)?::", name)
        if match and "Cell" in name:
            times[match.group(1).replace("book.", "book/")] += float(case.get("time", 0))
    return dict(times)


def build_times(log: Path) -> dict[str, float]:
    """myst-nb logs '<path>.ipynb: Executed notebook in N seconds' for each chapter."""
    times = {}
    for line in log.read_text(errors="replace").splitlines():
        if m := re.search(r"(\S+\.ipynb): Executed notebook in ([\d.]+) seconds", line):
            times[Path(m.group(1)).name] = float(m.group(2))
    return times


def main() -> int:
    junit = Path(sys.argv[1])
    if len(sys.argv) > 2 and Path(sys.argv[2]).exists():
        built = build_times(Path(sys.argv[2]))
        print(f"{'notebook (book build)':45s} {'seconds':>10s}")
        for name, seconds in built.items():
            print(f"{name:45s} {seconds:10.1f}")
        print(f"{'total':45s} {sum(built.values()):10.1f}\n")
    if not junit.exists():
        print(f"no JUnit report at {junit}")
        return 1
    nbval = nbval_times(junit)
    print(f"{'notebook (nbval, sum of cell times)':45s} {'seconds':>10s}")
    for name, seconds in sorted(nbval.items()):
        print(f"{name:45s} {seconds:10.1f}")
    print(f"{'total':45s} {sum(nbval.values()):10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
