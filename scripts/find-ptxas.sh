#!/usr/bin/env bash
# Prints the path of a ptxas: $PTXAS, the PATH, or the pip package nvidia-cuda-nvcc.
set -euo pipefail
if [ -n "${PTXAS:-}" ] && [ -x "$PTXAS" ]; then echo "$PTXAS"; exit 0; fi
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
