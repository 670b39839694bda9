#!/usr/bin/env bash
# Creates the torch venv flowtune builds and runs against, if it is missing or incomplete.
# A stamp file marks a finished install, so an interrupted one is redone from scratch.
set -euo pipefail
TORCH_VERSION=2.11.0
FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-$HOME/.cache/flowtune}"
VENV="${FLOWTUNE_VENV:-$FLOWTUNE_CACHE/venv}"
STAMP="$VENV/.flowtune-torch-$TORCH_VERSION"

if [ -f "$STAMP" ]; then
  exit 0
fi
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: $PYTHON not found; flowtune needs Python 3 (3.10–3.13) to install the torch wheel" >&2
  exit 1
fi
echo "setup: installing torch==$TORCH_VERSION into $VENV (first run only; about 4 GB)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
  "torch==$TORCH_VERSION"
"$VENV/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__"
touch "$STAMP"
echo "setup: torch ready in $VENV" >&2
