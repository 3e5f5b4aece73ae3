#!/usr/bin/env bash
# Runs a float64 oracle check under both of numpy's SIMD paths. numpy dispatches its vectorised math (power, exp,
# log, sin, cos) to AVX-512 code where the CPU has it; that code is accurate to a few ulp but not bit-identical to
# the AVX2 / scalar code, so every check must hold on both. The command runs as given (numpy's native dispatch),
# then, where numpy finds AVX-512 features on this CPU, once more with them disabled (NPY_DISABLE_CPU_FEATURES).
# Where numpy finds none, the second run is skipped and the output says so.
# Usage: numpy_paths.sh COMMAND [ARG...]     (COMMAND is run with /usr/bin/python3 on PATH's side unchanged)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: numpy_paths.sh COMMAND [ARG...]" >&2; exit 2; }
# The AVX-512 features numpy dispatches to and finds on this CPU, space-separated (empty when none).
avx512=$(/usr/bin/python3 -c '
from numpy.core._multiarray_umath import __cpu_dispatch__ as d, __cpu_features__ as f
print(" ".join(k for k in d if k.startswith("AVX512") and f.get(k)))')
echo "numpy_paths: native dispatch${avx512:+ (AVX-512: $avx512)}"
"$@"
if [ -z "$avx512" ]; then
  echo "numpy_paths: numpy finds no AVX-512 on this CPU; the run without its AVX-512 paths is skipped (the native run is that path)"
  exit 0
fi
echo "numpy_paths: again with NPY_DISABLE_CPU_FEATURES=\"$avx512\""
NPY_DISABLE_CPU_FEATURES="$avx512" "$@"
