#!/usr/bin/env bash
# Downloads into DIR the wheels the GPU suite's diffusers anchors (scripts/bench_rollout_diffusers.py and
# scripts/bench_transformer_diffusers.py, part d of scripts/gpu/suite.sh) install on a GPU machine that has no
# network: diffusers 0.42.1 and what it imports that a machine with torch 2.11, transformers 5.x and peft may lack
# (requests and urllib3; huggingface_hub >= 1.32, newer than transformers 5.x needs; Pillow). All for CPython 3.12
# on x86-64 Linux (py3-none-any, or manylinux for Pillow), each pinned and checked against its sha256.
#
# Usage: scripts/setup-anchors.sh DIR   # the GPU bundle's wheels
#        scripts/setup-anchors.sh       # this machine: diffusers, transformers and peft for the project's
#                                       # torch venv, in $FLOWTUNE_CACHE/anchors (once; the tests run the
#                                       # suite's tiny mode with it on PYTHONPATH)
#
# On the GPU machine (suite.sh does this when `import diffusers` fails), install them without the network into a
# folder of their own and put it first on the path:
#   python3 -m pip install -q --no-index --no-deps --target SITE DIR/*.whl
#   export PYTHONPATH="SITE${PYTHONPATH:+:$PYTHONPATH}"
set -euo pipefail
if [[ $# -eq 0 ]]; then
  FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
  PY="${FLOWTUNE_VENV:-$FLOWTUNE_CACHE/venv}/bin/python"
  SITE="$FLOWTUNE_CACHE/anchors"
  if PYTHONPATH="$SITE" "$PY" -c 'import diffusers, transformers, peft' 2>/dev/null; then
    exit 0
  fi
  echo "setup-anchors: installing diffusers, transformers and peft into $SITE (first run only)" >&2
  rm -rf "$SITE"
  pip=("$PY" -m pip install -q --disable-pip-version-check --progress-bar off --target "$SITE")
  "${pip[@]}" diffusers==0.42.1 transformers==5.17.0 huggingface-hub==1.32.0 requests pillow
  # Their torch is the venv's: no second copy.
  "${pip[@]}" --no-deps peft==0.21.2 accelerate==1.15.0 psutil
  PYTHONPATH="$SITE" "$PY" -c 'import diffusers, transformers, peft'
  exit 0
fi
DIR="$1"
PYTHON="${PYTHON:-python3}"
# wheel, sha256
WHEELS=(
  "diffusers==0.42.1 9154faa704ce00e0b77f568e0d64786064368528aab5fc14eeea92f87d788014"
  "huggingface-hub==1.32.0 b0c7c80561969d9cdacdd55fce67ba9584cca0b9d4ea80957a3a5c1445fac5c8"
  "requests==2.34.2 2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0"
  "urllib3==2.8.0 0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3"
  "pillow==13.0.0 42d63be3af4f9b951b199b0a9d23365d37ab14687e6d77b74940432c8515c4ca"
)
mkdir -p "$DIR"
REQS="$(mktemp)"
trap 'rm -f "$REQS"' EXIT
for entry in "${WHEELS[@]}"; do
  read -r wheel sha <<<"$entry"
  echo "$wheel --hash=sha256:$sha" >>"$REQS"
done
"$PYTHON" -m pip download --no-deps --only-binary=:all: --require-hashes -r "$REQS" \
  --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
  --disable-pip-version-check --progress-bar off -q -d "$DIR"
echo "setup-anchors: $(ls "$DIR"/*.whl | wc -l) wheels in $DIR ($(du -sh "$DIR" | cut -f1))" >&2
