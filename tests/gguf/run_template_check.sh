#!/usr/bin/env bash
# Converts the tiny-clef fixture to a clef GGUF with `clef convert` and checks its systemone chat template with
# Jinja2 against the fixture's prompt segments (check_systemone_template.py).
# Usage: run_template_check.sh CLEF_BINARY MODEL_DIR
set -euo pipefail
clef=$1 model=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$clef" convert --model "$model" --out "$out/tiny.gguf" --type bf16 >/dev/null
python3 "$here/check_systemone_template.py" "$out/tiny.gguf" "$model/cases.json"
