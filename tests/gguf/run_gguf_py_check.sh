#!/usr/bin/env bash
# GGUF interop with llama.cpp's own reader and dequantisers (gguf-py, numpy; tests/gguf/check_gguf_py.py):
#   1. tests/data/gguf/ggml-blocks.gguf (every block type, written by llama.cpp's quantisers:
#      tests/gguf/make_ggml_blocks.c) -> `clef convert --type f32` equals gguf-py's dequantisation bit for bit;
#   2. that file requantised by clef, and the tiny fixture converted by clef, to every file type clef writes
#      (with an importance matrix from check_gguf_py.py, which the IQ2 types need): gguf-py reads each file,
#      and its f32 upcast (GGUF -> GGUF) equals gguf-py's dequantisation bit for bit;
#   3. the same for the fixture's vision tower written as a q8_0 mmproj (`clef convert --mmproj`).
# gguf-py comes from the llama.cpp source in the npm package node-llama-cpp (pinned), fetched once per build tree;
# numpy is Debian's python3-numpy (scripts/setup).
# Usage: run_gguf_py_check.sh CLEF_BINARY MODEL_DIR DATA_DIR WORK_DIR
set -euo pipefail
clef=$1 model=$2 data=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
# Every gguf-py call runs under both of numpy's SIMD paths where the CPU has AVX-512 (tests/oracle/numpy_paths.sh):
# its dequantisation must equal clef's bit for bit on each.
py="$here/../oracle/numpy_paths.sh /usr/bin/python3"
if [ ! -f "$work/gguf-py/gguf/__init__.py" ]; then
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && npm pack --silent node-llama-cpp@3.22.1 >/dev/null &&
    tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle &&
    git clone -q --no-checkout package/llama/gitRelease.bundle llama.cpp &&
    git -C llama.cpp checkout -q HEAD -- gguf-py && mv llama.cpp/gguf-py gguf-py &&
    rm -rf llama.cpp package node-llama-cpp-3.22.1.tgz)
fi
export PYTHONPATH="$work/gguf-py"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$clef" convert --model "$data/ggml-blocks.gguf" --out "$out/blocks-f32.gguf" --type f32 >/dev/null
$py "$here/check_gguf_py.py" dequant "$data/ggml-blocks.gguf" "$out/blocks-f32.gguf"

"$clef" convert --model "$model" --out "$out/tiny-bf16-src.gguf" --type bf16 >/dev/null
$py "$here/check_gguf_py.py" imatrix "$data/ggml-blocks.gguf" "$out/blocks.imatrix"
$py "$here/check_gguf_py.py" imatrix "$out/tiny-bf16-src.gguf" "$out/tiny.imatrix"
for type in f16 bf16 q8_0 q6_k q5_k_m q4_k_m q4_0 iq4_xs iq4_nl q3_k_m q2_k \
    iq3_m iq3_s iq3_xs iq3_xxs iq2_m iq2_s iq2_xs iq2_xxs; do
  # the blocks file requantised by clef (its 512-wide rows take the K and IQ types the tiny model's rows cannot)
  "$clef" convert --model "$data/ggml-blocks.gguf" --out "$out/blocks-$type.gguf" --type "$type" \
    --imatrix "$out/blocks.imatrix" >/dev/null
  "$clef" convert --model "$out/blocks-$type.gguf" --out "$out/blocks-$type-f32.gguf" --type f32 >/dev/null
  $py "$here/check_gguf_py.py" dequant "$out/blocks-$type.gguf" "$out/blocks-$type-f32.gguf"
  "$clef" convert --model "$model" --out "$out/tiny-$type.gguf" --type "$type" --imatrix "$out/tiny.imatrix" >/dev/null
  "$clef" convert --model "$out/tiny-$type.gguf" --out "$out/tiny-$type-f32.gguf" --type f32 >/dev/null
  $py "$here/check_gguf_py.py" dequant "$out/tiny-$type.gguf" "$out/tiny-$type-f32.gguf"
done
# the fixture's vision tower as llama.cpp's mmproj (clef convert --mmproj: q8_0, f16 fallback and f32 tensors)
"$clef" convert --model "$model" --mmproj "$out/mmproj-q8_0.gguf" --type q8_0 >/dev/null
"$clef" convert --model "$out/mmproj-q8_0.gguf" --out "$out/mmproj-f32.gguf" --type f32 >/dev/null
$py "$here/check_gguf_py.py" dequant "$out/mmproj-q8_0.gguf" "$out/mmproj-f32.gguf"
