#!/usr/bin/env bash
# clef vs llama.cpp, side by side on this machine: the same GGUF files, the same thread count, one table.
#
#   bash bench/vs-llama.sh [--threads N] [--tokens N] [--cap avx2] [--work DIR]
#
# 1. builds llama.cpp's llama-bench from the source that the npm package node-llama-cpp ships
#    (package/llama/gitRelease.bundle, a git bundle), cached under WORK (default ~/.cache/clef-vs-llama);
#    --cap avx2 builds it without AVX-512 (-DGGML_NATIVE=OFF -DGGML_AVX2=ON) and runs clef under
#    CLEF_MAX_ISA=avx2, to measure the AVX2 class on a bigger CPU;
# 2. makes a 4-layer flash-shaped model (clef make-model) and converts it with `clef convert --arch qwen35` to
#    bf16, q8_0 and q4_k_m (cached too);
# 3. prints one table: llama-bench -p TOKENS -n 0 vs clef bench --tokens TOKENS (default precision, bf16 and
#    int8), tokens/s and the ratio. Not part of CI (it takes ~15 minutes the first time on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
threads=$(nproc) tokens=512 cap="" work="${HOME}/.cache/clef-vs-llama"
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --cap) cap=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "vs-llama: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -z "$cap" ] || [ "$cap" = avx2 ] || { echo "vs-llama: --cap takes avx2" >&2; exit 2; }
clef="$here/build/clef"
[ -x "$clef" ] || { echo "vs-llama: build clef first (cmake --build build)" >&2; exit 2; }
mkdir -p "$work"

# --- llama.cpp from the npm bundle
src="$work/llama.cpp"
if [ ! -d "$src" ]; then
  (cd "$work" && npm pack --silent node-llama-cpp@3.22.1 >/dev/null &&
    tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle &&
    git clone -q package/llama/gitRelease.bundle llama.cpp)
fi
bdir="$work/build-${cap:-native}"
if [ ! -x "$bdir/bin/llama-bench" ]; then
  flags=(-DGGML_NATIVE=ON)
  [ "$cap" = avx2 ] && flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON)
  echo "vs-llama: building llama-bench (${cap:-native}) in $bdir" >&2
  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" >/dev/null
  cmake --build "$bdir" -j"$(nproc)" --target llama-bench >/dev/null
fi

# --- the model and its GGUF files
model="$work/flash4"
[ -f "$model/config.json" ] || "$clef" make-model --preset flash-shaped --layers 4 --out "$model" >/dev/null
for t in bf16 q8_0 q4_k_m; do
  f="$work/flash4-$t.gguf"
  [ -f "$f" ] || { echo "vs-llama: converting to $t" >&2; "$clef" convert --model "$model" --out "$f" --type "$t" \
    --arch qwen35 >/dev/null; }
done

# --- one table
clef_env=()
[ "$cap" = avx2 ] && clef_env=(CLEF_MAX_ISA=avx2)
clef_tps() {  # FILE PRECISION -> tokens/s
  env "${clef_env[@]}" "$clef" bench --model "$1" --head "$model" --tokens "$tokens" --repeat 3 \
    --threads "$threads" --precision "$2" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["tokens_per_s"])'
}
llama_tps() {  # FILE -> tokens/s
  "$bdir/bin/llama-bench" -m "$1" -p "$tokens" -n 0 -t "$threads" -r 3 -o json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])'
}
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)
echo "CPU: $cpu; threads $threads; $tokens prompt tokens; llama.cpp ${cap:-native}, clef ${cap:+CLEF_MAX_ISA=$cap}"
env "${clef_env[@]}" "$clef" info --model "$model" | grep -E '^  (cpu|gemm) '
echo
printf '| file | llama-bench pp%s | clef exact | ratio | clef bf16 | ratio | clef int8 | ratio |\n' "$tokens"
printf '|---|---|---|---|---|---|---|---|\n'
for t in bf16 q8_0 q4_k_m; do
  f="$work/flash4-$t.gguf"
  l=$(llama_tps "$f") e=$(clef_tps "$f" exact) b=$(clef_tps "$f" bf16) i=$(clef_tps "$f" int8)
  printf '| %s | %s | %s | %.2f | %s | %.2f | %s | %.2f |\n' "$t" "$l" "$e" "$(echo "$e / $l" | bc -l)" "$b" \
    "$(echo "$b / $l" | bc -l)" "$i" "$(echo "$i / $l" | bc -l)"
done
