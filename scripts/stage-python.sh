#!/usr/bin/env bash
# Stages the Python package for a GPU machine without Rust or network: its wheel (release, from
# the shipped kernel images), pytest's wheels and the package's tests, with run.sh, in
# stage-python/ (git-ignored; a few MB, carry it packed with xz). There:
#   bash stage-python/run.sh [pytest args]
# installs the wheels offline into a folder of their own (beside the machine's packages: torch)
# and runs python/tests (the GPU tests against torch, the CPU ones).
set -euo pipefail
cd "$(dirname "$0")/.."
out=stage-python
rm -rf "$out" && mkdir -p "$out/wheels" "$out/tests"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore maturin
BLOCKSCALED_BUILD_KERNELS=0 python3 -m maturin build --release -q -m python/Cargo.toml -o "$out/wheels"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$out/wheels" pytest
cp python/tests/*.py "$out/tests/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --find-links wheels --target pkgs blockscaled pytest
cd tests && PYTHONPATH="$PWD/../pkgs" python3 -m pytest -q -p no:cacheprovider -rs "$@" .
RUN
chmod +x "$out/run.sh"
du -sh "$out"; ls "$out/wheels"
