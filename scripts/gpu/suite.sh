#!/usr/bin/env bash
# The GPU suite: flowtune measured at real size on whatever CUDA GPU is available, in one command
# of at most 8 minutes on one H100, each part under its own time bound so that a failure keeps the
# others' results. It writes docs/perf/gpu/<date>-<gpu>.json and one Markdown row per part
# (<date>-<gpu>.md) under --out.
#   a  env        `flowtune env`
#   b  parity     denoiser fixtures on the GPU against their diffusers outputs: f32 at CPU
#                 tolerance, bf16 at a stated one; one training step launched as one NCCL rank
#   c  qwen       Qwen-Image at real size (60 blocks, random weights, stand-in prompt embeddings
#                 of 32 tokens), examples/flow_grpo_qwen_image.yaml at 2 prompts x 16 images with
#                 gradient checkpointing, the cheap `brightness` reward; two steps, the second timed
#   d  anchors    diffusers on the same GPU and shapes: QwenImagePipeline's denoising loop, and
#                 its transformer with a PEFT LoRA forward + backward at the training micro-batch
#   e  constants  the planner's activation constants measured on the GPU (run before c, whose plan
#                 figure takes them)
#   f  more       if time remains: Wan2.2-TI2V-5B at 480p x 33 frames, FLUX.2 [klein] at 1024²
#   g  items off  c again with issue 53's throughput items switched off (attention without padding
#                 masks, fused projections): c over g is what they gain on this GPU
#   h  ltx2       if time remains: LTX-2.3 with sound (48 blocks, random weights) at 512² x 33
#                 frames, 4 clips, 8 rollout steps, gradient checkpointing
#   i  overlap    rewards scored beside sampling: Qwen-Image at real width (8 blocks), an `http`
#                 reward answering each request of 2 images after 0.5 s, overlapped and serial steps
#                 alternated (scripts/gpu/overlap.sh)
# --tiny runs every part on the CPU with tiny configs (CI checks the suite this way).
#
# Usage: scripts/gpu/suite.sh [--tiny] [--out DIR] [--parts a,b,c,d,e,f,g,h,i] [--budget SECONDS]
# From the bundle (`make gpu-bundle`; the GPU machine needs no Rust and no network):
#   bash gpu-bundle/scripts/gpu/suite.sh --out "$OUT"
# Environment: FLOWTUNE_BIN (the binary; default gpu-bundle/flowtune, else target/release/flowtune),
# PYTHON (a Python with torch 2.11; default python3), FLOWTUNE_WHEELS (wheels installed for the
# anchors when diffusers is not importable; default the bundle's wheels/).
set -uo pipefail
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$HERE"
TINY=0 OUT="docs/perf/gpu" PARTS="a,b,c,d,e,f,g,h,i" BUDGET=480
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tiny) TINY=1 ;;
        --out) OUT="$2"; shift ;;
        --parts) PARTS="$2"; shift ;;
        --budget) BUDGET="$2"; shift ;;
        *) echo "suite: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
START=$SECONDS
PYTHON="${PYTHON:-python3}"
BIN="${FLOWTUNE_BIN:-}"
[[ -n "$BIN" ]] || for b in gpu-bundle/flowtune flowtune target/release/flowtune; do
    [[ -x "$b" ]] && BIN="$PWD/$b" && break
done
[[ -x "$BIN" ]] || { echo "suite: no flowtune binary (set FLOWTUNE_BIN or make gpu-bundle)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flowtune-suite.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/parts"

# libtorch and the CUDA libraries of the Python's torch wheel.
site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') || {
    echo "suite: $PYTHON has no torch" >&2; exit 2; }
libs="$site/torch/lib"
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu*/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# diffusers for the anchors: importable already, or installed from the carried wheels.
if ! "$PYTHON" -c 'import diffusers' 2>/dev/null; then
    wheels="${FLOWTUNE_WHEELS:-wheels}"
    [[ -d gpu-bundle/wheels ]] && wheels="${FLOWTUNE_WHEELS:-gpu-bundle/wheels}"
    if compgen -G "$wheels/*.whl" >/dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$wheels"/*.whl
        export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [[ $TINY == 1 ]]; then DEVICE=cpu; else DEVICE=cuda; fi
F=("$BIN" --device "$DEVICE")

# part NAME SECONDS COMMAND…: runs COMMAND under a time bound; its log and status go to parts/.
part() {
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - (SECONDS - START)))
    if [[ ",$PARTS," != *",$name,"* ]]; then return; fi
    if ((left < 20)); then
        echo "skipped: out of time" >"$WORK/parts/$name.status"; return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (at most ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$WORK/parts/$name.log" 2>&1
    local rc=$?
    local status="ok"
    ((rc == 124 || rc == 137)) && status="timeout after ${limit}s"
    ((rc != 0 && rc != 124 && rc != 137)) && status="failed (exit $rc)"
    echo "$status" >"$WORK/parts/$name.status"
    echo "$((SECONDS - t0))" >"$WORK/parts/$name.seconds"
    tail -n 3 "$WORK/parts/$name.log"
    echo "-- $name: $status in $((SECONDS - t0))s"
}

if [[ $TINY == 1 ]]; then
    "$BIN" make-tiny qwen-image "$WORK/qwen" >/dev/null
    "$BIN" make-tiny wan "$WORK/wan" >/dev/null
    "$BIN" make-tiny flux2 "$WORK/flux2" >/dev/null
    "$BIN" make-tiny ltx2 --ltx23 "$WORK/ltx2" >/dev/null
    QWEN=(examples/flow_grpo_qwen_image_tiny.yaml model.path="$WORK/qwen")
    QWEN_ANCHOR=(--resolution 32 --batch 2 --steps 2 --text-tokens 8)
    QWEN_TRAIN=(--batch 2 --latent 4 --text-tokens 8 --lora-rank 4)
    WAN=(examples/flow_grpo_wan_tiny.yaml model.path="$WORK/wan")
    FLUX2=(examples/flow_grpo_flux2_tiny.yaml model.path="$WORK/flux2")
    LTX2=(examples/flow_grpo_ltx2_tiny.yaml model.path="$WORK/ltx2")
    CONSTANTS=(--side 8 --text-len 8 --device cpu)
    QWEN_DIR="$WORK/qwen"
    OVERLAP=(examples/flow_grpo_qwen_image_tiny.yaml model.path="$WORK/qwen" rollout.n=4
        rollout.batch_size=2)
    DELAY=0.05 ROUNDS=1
else
    QWEN=(examples/flow_grpo_qwen_image.yaml model.path=examples/models/qwen-image
        data.prompts_per_step=2 rollout.n=16 trainer.gradient_checkpointing=true)
    # The rollout's model batch: 32 samples with CFG; the update's micro-batch 4 with CFG (8 rows).
    QWEN_ANCHOR=(--resolution 512 --batch 32 --steps 10 --guidance 4.0 --text-tokens 32)
    QWEN_TRAIN=(--batch 8 --latent 64 --text-tokens 32 --lora-rank 64)
    WAN=(examples/flow_grpo_wan.yaml model.path=examples/models/wan2.2-ti2v-5b model.resolution=480
        model.num_frames=33 data.prompts_per_step=1 rollout.n=4 trainer.gradient_checkpointing=true)
    FLUX2=(examples/flow_grpo_flux2.yaml model.path=examples/models/flux.2-klein-base-4b
        model.resolution=1024 data.prompts_per_step=1 rollout.n=4 trainer.gradient_checkpointing=true)
    LTX2=(examples/flow_grpo_ltx2.yaml model.path=examples/models/ltx-2.3 model.num_frames=33
        data.prompts_per_step=1 rollout.n=4 rollout.steps=8 rollout.sde_window_range=[0,6]
        model.offload=none trainer.sharding=none trainer.ppo_mini_batch_size=4)
    CONSTANTS=(--device cuda)
    QWEN_DIR=examples/models/qwen-image
    # 8 images a step in chunks of 2, one request each; the update at 8 samples.
    OVERLAP=(examples/flow_grpo_qwen_image.yaml model.path=examples/models/qwen-image
        data.prompts_per_step=2 rollout.n=4 rollout.batch_size=2 trainer.ppo_mini_batch_size=8
        trainer.gradient_checkpointing=true --layers 8)
    DELAY=0.5 ROUNDS=2
fi

part a 60 "${F[@]}" env
part b 150 bash scripts/gpu/parity.sh "$BIN" "$DEVICE" "$WORK/parity"
# e before c, so that c's plan figure takes the constants measured on this GPU.
part e 90 bash -c "'$PYTHON' scripts/measure_activation_constants.py ${CONSTANTS[*]} \
    --json '$WORK/parts/e.json'"
MEASURED=()
[[ -s "$WORK/parts/e.json" ]] && MEASURED=(--constants "$WORK/parts/e.json")
part c 240 "${F[@]}" bench step "${QWEN[@]}" --random-weights --text-tokens 32 "${MEASURED[@]}" \
    --json "$WORK/parts/c.json"
part d 150 bash -c "set -e
    '$PYTHON' scripts/bench_rollout_diffusers.py '$QWEN_DIR' --random-weights --device $DEVICE \
        --dtype $([[ $TINY == 1 ]] && echo f32 || echo bf16) ${QWEN_ANCHOR[*]} --iters 1 \
        --json '$WORK/parts/d_rollout.json'
    '$PYTHON' scripts/bench_transformer_diffusers.py --random-weights '$QWEN_DIR/transformer' \
        --device $DEVICE --dtype $([[ $TINY == 1 ]] && echo f32 || echo bf16) ${QWEN_TRAIN[*]} \
        --iters 2 --json '$WORK/parts/d_train.json'"
part i 120 bash scripts/gpu/overlap.sh "$PYTHON" "$DELAY" 2 "$WORK/parts/i.json" "${F[@]}" \
    bench step "${OVERLAP[@]}" --random-weights --text-tokens 32 --warmup 0 --overlap-ab "$ROUNDS"
part g 200 "${F[@]}" bench step "${QWEN[@]}" model.unpadded_attention=false \
    model.fused_projections=false --random-weights --text-tokens 32 "${MEASURED[@]}" \
    --json "$WORK/parts/g.json"
part h 150 "${F[@]}" bench step "${LTX2[@]}" --random-weights --json "$WORK/parts/h.json"
part f 120 bash -c "set -e
    '$BIN' --device $DEVICE bench step ${WAN[*]} --random-weights --json '$WORK/parts/f_wan.json'
    '$BIN' --device $DEVICE bench step ${FLUX2[*]} --random-weights --json '$WORK/parts/f_flux2.json'"

"$PYTHON" scripts/gpu/collect.py "$WORK/parts" --out "$OUT" --tiny "$TINY"
