#!/usr/bin/env bash
# Part b of the GPU suite: denoiser fixtures run on DEVICE against the outputs diffusers gave for
# them, f32 at the CPU tests' tolerance and bf16 at a stated one, then one training step launched as
# a one-rank job (NCCL on a GPU, Gloo on the CPU). Each case prints a `case …` line first.
# Usage: scripts/gpu/parity.sh FLOWTUNE_BIN cpu|cuda WORKDIR
set -euo pipefail
BIN=$1 DEVICE=$2 WORK=$3
cd "$(dirname "$0")/../.."
mkdir -p "$WORK"
FIXTURES=fixtures
[[ -d gpu-bundle/fixtures ]] && FIXTURES=gpu-bundle/fixtures
forward() { # fixture dtype tolerance
    echo "case $1 $2 $3"
    "$BIN" --device "$DEVICE" debug forward --component "$FIXTURES/$1" \
        --inputs "$FIXTURES/$1_io.safetensors" --out "$WORK/out.safetensors" --dtype "$2" --check "$3"
}
for f in sd3_tiny flux_dev_tiny qwen_image_tiny wan_t2v_tiny z_image_tiny; do
    forward "$f" f32 1e-4
done
# bf16 on the fixtures whose outputs bf16 rounding moves little: diffusers' own bf16 forward of the
# tiny FLUX.1 and Qwen-Image fixtures is 0.44 and 0.34 off its f32 output (flowtune's the same).
for f in sd3_tiny wan_t2v_tiny z_image_tiny; do
    forward "$f" bf16 3e-2
done
"$BIN" make-tiny sd3 "$WORK/tiny-sd3" >/dev/null
echo "case launch --nproc 1 ($([[ $DEVICE == cuda ]] && echo NCCL || echo Gloo))"
"$BIN" launch --nproc 1 -- --device "$DEVICE" train examples/flow_grpo_tiny.yaml \
    model.path="$WORK/tiny-sd3" trainer.total_steps=1 trainer.output_dir="$WORK/launch"
