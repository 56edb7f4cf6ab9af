#!/usr/bin/env bash
# GPU check for a short GPU slot (docs/gpu_check.md): bf16 SFT and GRPO steps, FSDP at world size 1 over
# NCCL, chunked log-probs at V=152k with peak memory, greedy sampler parity CPU vs CUDA; one line per check.
#
#   bench/gpu_check.sh [--device cuda|cpu] [--wheels DIR] [-- extra gpu_check.py args]
#   bench/gpu_check.sh --download-wheels DIR [--target-python 3.12]   # on a machine with network
#
# The GPU machine is air-gapped and its Python already has torch, transformers (with tokenizers); this
# script installs only what lemon imports on the checked paths and is missing, from DIR, with
# `pip install --no-index --find-links DIR --target $LEMON_GPU_CHECK_DEPS` (a folder put first on PYTHONPATH,
# default /tmp/lemon-gpu-check-deps): the machine's own Python is never changed, and an externally managed
# (PEP 668) Python does not refuse. Nothing here imports kfp, boto3, fastapi or peft.
# The whole run is capped at 8 minutes (timeout 480); each check also has its own budget (--budget-s).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
DEVICE=cuda
WHEELS=""
DOWNLOAD=""
TARGET_PY=""
DEPS="${LEMON_GPU_CHECK_DEPS:-${TMPDIR:-/tmp}/lemon-gpu-check-deps}"
EXTRA=()
# What lemon_core imports at module import for the checked code paths (config, policy, sft, update, dist,
# fsdp, pool, rollout) beyond torch/transformers: import name -> distribution (versions as pyproject.toml).
MODULES=(pydantic pydantic_settings dotenv yaml tqdm)
DISTS=("pydantic>=2.7,<3" "pydantic-settings>=2.3" "python-dotenv" "pyyaml>=6" "tqdm>=4.66")

usage() { sed -n '5,6p' "$0" | sed 's/^# *//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs cuda or cpu}"; shift 2 ;;
    --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
    --download-wheels) DOWNLOAD="${2:?--download-wheels needs a folder}"; shift 2 ;;
    --target-python) TARGET_PY="${2:?--target-python needs a version such as 3.12}"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

if [ -n "$DOWNLOAD" ]; then
  # Binary wheels only (the GPU machine may have no compiler); --target-python fetches them for another
  # Python version than this one (manylinux x86_64, CPython), e.g. the GPU image's.
  ARGS=(-d "$DOWNLOAD" --only-binary=:all:)
  [ -n "$TARGET_PY" ] && ARGS+=(--python-version "$TARGET_PY" --platform manylinux2014_x86_64 --implementation cp)
  "$PYTHON" -m pip download -q "${ARGS[@]}" "${DISTS[@]}"
  echo "wheels in $DOWNLOAD: $(ls "$DOWNLOAD" | wc -l) files, $(du -sh "$DOWNLOAD" | cut -f1)"
  exit 0
fi

case "$DEVICE" in cuda|cuda:*|cpu) ;; *) echo "gpu_check.sh: --device $DEVICE: use cuda or cpu" >&2; exit 2 ;; esac

for mod in torch transformers tokenizers; do
  "$PYTHON" -c "import $mod" 2>/dev/null || {
    echo "gpu_check.sh: $PYTHON cannot import $mod; this check expects a Python that already has torch and" \
         "transformers (set PYTHON=/path/to/python)" >&2; exit 2; }
done
export PYTHONPATH="$DEPS:$PWD${PYTHONPATH:+:$PYTHONPATH}"
MISSING=()
for i in "${!MODULES[@]}"; do
  "$PYTHON" -c "import ${MODULES[$i]}" 2>/dev/null || MISSING+=("${DISTS[$i]}")
done
if [ ${#MISSING[@]} -gt 0 ]; then
  if [ -z "$WHEELS" ]; then
    echo "gpu_check.sh: missing ${MISSING[*]}; pass --wheels DIR (made with --download-wheels DIR)" >&2; exit 2
  fi
  echo "installing from $WHEELS into $DEPS: ${MISSING[*]}"
  "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" --target "$DEPS" "${MISSING[@]}"
fi

# Large allocations straight from mmap, so freed tensors leave the RSS at once: the CPU peak-memory
# figures (sampled RSS) then measure what each way really holds.
export MALLOC_MMAP_THRESHOLD_=65536
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout 480 "$PYTHON" bench/gpu_check.py --device "$DEVICE" \
  ${EXTRA[@]+"${EXTRA[@]}"}
