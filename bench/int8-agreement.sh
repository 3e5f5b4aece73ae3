#!/usr/bin/env bash
# How often int8 answers as exact does, on more questions than examples/eval holds (its 52 questions resolve
# agreement in steps of 1.9 %: one flipped near tie is 98.1 %).
#
#   bash bench/int8-agreement.sh --model FILE.gguf [--head DIR] [--states N] [--threads N] [--out DIR]
#
# Builds a set from examples/eval/decisions.jsonl: every line's questions asked about its own state and about
# the states of the N - 1 lines after it (default N = 5: 85 decisions, 260 questions; the pairs are the point,
# not the labels, so the set carries no expectations), then runs `clef eval --compare-precision int8` on it
# and prints the agreement (the share of questions whose most probable option is the same), the mean and
# largest |dp|, and the summary under OUT (default a temporary directory). Not part of CI: on the 4-layer
# flash-shaped model (bench/vs-llama.sh makes it) about 20 minutes on 2 cores, most of it the exact run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model="" head="" states=5 threads=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --head) head=$2; shift 2 ;;
    --states) states=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "int8-agreement: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "int8-agreement: --model is required" >&2; exit 2; }
clef="$here/build/clef"
[ -x "$clef" ] || { echo "int8-agreement: build clef first (cmake --build build)" >&2; exit 2; }
out=${out:-$(mktemp -d)}
mkdir -p "$out"

python3 - "$here/examples/eval/decisions.jsonl" "$states" > "$out/set.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
for i, line in enumerate(lines):
    for s in range(min(n, len(lines))):
        body = {k: v for k, v in line.items() if k != "expected"}
        body["state"] = lines[(i + s) % len(lines)]["state"]
        print(json.dumps(body, ensure_ascii=False))
EOF

args=(--model "$model" --data "$out/set.jsonl" --compare-precision int8 --threads "$threads")
[ -z "$head" ] || args+=(--head "$head")
"$clef" eval "${args[@]}" > "$out/summary.json"
python3 - "$out/summary.json" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))["compare"]["agreement"]
for kind in ["overall", "noul", "choice", "score"]:
    x = a[kind]
    print(f"{kind:8} {x['agreeing']}/{x['questions']} agree ({100 * x['agreement']:.1f} %), "
          f"mean |dp| {x['mean_abs_dp']:.2e}, max |dp| {x['max_abs_dp']:.2e}")
EOF
echo "summary: $out/summary.json"
