#!/usr/bin/env bash
# Makes sure the torch venv flowtune builds and runs against exists: creates it (once) under
# $FLOWTUNE_CACHE, or checks the one named by FLOWTUNE_VENV. A venv this script made carries a
# marker; only such a venv is ever deleted (when its install was interrupted or broke).
set -euo pipefail
TORCH_VERSION=2.11.0
FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
VENV="${FLOWTUNE_VENV:-$FLOWTUNE_CACHE/venv}"
MARKER="$VENV/.flowtune-managed"
CHECK="import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  exit 0
fi
if [ -e "$VENV" ] && [ ! -f "$MARKER" ]; then
  echo "setup: $VENV exists but has no working torch==$TORCH_VERSION; install it there (pip install torch==$TORCH_VERSION) or unset FLOWTUNE_VENV" >&2
  exit 1
fi
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: $PYTHON not found; flowtune needs Python 3.10–3.13 to install the torch wheel" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))'; then
  echo "setup: $("$PYTHON" --version 2>&1) found; torch==$TORCH_VERSION wheels need Python 3.10–3.13 (set PYTHON=...)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup: $PYTHON cannot create venvs (on Debian/Ubuntu: apt-get install python3-venv)" >&2
  exit 1
fi
echo "setup: installing torch==$TORCH_VERSION into $VENV (first run only; about 4 GB)" >&2
rm -rf "$VENV"
mkdir -p "$VENV"
touch "$MARKER"
"$PYTHON" -m venv "$VENV"
touch "$MARKER"
"$VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
  "torch==$TORCH_VERSION"
"$VENV/bin/python" -c "$CHECK"
echo "setup: torch ready in $VENV" >&2
