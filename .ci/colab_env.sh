#!/usr/bin/env bash
# Does the chapters' install cell leave a Colab runtime able to show the widgets?
#
# Builds a virtual environment holding the versions Colab preinstalls (its 2026 GPU runtime,
# googlecolab/backend-info pip-freeze.gpu.txt: ipywidgets 7.7.1, ipykernel 6.17.1, IPython 7.34,
# jupyter_client 7.4.9, nbclient 0.10.4, numpy 2.0.2, matplotlib 3.10.0, ...; torch is the
# locally available 2.13.0 instead of Colab's 2.10), installs this repository as the install
# cell does (`pip install <repo>`), and checks that
#   1. no preinstalled package changes version (only new ones are added), ipywidgets included;
#   2. the widget chapters execute there (benchmarks/execute_chapters.py, their widgets built).
# Not part of CI: it downloads packages. Usage: bash .ci/colab_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${1:-/tmp/colab-env}
PY=${PYTHON:-python3.11}

COLAB_PINS=(
  ipywidgets==7.7.1 widgetsnbextension==3.6.10 jupyterlab_widgets==3.0.16
  ipykernel==6.17.1 ipython==7.34.0 jupyter_client==7.4.9 nbclient==0.10.4 nbformat==5.10.4
  traitlets==5.7.1 pyzmq==26.2.1 tornado==6.5.1
  numpy==2.0.2 matplotlib==3.10.0 seaborn==0.13.2 tqdm==4.67.3 scikit-learn==1.6.1 pandas==2.2.2
)

rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q "${COLAB_PINS[@]}"
"$VENV/bin/pip" freeze | sort >"$VENV/before.txt"

# the install cell runs `pip install git+<repository>`: install a copy of the working tree
SRC=$(mktemp -d)
tar cf - --exclude=.venv --exclude=_build --exclude=.git . | tar xf - -C "$SRC"
"$VENV/bin/pip" install -q "$SRC"
"$VENV/bin/pip" freeze | sort >"$VENV/after.txt"

changed=$(comm -23 "$VENV/before.txt" "$VENV/after.txt")
if [ -n "$changed" ]; then
  echo "FAILED: installing the package changed preinstalled packages:"
  echo "$changed"
  exit 1
fi
echo "1. installing the package only added: $(comm -13 "$VENV/before.txt" "$VENV/after.txt" | tr '\n' ' ')"

# Colab's jupyter_client 7.4.9 has no asyncio channel for book/_ext/kernel_reply_poll.py to fix,
# so chapter 4's widget cell may sit out nbclient#312's stall here: a 120-s cell timeout keeps
# that short (a Colab reader is not affected: Colab's front end is not nbclient).
"$VENV/bin/python" benchmarks/execute_chapters.py --runs 1 --chapters 01 02 04 05 07 \
  --cell-timeout 120 --save-dir "$VENV/executed" --out "$VENV/executed.json"
"$VENV/bin/python" - "$VENV/executed" <<'EOF'
import json, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("*.ipynb")):
    nb = json.loads(path.read_text())
    views = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                for c in nb["cells"] for o in c.get("outputs", []))
    assert views >= 1, f"{path.name}: no widget view in the executed chapter"
    print(f"2. {path.name}: {views} widget view(s)")
EOF
echo "Colab environment check passed ($ROOT)"
