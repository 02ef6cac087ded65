#!/usr/bin/env bash
# On the two-GPU machine (device kind nvidia-h200-x2): the tensor-parallel issue's checks.
# STEP=check: `tp-check` at TP = 2 (rank r on GPU r, NCCL all-reduce) of a generated
#   llama-8B-shaped FFN layer (SiLU, BF16, every layout but lora) and a GELU layer, every arm at
#   m = 1..1024, against the float64 FFN and the one-GPU pack, with per-call times.
# STEP=fixed: the fixed arms' batch invariance on every rank.
# STEP=lora: the same layer with a PEFT adapter (the arm "nvfp4 + lora").
# STEP=load: a generated 16.06 GB llama-8B-shaped whole model converted with --layouts bf16 at
#   --tp 1 and --tp 2, then `bench-load-tp` (both ranks loading at once, each its own bytes).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
# NVLink multicast stays off on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# libnccl from the preinstalled Python package; cudarc looks for libnccl.so.
nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)"
mkdir -p /tmp/nccl-lib
[ -n "$nccl" ] && ln -sf "$nccl/libnccl.so.2" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH="/tmp/nccl-lib:${nccl}:$LD_LIBRARY_PATH"
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-tp"
mkdir -p "$w"
rc=0
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
case "${STEP:-check}" in
check)
  {
    $bin gen-model "$w/llama.gguf" 4096 14336 1 BF16 llama || rc=1
    $bin tp-check "$w/llama.gguf" --tp 2 --layouts nvfp4,nvfp4_t,nvfp4_mmq,q4k_mmq,fp8,w8a8,bf16,q2g128 \
      --ms 1,2,3,4,8,16,64,512,1024 --iters 20 --dir "$w/llama" || rc=1
    $bin gen-model "$w/gemma.gguf" 2048 8192 1 BF16 gemma || rc=1
    $bin tp-check "$w/gemma.gguf" --tp 2 --layouts nvfp4,nvfp4_t,q4k_mmq,fp8,bf16,q2g128 \
      --ms 1,2,3,8,64,512 --iters 10 --dir "$w/gemma" || rc=1
  } > "$out/tp-check.txt" 2> "$out/tp-check.err"
  grep -v "^$" "$out/tp-check.txt" | tail -100; tail -5 "$out/tp-check.err"
  ;;
fixed)
  # The fixed (batch-invariant) arms alone at TP = 2: tp-check also compares, on every rank,
  # each row alone with the same row inside a batch of 8, bit for bit.
  {
    $bin gen-model "$w/llama.gguf" 4096 14336 1 BF16 llama || rc=1
    $bin tp-check "$w/llama.gguf" --tp 2 --layouts nvfp4,w8a8 --ms 1,8 --iters 0 --dir "$w/fixed" || rc=1
  } > "$out/tp-fixed.txt" 2> "$out/tp-fixed.err"
  grep -E "^rank|^tp-check" "$out/tp-fixed.txt"; tail -3 "$out/tp-fixed.err"
  ;;
lora)
  # The NVFP4 arms with a PEFT adapter (rank 16 on gate, up and down, written here by numpy and
  # safetensors) at TP = 2.
  {
    $bin gen-model "$w/llama.gguf" 4096 14336 1 BF16 llama || rc=1
    python3 - "$w/adapter" <<'PY'
import json, os, sys
import numpy as np
from safetensors.numpy import save_file
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(3)
r, h, i = 16, 4096, 14336
t = {}
for p, n, k in (("gate", i, h), ("up", i, h), ("down", h, i)):
    pre = f"base_model.model.model.layers.0.mlp.{p}_proj"
    t[f"{pre}.lora_A.weight"] = (rng.standard_normal((r, k)) / np.sqrt(k)).astype(np.float32)
    t[f"{pre}.lora_B.weight"] = (rng.standard_normal((n, r)) * 0.01).astype(np.float32)
save_file(t, os.path.join(d, "adapter_model.safetensors"))
json.dump({"r": r, "lora_alpha": 32, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
          open(os.path.join(d, "adapter_config.json"), "w"))
PY
    $bin tp-check "$w/llama.gguf" --tp 2 --layouts nvfp4,nvfp4_mmq,lora --lora "$w/adapter" \
      --ms 1,2,3,8,16,64,512 --iters 10 --dir "$w/lora" || rc=1
  } > "$out/tp-lora.txt" 2> "$out/tp-lora.err"
  cat "$out/tp-lora.txt"; tail -5 "$out/tp-lora.err"
  ;;
load)
  {
    # A warm machine keeps the packs of the last call.
    if [ ! -f "$w/tp2.mpk.gguf" ]; then
    t=$(date +%s)
    $bin gen-model "$w/src.gguf" 4096 14336 32 BF16 llama --whole --vocab 128256 --kv-dim 1024 || rc=1
    echo "gen-model: $(( $(date +%s) - t )) s"
    for tp in 1 2; do
      t=$(date +%s)
      $bin convert "$w/src.gguf" -o "$w/tp$tp.mpk.gguf" --layouts bf16 --tp $tp > /dev/null || rc=1
      echo "convert --tp $tp: $(( $(date +%s) - t )) s, $(stat -c %s "$w/tp$tp.mpk.gguf") bytes"
    done
    rm -f "$w/src.gguf"
    fi
    $bin inspect "$w/tp2.mpk.gguf" | grep -E "tensor-parallel|device segment"
    $bin bench-load-tp "$w/tp2.mpk.gguf" "$w/tp1.mpk.gguf" --modes "${MODES:-auto,hybrid:0.3,hybrid:0.5,hybrid:0.7,register}" || rc=1
  } > "$out/tp-load.txt" 2> "$out/tp-load.err"
  cat "$out/tp-load.txt"; tail -5 "$out/tp-load.err"
  ;;
esac
exit $rc
