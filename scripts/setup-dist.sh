#!/usr/bin/env bash
# Installs the two header-only CUDA wheels that flowtune-dist needs to compile its NCCL process group
# (torch's ProcessGroupNCCL.hpp includes crt/host_config.h and nv/target, which the torch wheel does
# not pull in). Versions are the ones torch 2.11's cuda-toolkit 13.0.2 pins. Idempotent: does nothing
# when the headers are there, or when the venv's torch has no CUDA (flowtune-dist then builds Gloo only).
set -euo pipefail
FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
VENV="${FLOWTUNE_VENV:-$FLOWTUNE_CACHE/venv}"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
CUDA_INCLUDE="$SITE/nvidia/cu13/include"

if [ ! -e "$SITE/torch/lib/libtorch_cuda.so" ]; then
  exit 0
fi
if [ -e "$CUDA_INCLUDE/crt/host_config.h" ] && [ -e "$CUDA_INCLUDE/nv/target" ]; then
  exit 0
fi
echo "setup-dist: installing the CUDA crt and cccl headers into $VENV (for flowtune-dist's NCCL support)" >&2
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off --no-deps \
  "nvidia-cuda-crt==13.0.88.*" "nvidia-cuda-cccl==13.0.85.*"
