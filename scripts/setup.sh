#!/usr/bin/env bash
# Create .venv with everything fedweigh needs (idempotent: re-runs only when
# pyproject.toml changed). Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "fedweigh needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

stamp=.venv/.fedweigh-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$wanted" ]]; then
    exit 0
fi

echo "[setup] creating .venv and installing fedweigh (first time: a few minutes)"
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch and torchvision are pinned in pyproject.toml; installing them first
# keeps pip from resolving them against anything else already on the machine.
.venv/bin/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "$wanted" > "$stamp"
echo "[setup] done"
