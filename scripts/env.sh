# Source this file (`source scripts/env.sh`) to build or run flowtune by hand.
# It points cargo's tch build at the project's torch venv and lets the dynamic loader find libtorch
# and the CUDA libraries that come with the wheel.
#   FLOWTUNE_CACHE  where the venv lives (default: $HOME/.cache/flowtune)
#   FLOWTUNE_VENV   a venv that already has torch==2.11.0 (default: $FLOWTUNE_CACHE/venv)
export FLOWTUNE_CACHE="${FLOWTUNE_CACHE:-${HOME:-$PWD}/.cache/flowtune}"
export FLOWTUNE_VENV="${FLOWTUNE_VENV:-$FLOWTUNE_CACHE/venv}"
if ! _ft_site=$("$FLOWTUNE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null); then
  echo "flowtune: no working venv at $FLOWTUNE_VENV; run 'make setup' (or set FLOWTUNE_VENV)" >&2
  return 1 2>/dev/null || exit 1
fi
export VIRTUAL_ENV="$FLOWTUNE_VENV"
case ":$PATH:" in *":$FLOWTUNE_VENV/bin:"*) ;; *) export PATH="$FLOWTUNE_VENV/bin:$PATH" ;; esac
export LIBTORCH_USE_PYTORCH=1
_ft_libs="$_ft_site/torch/lib"
for _ft_d in "$_ft_site"/nvidia/*/lib; do
  if [ -d "$_ft_d" ]; then _ft_libs="$_ft_libs:$_ft_d"; fi
done
export LD_LIBRARY_PATH="$_ft_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _ft_site _ft_libs _ft_d
