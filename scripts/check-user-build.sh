#!/usr/bin/env bash
# The path a new user takes, proven outside this workspace (so neither rust-toolchain.toml nor
# .cargo/config.toml applies): a throwaway `cargo new` project depends on blockscaled by path,
# its main.rs is host/examples/quickstart.rs, and it is built, documented and run with stable Rust
# whose PATH holds no rustup, no nightly and no ptxas. Without a GPU the program must print the
# NoDevice error and exit 1; with one it must succeed. host/examples/gemm_check.rs is built too, as
# a second binary. With BLOCKSCALED_USER_BUILD_OUT=DIR, both are also built in release and copied
# to DIR (to run them on a GPU machine).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rustup toolchain install stable --profile minimal --no-self-update >/dev/null 2>&1 \
  || rustup toolchain install stable --profile minimal >/dev/null
stable_bin=$(dirname "$(rustup which --toolchain stable cargo)")
demo=$(mktemp -d "${TMPDIR:-/tmp}/blockscaled-user.XXXXXX")
trap 'rm -rf "$demo"' EXIT
case "$demo" in "$repo"/*) echo "check-user-build.sh: $demo is inside the workspace" >&2; exit 1 ;; esac

# Only the stable toolchain's own binaries and the system's: the build cannot reach a nightly, a
# rustup proxy, llvm-tools or ptxas even if it tried.
clean_env=(env -i HOME="$HOME" PATH="$stable_bin:/usr/bin:/bin" CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
  CARGO_TARGET_DIR="$demo/target" TMPDIR="${TMPDIR:-/tmp}")
cd "$demo"
"${clean_env[@]}" cargo new --quiet --vcs none --bin demo
cd demo
printf 'blockscaled = { path = "%s/host" }\nrand = "0.9"\n' "$repo" >> Cargo.toml
cp "$repo/host/examples/quickstart.rs" src/main.rs
mkdir -p src/bin && cp "$repo/host/examples/gemm_check.rs" src/bin/gemm_check.rs
echo "user project: $PWD, $("${clean_env[@]}" cargo --version)"
start=$SECONDS
"${clean_env[@]}" cargo build --quiet
echo "cargo build (stable, shipped kernel images): $((SECONDS - start)) s"
if [ -n "${BLOCKSCALED_USER_BUILD_OUT:-}" ]; then
  "${clean_env[@]}" cargo build --quiet --release
  mkdir -p "$BLOCKSCALED_USER_BUILD_OUT"
  cp "$demo/target/release/demo" "$BLOCKSCALED_USER_BUILD_OUT/quickstart"
  cp "$demo/target/release/gemm_check" "$BLOCKSCALED_USER_BUILD_OUT/gemm_check"
fi
start=$SECONDS
"${clean_env[@]}" RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps -p blockscaled
test -f "$demo/target/doc/blockscaled/index.html"
echo "cargo doc -p blockscaled (stable): $((SECONDS - start)) s"
set +e
out=$("${clean_env[@]}" cargo run --quiet --bin demo 2>&1); rc=$?
set -e
echo "cargo run printed (exit $rc):"; echo "$out" | sed 's/^/    /'
if [ $rc -eq 0 ]; then exit 0; fi
if [ $rc -eq 1 ] && grep -q '^quickstart: no CUDA device: ' <<<"$out"; then exit 0; fi
echo "check-user-build.sh: the quickstart neither ran nor reported NoDevice" >&2
exit 1
