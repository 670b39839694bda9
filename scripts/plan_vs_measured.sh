#!/usr/bin/env bash
# `flowtune plan` against measured peak resident memory on this machine (docs/plan.md, "Checked
# against measurement"). For every family: a real-width transformer with 1–2 blocks
# (`make-tiny --config`), tiny encoders and VAE, bf16 and f32, 64² (Wan 5 frames); it measures
#   load    `bench load`:                 VmHWM − VmRSS before loading   vs the planner's weights
#   rollout `bench rollout` (CFG, 2 steps): max RSS − baseline           vs weights + encoders + VAE
#                                                                          + rollout activations
#   step    `train` one LoRA step:        perf/max_memory_rss_gb − baseline vs device + host total
# where the baseline is the process's resident memory before any model is loaded (libtorch and
# the binary, `bench load`'s rss_before_bytes). Prints a Markdown table.
#   scripts/plan_vs_measured.sh [FAMILY…]      # sd3 flux qwen-image z-image wan wan-a14b
set -euo pipefail
cd "$(dirname "$0")/.."
# glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), then keeps freed blocks
# below it resident: pinned at 128 KiB, a peak measures what the process holds, not what the
# allocator keeps (FLUX's bf16 step: 0.28 GiB lower).
export MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072
BIN=${FLOWTUNE_BIN:-target/release/flowtune}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/plan-vs-measured.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
GIB=1073741824

# family: shipped model, make-tiny flags, tiny recipe, extra overrides
declare -A MODEL=(
    [sd3]="sd3.5-medium" [flux]="flux.1-dev" [qwen-image]="qwen-image"
    [z-image]="z-image-turbo" [wan]="wan2.2-ti2v-5b" [wan-a14b]="wan2.2-t2v-a14b")
declare -A TINY=(
    [sd3]="sd3 --layers 2" [flux]="flux --layers 1 --single-layers 1"
    [qwen-image]="qwen-image --layers 1" [z-image]="z-image --layers 1"
    [wan]="wan --layers 2" [wan-a14b]="wan --a14b --layers 1")
# the text tokens `bench rollout` runs with: the pipelines' own padding (SD3's T5 256, FLUX's 512),
# Qwen-Image's unpadded prompt, Z-Image's rounded to 32 (Wan's text is cross-attended: no tokens)
declare -A TEXT=([sd3]=256 [flux]=512 [qwen-image]=16 [z-image]=32 [wan]=16 [wan-a14b]=16)
declare -A RECIPE=(
    [sd3]=flow_grpo_tiny [flux]=flow_grpo_flux_tiny [qwen-image]=flow_grpo_qwen_image_tiny
    [z-image]=flow_grpo_z_image_tiny [wan]=flow_grpo_wan_tiny [wan-a14b]=flow_grpo_wan_a14b_tiny)

pct() { jq -n "($1) / ($2) * 100 - 100 | round"; }
gib() { jq -n "($1) / $GIB * 100 | round / 100"; }

echo "| family | dtype | load GiB (plan, Δ) | rollout GiB (plan, Δ) | step GiB (plan, Δ) |"
echo "|---|---|---|---|---|"
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(sd3 flux qwen-image z-image wan wan-a14b)
for family in "${families[@]}"; do
    for dtype in bf16 f32; do
        dir=$WORK/$family-$dtype
        # shellcheck disable=SC2086
        "$BIN" make-tiny ${TINY[$family]} "$dir" --dtype "$dtype" \
            --config "examples/models/${MODEL[$family]}/transformer/config.json" >/dev/null
        frames=()
        over=(model.path="$dir" model.dtype="$dtype" model.resolution=64 trainer.total_steps=1
            trainer.image_freq=0 trainer.save_freq=0 trainer.output_dir="$WORK/run")
        if [[ $family == wan* ]]; then
            frames=(--num-frames 5)
            over+=(model.num_frames=5)
        fi

        load=$("$BIN" bench load --component "$dir/transformer" --dtype "$dtype")
        base=$(jq .rss_before_bytes <<<"$load")
        load_m=$(jq '.rss_peak_bytes - .rss_before_bytes' <<<"$load")
        peak_kb=$( { /usr/bin/time -f %M "$BIN" bench rollout --model "$dir" --dtype "$dtype" \
            --batch 1 --steps 2 --iters 1 --resolution 64 "${frames[@]}" >/dev/null; } 2>&1 | tail -1)
        rollout_m=$((peak_kb * 1024 - base))
        rm -rf "$WORK/run"
        "$BIN" train "examples/${RECIPE[$family]}.yaml" "${over[@]}" >/dev/null 2>&1
        step_m=$(tail -1 "$WORK/run/metrics.jsonl" | jq ".\"perf/max_memory_rss_gb\" * $GIB - $base")

        plan=$("$BIN" plan "examples/${RECIPE[$family]}.yaml" "${over[@]}" --json)
        # `bench load` loads `transformer/`, one expert of Wan2.2-A14B's two.
        load_p=$(jq '[.items[] | select(.item | test("^transformer( |$)"))] | map(.bytes) | add' <<<"$plan")
        # the rollout as `bench rollout` runs it: one row, CFG, the pipeline's text length
        roll=$("$BIN" plan "examples/${RECIPE[$family]}.yaml" "${over[@]}" rollout.batch_size=1 \
            rollout.guidance_scale=4.5 model.max_sequence_length="${TEXT[$family]}" --json)
        rollout_p=$(jq '[.items[] | select(.item | test("^(transformer|text_encoder|vae|rollout act)"))]
            | map(.bytes) | add' <<<"$roll")
        step_p=$(jq "(.device_gib + .host_gib) * $GIB" <<<"$plan")
        row="| $family | $dtype"
        for pair in "$load_m $load_p" "$rollout_m $rollout_p" "$step_m $step_p"; do
            read -r measured planned <<<"$pair"
            row+=" | $(gib "$measured") ($(gib "$planned"), $(pct "$planned" "$measured") %)"
        done
        echo "$row |"
        rm -rf "$dir"
    done
done
