#!/usr/bin/env bash
# The official-SDK end-to-end test against `clef serve` on a GGUF: the tiny-clef fixture converted to a qwen35
# (backbone-only) bf16 file, served with `--head` pointing at the fixture's joint head. bf16 reproduces the
# fixture's answers exactly, so sdk.test.cjs's checks apply unchanged.
# Usage: run_gguf_server.sh CLEF_BINARY MODEL_DIR NODE_MODULES_DIR
set -euo pipefail
clef=$1 model=$2 modules=$3
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$clef" convert --model "$model" --out "$out/tiny-qwen35.gguf" --type bf16 --arch qwen35 >/dev/null
CLEF_TEST_DATA_DIR="$(dirname "$model")" "$here/run_with_server.sh" "$clef" "$out/tiny-qwen35.gguf" "$modules" \
  sdk.test.cjs --head "$model"
