#!/usr/bin/env bash
# Takes the checkout's largest tracked folders (fixtures/, examples/shapes/: about 67 MB) out of the
# work tree, so that the checkout and gpu-bundle/ fit the device tool's 64 MiB. Refuses when they
# hold uncommitted changes; `git checkout -- fixtures examples/shapes` restores them from git.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "$(git status --porcelain -- fixtures examples/shapes)" ]]; then
    echo "slim: fixtures/ or examples/shapes/ has uncommitted changes; commit them first" >&2
    exit 1
fi
rm -rf fixtures examples/shapes
echo "slim: removed fixtures/ and examples/shapes/ from the work tree; restore with: git checkout -- fixtures examples/shapes"
