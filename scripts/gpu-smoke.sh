#!/bin/bash
# What needs a GPU, run on a machine with NVIDIA GPUs from the repository root (the device tool):
#   1. the health checks on this node's GPUs with each check's figures (benchmarks/gpu_node_checks.py);
#   2. every full recipe profile built on the meta device and its parameter count (tests/test_full_profiles.py);
#   3. tiny recipe runs on the GPUs: bf16 pretraining (tensor 2 x FSDP2 with 2+ GPUs) with save and resume,
#      DPO on every GPU (accelerate's FSDP2: the RL path CPU ranks cannot take), and the model served by one
#      replica on vLLM when it is installed, else the transformers engine (benchmarks/gpu_runs.py);
#   4. Llama 3.1 8B at full width, as its full profile trains: tokens/s per GPU, MFU and peak memory on 1 GPU
#      and on all of them (benchmarks/gpu_recipe.py; a few minutes, most of it compiling).
# It uses .venv if there is one, else python3; a step whose packages are missing says so and the rest go on.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
status=0
echo "== nvidia-smi"
nvidia-smi -L || status=1
echo "== health checks on this node's GPUs"
"$PY" benchmarks/gpu_node_checks.py || status=1
echo "== full profiles on the meta device"
"$PY" -m pytest -q -p no:cacheprovider tests/test_full_profiles.py -k "meta or parameters" || status=1
echo "== tiny recipe runs on the GPUs"
"$PY" benchmarks/gpu_runs.py || status=1
echo "== llama3.1-8b at full width: tokens/s, MFU, memory"
"$PY" benchmarks/gpu_recipe.py || status=1
exit $status
