#!/usr/bin/env bash
# On the GPU machine, one call for the block-format engine (issue 56): llama.cpp's ggml peer
# built in the background (../shared/tools/ggml-peer.sh, copied with its prepared sources into
# .gpu-bin/ by the caller), meanwhile gpu-check's engine rows and layer arms (and a converted
# source with --load-source for each path GGML_SOURCE names, space-separated), then the peer on
# both llama-8B shapes, then bench-gpu's decode kernels and engine arms. Logs to $OUT. Within
# the 600 s a call may take: SKIP_GPU_CHECK=1 for the timing call (peer build ~240 s, peer
# ~60 s, bench ~250 s), and a second call for gpu-check.
#   here: bash scripts/gpu-prep-ggml.sh (the binary, the peer's sources, two GGUF sources)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
peer=.gpu-bin/ggml-peer.sh
types='bf16|q4_0|q4_1|q5_0|q5_1|q8_0|q2_K|q3_K|q4_K|q5_K|q6_K|iq1_s|iq1_m|iq2_xxs|iq2_xs|iq2_s|iq3_xxs|iq3_s|iq4_nl|iq4_xs|mxfp4|nvfp4'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
rc=0
# The caller may pack the peer sources and the sources to convert into one archive (the carry limit).
[ -f .gpu-bin/peer.tar.xz ] && tar xJf .gpu-bin/peer.tar.xz -C .gpu-bin
# The peer's build (../shared/tools/ggml-peer.sh builds into /tmp/ggml-peer-build, about 4
# minutes) is kept in target/ (git-ignored, not carried: kept between calls while the machine
# stays warm) and put back before the next call's build, which then has nothing to do.
cache=target/ggml-peer-build
[ -d "$cache" ] && [ ! -d /tmp/ggml-peer-build ] && cp -a "$cache" /tmp/ggml-peer-build
if [ -z "${SKIP_PEER:-}" ]; then
  # Build only (a type that matches nothing times nothing).
  (bash "$peer" run .gpu-bin/ggml-peer 'none' '1' > "$out/peer-build.txt" 2>&1) &
  build=$!
fi
if [ -z "${SKIP_GPU_CHECK:-}" ]; then
  src=()
  for s in ${GGML_SOURCE:-}; do src+=(--load-source "$s"); done
  timeout "${CHECK_TIMEOUT:-300}" "$bin" gpu-check ${GPU_CHECK_ARGS:---arms ggml} "${src[@]}" \
    > "$out/gpu-check.txt" 2> "$out/gpu-check.err" || rc=1
  grep -c " PASS$" "$out/gpu-check.txt"; grep -v " PASS$" "$out/gpu-check.txt" | tail -30; tail -3 "$out/gpu-check.err"
fi
[ -n "${build:-}" ] && wait "$build"
# The peer first (the baseline every goal is against), then our kernels.
if [ -z "${SKIP_PEER:-}" ]; then
  tail -3 "$out/peer-build.txt"
  [ -d /tmp/ggml-peer-build ] && [ ! -d "$cache" ] && mkdir -p target && cp -a /tmp/ggml-peer-build "$cache"
  # n = 512 for every type took minutes on an H100 (session 32) and prints nothing until done:
  # PEER_NS adds it back.
  bash "$peer" run .gpu-bin/ggml-peer "$types" "${PEER_NS:-1|2|4|8}" | sed -u 's/^ggml /peer down /' | tee "$out/peer.txt"
  tb=$(find /tmp/ggml-peer-build -name test-backend-ops -type f -perm -u+x | head -1)
  "$tb" perf -o MUL_MAT -b CUDA0 -p "type_a=($types),type_b=f32,m=14336,n=(1|2|4|8),k=4096,bs=\[1,1\],nr=\[1,1\]" 2>&1 |
    grep --line-buffered "MUL_MAT(" | sed -u -E 's/.*type_a=([a-zA-Z0-9_]+),type_b=f32,m=14336,n=([0-9]+),.* - +([0-9.]+) us\/run.*/peer gate \1 n=\2 \3 us/' |
    tee -a "$out/peer.txt"
fi
if [ -z "${SKIP_BENCH_GPU:-}" ]; then
  METRALE_BENCH_ARMS="${BENCH_ARMS:-decode kernel,ggml,bf16 GEMV}" timeout "${BENCH_TIMEOUT:-280}" "$bin" bench-gpu \
    > "$out/bench-gpu.txt" 2> "$out/bench-gpu.err" || rc=1
  grep -E "^ggml|copy ceiling \(|ggml " "$out/bench-gpu.txt" | head -150; tail -3 "$out/bench-gpu.err"
fi
exit $rc
