#!/usr/bin/env bash
# Set up (if needed) and run the default federated simulation: 10 clients on
# scikit-learn's digits, offline. Extra arguments go to `fedweigh simulate`,
# e.g. scripts/run.sh --run-config "strategy=fedprox num-server-rounds=10"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/fedweigh simulate "$@"
