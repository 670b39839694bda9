#!/usr/bin/env bash
# Installs the files the built-in rewards run on (once), each taken from a PyPI wheel with pip (no
# other download) and checked against its sha256:
#   $FLOWTUNE_OCR_DIR (default $FLOWTUNE_CACHE/ocr): the PP-OCRv6 detection and recognition models
#     of the `rapidocr` wheel and `libonnxruntime.so` of the `onnxruntime` wheel (`ocr` reward);
#   $FLOWTUNE_CACHE/clip: CLIP's BPE merges of the `clip-anytorch` wheel (the CLIP tokenizer when a
#     model folder has no tokenizer files of its own, and its tests).
set -euo pipefail
FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
OCR="${FLOWTUNE_OCR_DIR:-$FLOWTUNE_CACHE/ocr}"
CLIP="$FLOWTUNE_CACHE/clip"
PYTHON="${PYTHON:-python3}"
# destination, wheel it comes from, path inside the wheel, sha256
FILES=(
  "$OCR/PP-OCRv6_det_small.onnx rapidocr==3.10.0 rapidocr/models/PP-OCRv6_det_small.onnx 090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f"
  "$OCR/PP-OCRv6_rec_small.onnx rapidocr==3.10.0 rapidocr/models/PP-OCRv6_rec_small.onnx 6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884"
  "$OCR/libonnxruntime.so.1.32.0 onnxruntime==1.32.0 onnxruntime/capi/libonnxruntime.so.1.32.0 6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f"
  "$CLIP/bpe_simple_vocab_16e6.txt.gz clip-anytorch==2.6.0 clip/bpe_simple_vocab_16e6.txt.gz 924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"
)

verified() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

missing=()
for entry in "${FILES[@]}"; do
  read -r file _ _ sha <<<"$entry"
  verified "$file" "$sha" || missing+=("$entry")
done
[ ${#missing[@]} -eq 0 ] && exit 0

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for entry in "${missing[@]}"; do
  read -r dest wheel inner sha <<<"$entry"
  file=$(basename "$dest")
  echo "setup-rewards: fetching $file from the $wheel wheel" >&2
  # One fixed wheel (CPython 3.11, manylinux_2_28) whatever Python runs pip: the library inside
  # does not depend on the Python version, and the pin below stays valid.
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --disable-pip-version-check --progress-bar off \
    -q -d "$WORK" "$wheel"
  whl=$(ls "$WORK"/"$(echo "${wheel%%==*}" | tr - _)"-*.whl | head -n1)
  "$PYTHON" - "$whl" "$inner" "$WORK/$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  if ! verified "$WORK/$file" "$sha"; then
    echo "setup-rewards: $file from $wheel has sha256 $(sha256sum "$WORK/$file" | cut -d' ' -f1), expected $sha" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$dest")"
  mv "$WORK/$file" "$dest"
done
echo "setup-rewards: OCR models and ONNX Runtime in $OCR, CLIP merges in $CLIP" >&2
