#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest.
# The tests run on one worker per CPU (pytest-xdist); the real Flower runs keep
# to their groups (one shared simulation, one deployment) so that each group's
# processes start once. FEDWEIGH_TEST_WORKERS=0 runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest -n "${FEDWEIGH_TEST_WORKERS:-auto}" --dist loadgroup "$@"
