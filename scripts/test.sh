#!/usr/bin/env bash
# The project's test command: installs the independent Python references the interop tests call
# (gguf-py 0.19.0, libgguf 0.2.2), then runs every test. Works on a fresh machine with cargo and
# python3; the real checkpoints are fetched by the tests into ~/.cache/metrale-pack.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${METRALE_PYTHON:-python3}"
"$py" -m pip install -q --disable-pip-version-check gguf==0.19.0 libgguf==0.2.2 numpy
cargo test --release --lib --bins --tests
