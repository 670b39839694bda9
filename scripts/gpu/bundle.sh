#!/usr/bin/env bash
# `make gpu-bundle`: everything the GPU suite needs in one ignored folder, gpu-bundle/ (at most
# 60 MiB), for a GPU machine with torch 2.11's libraries and Python but no Rust and no network:
# the flowtune binary (debug sections stripped), the suite's scripts, the recipes and configs it
# runs, the parity fixtures, and the diffusers wheel for the anchors. On that machine:
#   bash gpu-bundle/scripts/gpu/suite.sh --out DIR
# The device tool sends the whole checkout with the bundle and takes at most 64 MiB: the checkout's
# tracked files are larger (fixtures/, examples/shapes/), so `scripts/gpu/slim.sh` takes those out
# of the work tree before the call and `git checkout -- fixtures examples/shapes` puts them back.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=gpu-bundle
LIMIT=$((60 * 1024 * 1024))
rm -rf "$B"
mkdir -p "$B/scripts/gpu" "$B/examples/prompts" "$B/fixtures" "$B/wheels"
strip --strip-debug -o "$B/flowtune" target/release/flowtune
cp scripts/gpu/*.sh scripts/gpu/*.py "$B/scripts/gpu/"
cp scripts/bench_rollout_diffusers.py scripts/bench_transformer_diffusers.py \
    scripts/measure_activation_constants.py "$B/scripts/"
# The recipes named by the scripts that run on the GPU machine, and part i's reward server.
SCRIPTS=(scripts/gpu/suite.sh scripts/gpu/parity.sh scripts/gpu/overlap.sh scripts/gpu/collect.py)
cp $(grep -ohE "examples/[A-Za-z0-9_]+\.yaml" "${SCRIPTS[@]}" | sort -u) examples/reward_server.py \
    "$B/examples/"
cp examples/prompts/tiny.txt "$B/examples/prompts/"
# Every shipped config (the activation constants are measured on each family's block).
cp -r examples/models "$B/examples/"
for f in sd3_tiny flux_dev_tiny qwen_image_tiny wan_t2v_tiny z_image_tiny; do
    cp -r "fixtures/$f" "fixtures/${f}_io.safetensors" "$B/fixtures/"
done
scripts/setup-anchors.sh "$B/wheels"
# Every file the suite's scripts name must be in the bundle: the GPU machine has no checkout.
missing=0
for f in $(grep -ohE "(examples|scripts|fixtures)/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\.(yaml|py|sh|txt)" \
    "${SCRIPTS[@]}" | sort -u); do
    [[ -e "$B/$f" ]] || { echo "gpu-bundle: $f is named by the suite but not in $B/" >&2; missing=1; }
done
((missing == 0)) || exit 1
bytes=$(du -sb "$B" | cut -f1)
if ((bytes > LIMIT)); then
    echo "gpu-bundle: $((bytes / 1048576)) MiB, over the 60 MiB limit" >&2
    exit 1
fi
echo "gpu-bundle: $((bytes / 1048576)) MiB in $B/ (run: bash $B/scripts/gpu/suite.sh --out DIR)"
