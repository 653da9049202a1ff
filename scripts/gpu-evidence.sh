#!/usr/bin/env bash
# `fedweigh benchmark gpu-evidence` on a lent GPU machine, which reaches no registry and holds no Flower.
#
# Here, first (2-4 minutes; docs/benchmarks.md §9):
#   .venv/bin/python -m fedweigh.benchmarks.gpu_bundle build     # .gpu-bundle/: wheels, CIFAR-10 slice, manifest
# Then one device call:
#   run(command="bash scripts/gpu-evidence.sh", carry=[".gpu-bundle"], timeout_s=600)
#
# There it installs the carried wheels into a folder of their own (the image's torch, numpy, scipy, pyarrow
# and peft stay), runs every case that fits in FEDWEIGH_GPU_BUDGET seconds (default 480: a 600 s call less
# the install and the copies), and leaves in $OUT: gpu-evidence.json (rewritten after every step, so a time
# limit keeps what was measured), log.txt, machine.txt and runs.tgz (each run's summary, CSVs and plots, no
# checkpoints). Extra arguments go to the benchmark, e.g. --cases flood,overhead (--quick: the smoke mode on a
# CPU, as tests/test_gpu_bundle.py runs this script). FEDWEIGH_GPU_BUNDLE and FEDWEIGH_GPU_SITE move the bundle
# and the install folder.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$(realpath -m "${FEDWEIGH_GPU_BUNDLE:-.gpu-bundle}")
out=${OUT:-outputs/gpu-evidence-device}
site=${FEDWEIGH_GPU_SITE:-/tmp/fedweigh-site}
budget=${FEDWEIGH_GPU_BUDGET:-480}
mkdir -p "$out"
if [[ ! -f $bundle/wheels.tar.xz ]]; then
    echo "gpu-evidence.sh: $bundle/wheels.tar.xz is missing: build the bundle here first" \
        "(python -m fedweigh.benchmarks.gpu_bundle build) and name $bundle in the call's carry" >&2
    exit 2
fi
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.cuda.is_available())'
    nproc
} >"$out/machine.txt"
cat "$out/machine.txt"

started=$(date +%s)
if [[ ! -f $site/.installed ]]; then  # a warm machine keeps it between calls
    wheels=$(mktemp -d)
    tar xJf "$bundle/wheels.tar.xz" -C "$wheels" || exit 3
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/wheels/*.whl \
        || exit 3
    rm -rf "$wheels"
    touch "$site/.installed"
fi
echo "gpu-evidence.sh: wheels installed in $site in $(($(date +%s) - started)) s"

export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
export FEDWEIGH_DATASETS="$bundle/datasets" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -m fedweigh.cli benchmark gpu-evidence --ray per-run --budget "$budget" --output "$out/gpu-evidence.json" \
    "$@" 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}
if compgen -G "outputs/gpu-evidence*" >/dev/null; then
    tar czf "$out/runs.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude='checkpoint*' outputs/gpu-evidence*
fi
exit "$status"
