#!/usr/bin/env bash
# Stages the Python package for a GPU machine without Rust or network: its wheel (release, from
# the shipped kernel images), pytest's wheels and the package's tests, with run.sh and the peers'
# comparison (benches/peers: compare.py, its harness, the DeepGEMM helpers), in stage-python/
# (git-ignored; a few MB, carry it packed with xz). There:
#   bash stage-python/run.sh [pytest args]
# installs the wheels offline into a folder of their own (beside the machine's packages: torch)
# and runs python/tests (the GPU tests against torch, the CPU ones), and
#   bash stage-python/run.sh --compare [compare.py args]
# times the package beside torch (and DeepGEMM, where it imports) in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
out=stage-python
rm -rf "$out" && mkdir -p "$out/wheels" "$out/tests"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore maturin
BLOCKSCALED_BUILD_KERNELS=0 python3 -m maturin build --release -q -m python/Cargo.toml -o "$out/wheels"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$out/wheels" pytest
cp python/tests/*.py "$out/tests/"
mkdir -p "$out/peers" && cp benches/peers/compare.py benches/peers/harness.py benches/peers/deepgemm_bench.py "$out/peers/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --find-links wheels --target pkgs blockscaled pytest
if [ "${1:-}" = --compare ]; then
  shift
  cd peers && PYTHONPATH="$PWD/../pkgs:${PYTHONPATH:-}" exec python3 compare.py "$@"
fi
cd tests && PYTHONPATH="$PWD/../pkgs" python3 -m pytest -q -p no:cacheprovider -rs "$@" .
RUN
chmod +x "$out/run.sh"
du -sh "$out"; ls "$out/wheels"
