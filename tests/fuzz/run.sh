#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, CLEF_FUZZ=ON) and runs each for N seconds.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (default 30 s, all targets)
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_WORK_DIR (default $FUZZ_BUILD_DIR/fuzz-work: the growing
# corpora and crash artifacts; the seeds in tests/fuzz/corpus/<target> are read, never written),
# FUZZ_PARALLEL=1 runs the targets at the same time, FUZZ_NO_BUILD=1 skips the build.
# Exit status 1 when any target found a crash, a leak, a timeout or an out-of-memory input.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-30}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(request safetensors gguf tokenizer_json tokenizer)
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
WORK=${FUZZ_WORK_DIR:-$BUILD/fuzz-work}

if [ -z "${FUZZ_NO_BUILD:-}" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DCLEF_FUZZ=ON -DCLEF_BUILD_TESTS=OFF -DCLEF_BUILD_BENCH=OFF >/dev/null
  cmake --build "$BUILD" --target fuzz -j"$(nproc)"
fi

# Per-target input size limit (tokenizer.json seeds are several KiB).
max_len() { case "$1" in tokenizer_json) echo 16384 ;; safetensors|gguf) echo 8192 ;; *) echo 4096 ;; esac; }

run_one() {
  local t=$1
  mkdir -p "$WORK/$t/corpus" "$WORK/$t/artifacts"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
  export OMP_NUM_THREADS=1
  "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$WORK/$t/artifacts/" \
    "$WORK/$t/corpus" "tests/fuzz/corpus/$t" >"$WORK/$t/log.txt" 2>&1
}

status=0
declare -A pids
for t in "${TARGETS[@]}"; do
  if [ -n "${FUZZ_PARALLEL:-}" ]; then
    run_one "$t" & pids[$t]=$!
  else
    run_one "$t" || true
  fi
done
for t in "${!pids[@]}"; do wait "${pids[$t]}" || true; done

for t in "${TARGETS[@]}"; do
  log="$WORK/$t/log.txt"
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
  found=$(ls "$WORK/$t/artifacts" 2>/dev/null | wc -l)
  echo "fuzz_$t: ${execs:-?} executions, last: ${last:-none}, findings: $found"
  if [ "$found" -gt 0 ] || grep -qE '^==[0-9]+==ERROR|runtime error:|deadly signal' "$log"; then
    status=1
    echo "  findings in $WORK/$t/artifacts (log: $log):"
    grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5 | sed 's/^/    /'
  fi
done
exit $status
