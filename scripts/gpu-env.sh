# Sourced by the scripts that run on the GPU machine (from the repository root): the CUDA
# libraries and headers, the kernel cache, and $out (the device tool's $OUT, else /tmp).
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export METRALE_CUDA_INCLUDE="${METRALE_CUDA_INCLUDE:-/usr/local/cuda/include}"
export METRALE_KERNEL_CACHE="${TMPDIR:-/tmp}/metrale-kernels"
out="${OUT:-/tmp}"
