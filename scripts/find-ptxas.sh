#!/usr/bin/env bash
# Prints the path of a ptxas: $PTXAS, the pinned one scripts/setup.sh installs, the PATH, or the
# pip package nvidia-cuda-nvcc (any version; the build warns when it is not the pinned one).
set -euo pipefail
if [ -n "${PTXAS:-}" ] && [ -x "$PTXAS" ]; then echo "$PTXAS"; exit 0; fi
pinned=$(sed -n 's/^PTXAS_VERSION=//p' "$(dirname "$0")/setup.sh")
tools=${BLOCKSCALED_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled}
p="$tools/cuda-nvcc-$pinned/nvidia/cu13/bin/ptxas"
if [ -x "$p" ]; then echo "$p"; exit 0; fi
if command -v ptxas >/dev/null; then command -v ptxas; exit 0; fi
py=$(command -v python3 || command -v python) || exit 1
"$py" - <<'PY'
import importlib.util, os, sys
s = importlib.util.find_spec("nvidia")
for d in (s.submodule_search_locations if s else []):
    for sub in ("cu13/bin/ptxas", "cuda_nvcc/bin/ptxas", "cu12/bin/ptxas"):
        p = os.path.join(d, sub)
        if os.path.isfile(p):
            print(p); sys.exit(0)
sys.exit(1)
PY
