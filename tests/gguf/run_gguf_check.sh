#!/usr/bin/env bash
# Converts the tiny-clef fixture to every GGUF file type (and the qwen35 backbone-only layout) with `clef convert`,
# then checks each file with @huggingface/gguf (pinned, installed from the npm registry by name once per build tree).
# Usage: run_gguf_check.sh CLEF_BINARY MODEL_DIR WORK_DIR
set -euo pipefail
clef=$1 model=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$work/node_modules/@huggingface/gguf/package.json" ]; then
  mkdir -p "$work"
  npm install --silent --no-audit --no-fund --no-save --prefix "$work" @huggingface/gguf@0.4.6 >/dev/null
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for type in f16 bf16 q8_0 q4_k_m q5_k_m q6_k; do
  "$clef" convert --model "$model" --out "$out/tiny-$type.gguf" --type "$type" >/dev/null
  NODE_PATH="$work/node_modules" node "$here/check_gguf.cjs" "$out/tiny-$type.gguf" "$type" clef
done
"$clef" convert --model "$model" --out "$out/tiny-qwen35.gguf" --type q8_0 --arch qwen35 >/dev/null
NODE_PATH="$work/node_modules" node "$here/check_gguf.cjs" "$out/tiny-qwen35.gguf" q8_0 qwen35
