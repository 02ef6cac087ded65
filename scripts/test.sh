#!/usr/bin/env bash
# The project's test command: installs the independent Python references the interop tests call
# (gguf-py 0.19.0, libgguf 0.2.2) and NVRTC, then runs every test. Works on a fresh machine with cargo and
# python3; the real checkpoints are fetched by the tests into ~/.cache/metrale-pack.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python references go into a virtual environment under the cache (not the system's
# python), unless METRALE_PYTHON names an interpreter; where `python3 -m venv` cannot make one
# with pip, into python3 as before.
py="${METRALE_PYTHON:-}"
if [ -z "$py" ]; then
  venv="${METRALE_CACHE:-$HOME/.cache/metrale-pack}/venv"
  if ! "$venv/bin/python" -m pip --version > /dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv" > /dev/null 2>&1 || true
  fi
  if "$venv/bin/python" -m pip --version > /dev/null 2>&1; then
    py="$venv/bin/python"
  else
    rm -rf "$venv"
    echo "test.sh: python3 -m venv made no environment with pip; installing into python3" >&2
    py=python3
  fi
fi
export METRALE_PYTHON="$py"
"$py" -m pip install -q --disable-pip-version-check gguf==0.19.0 libgguf==0.2.2 numpy
# NVRTC and the CUDA headers (no GPU needed): every kernel is compiled for sm_90 by the tests.
cuda="${METRALE_CACHE:-$HOME/.cache/metrale-pack}/cuda13"
if [ ! -f "$cuda/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  "$py" -m pip install -q --disable-pip-version-check --target "$cuda" nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88
fi
export LD_LIBRARY_PATH="$cuda/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export METRALE_CUDA_INCLUDE="$cuda/nvidia/cu13/include" METRALE_REQUIRE_NVRTC=1
# The largest single process's peak RSS (a compiler or a test binary), reported at the end.
"$py" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"test.sh: peak RSS of the largest process of the test run: {peak:.0f} MB", file=sys.stderr)
sys.exit(rc)' cargo test --release --lib --bins --tests
# The library an engine links: without the harness feature (check, testing, fuzzing).
cargo check --release --lib --no-default-features
# The engine example: one call loads a pack on the host backend, checked against float64.
cargo run --release --example engine
# The README's Rust block, compiled (a doctest of README.md through src/lib.rs).
cargo test --release --doc
# The Python package (python/): an abi3 wheel built by maturin (sharing this build's target
# folder), installed into the environment above, and its tests against the CLI.
"$py" -m pip install -q --disable-pip-version-check "maturin>=1.8,<2" pytest
wheels="$(mktemp -d)"
(cd python && CARGO_TARGET_DIR="$PWD/../target" "$py" -m maturin build --release -q -i "$py" -o "$wheels")
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/metrale_pack-*.whl
rm -rf "$wheels"
# The C ABI (capi/): libmetrale_pack_c, which python/tests/test_capi.py drives from a C program.
(cd capi && CARGO_TARGET_DIR="$PWD/../target" cargo build --release -q)
METRALE_BIN="$PWD/target/release/metrale-pack" METRALE_CAPI_LIB="$PWD/target/release" \
  "$py" -m pytest -q -p no:cacheprovider python/tests
