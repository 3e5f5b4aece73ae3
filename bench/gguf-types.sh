#!/usr/bin/env bash
# One row per GGUF file: file size, bits per weight, load time, prefill tokens/s and the largest probability
# difference against the reference model (the publisher-layout directory, BF16 weights) on the examples'
# requests -- the table of docs/GGUF.md. Not part of CI.
#
#   bash bench/gguf-types.sh --ref DIR [--head DIR] [--tokens N] FILE.gguf...
#
# --head: the joint head for backbone-only (qwen35) files (default: --ref). Each file is benched with
# `clef bench --tokens N --repeat 2` (default 1024 tokens) and decides every examples/*.json with `clef decide`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
clef="$here/build/clef"
ref="" head="" tokens=1024 files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ref) ref=$2; shift 2 ;;
    --head) head=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    -*) echo "gguf-types: unknown option $1" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
[ -n "$ref" ] && [ ${#files[@]} -gt 0 ] || { echo "usage: gguf-types.sh --ref DIR [--head DIR] FILE.gguf..." >&2; exit 2; }
head=${head:-$ref}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for req in "$here"/examples/*.json; do
  "$clef" decide --model "$ref" "$req" > "$work/ref-$(basename "$req")" 2>/dev/null
done

echo "| file | file type | size (bytes) | bits/weight | load (s) | tokens/s ($tokens) | max abs dp vs BF16 |"
echo "|---|---|---:|---:|---:|---:|---:|"
for f in "${files[@]}"; do
  "$clef" info --model "$f" --json > "$work/info.json"
  "$clef" bench --model "$f" --head "$head" --tokens "$tokens" --repeat 2 2>/dev/null | tail -1 > "$work/bench.json"
  for req in "$here"/examples/*.json; do
    "$clef" decide --model "$f" --head "$head" "$req" > "$work/got-$(basename "$req")" 2>/dev/null
  done
  python3 - "$f" "$work" <<'EOF'
import glob, json, os, sys
path, work = sys.argv[1], sys.argv[2]
info = json.load(open(f"{work}/info.json"))
bench = json.load(open(f"{work}/bench.json"))
dt = info["dtypes"]
params = sum(v["params"] for v in dt.values())
nbytes = sum(v["bytes"] for v in dt.values())
def probs(answers):
    out = {}
    for q, a in answers.items():
        if a["type"] == "noul":
            out[(q, "yes")] = a["noul"]
        else:
            for o, p in a["probabilities"].items():
                out[(q, o)] = p
    return out
worst = 0.0
for ref in glob.glob(f"{work}/ref-*.json"):
    got = ref.replace("/ref-", "/got-")
    a, b = probs(json.load(open(ref))["answers"]), probs(json.load(open(got))["answers"])
    worst = max([worst] + [abs(a[k] - b[k]) for k in a])
ftype = info.get("gguf", {}).get("file_type_name", "?")
print(f"| {os.path.basename(path)} | {ftype} | {os.path.getsize(path):,} | {8 * nbytes / params:.2f} | "
      f"{bench['load_seconds']:.1f} | {bench['tokens_per_s']:.1f} | {worst:.4f} |")
EOF
done
