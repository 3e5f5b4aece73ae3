#!/usr/bin/env bash
# clef vs llama.cpp's Vulkan backend on the same Vulkan device and the same qwen35 GGUF files, one table
# (docs/GPU.md "Side by side with llama.cpp's Vulkan backend"):
#
#   bash bench/vs-llama-vulkan.sh [--tokens N] [--warmup 0|1] [--repeat N] [--layers N] [--types "q4_k_m bf16"]
#                                 [--icd FILE] [--work DIR] [--setup-only]
#
# 1. The device: lavapipe (Mesa's Vulkan driver on the CPU). Debian 12's reports a 2 GiB heap, too small for the
#    4-layer flash-shaped model; bookworm-backports' mesa-vulkan-drivers (25.0.7) reports the machine's memory.
#    Its .deb is fetched with apt-get through a private apt configuration under WORK (the machine's own
#    sources, lists and packages untouched), unpacked there with dpkg -x, and WORK/lvp_icd.json names its
#    libvulkan_lvp.so by absolute path; both engines run with VK_ICD_FILENAMES and VK_DRIVER_FILES set to that
#    file alone, so each sees that one device. --icd FILE runs them on another ICD's device instead.
# 2. llama.cpp: the prebuilt libraries of the npm package @node-llama-cpp/linux-x64-vulkan 3.22.1
#    (libggml-vulkan.so, built with cooperative-matrix shaders; libllama; ggml's backends loaded at run time
#    from the executable's directory), and llama-bench compiled from the same version's source
#    (node-llama-cpp@3.22.1, package/llama/gitRelease.bundle, as bench/vs-llama.sh takes it) and linked against
#    those libraries, into their directory. GGML_VK_VISIBLE_DEVICES=0: ggml skips CPU-type devices otherwise.
# 3. The model: `clef make-model --preset flash-shaped --layers N` (default 4), converted with
#    `clef convert --arch qwen35` to each type (default q4_k_m and bf16).
# 4. The table: llama-bench -p TOKENS -n 0 -ngl 99 -r REPEAT (after one warmup run; --no-warmup with
#    --warmup 0) vs `clef bench --device vulkan:N --tokens TOKENS --warmup WARMUP --repeat REPEAT` (backbone and
#    joint head), tok/s and the ratio. A flash4 run takes minutes on lavapipe (the pipelines' compilation, which
#    a warmup run leaves out, is seconds of it): --warmup 0 halves the time. Run it under the exclusive CPU lock
#    (flock -x /tmp/clef-cpu.lock) where others share the machine, one type at a time (--types). Not part of CI.
# Everything is cached under WORK (default ~/.cache/clef-vs-llama-vulkan); --setup-only stops before the table
# (steps 1-3 need no exclusive lock).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tokens=512 warmup=1 repeat=1 layers=4 types="q4_k_m bf16" icd="" work="${HOME}/.cache/clef-vs-llama-vulkan" setup_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --icd) icd=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --setup-only) setup_only=1; shift ;;
    *) echo "vs-llama-vulkan: unknown option $1" >&2; exit 2 ;;
  esac
done
clef="$here/build/clef"
[ -x "$clef" ] || { echo "vs-llama-vulkan: build clef first (cmake --build build)" >&2; exit 2; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
log() { echo "vs-llama-vulkan: $*" >&2; }

# --- the device: backports' lavapipe beside the system's
mesa_lavapipe() {
  local apt=$work/apt codename mirror
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  # The mirror the machine's own sources use for the release.
  mirror=$(apt-cache policy | awk -v s="$codename/main" '$3 == s {print $2; exit}')
  [ -n "$mirror" ] || { log "no $codename/main among the apt sources"; exit 2; }
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$work/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename-backports main" \
    >"$apt/sources.list"
  local o=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Sandbox::User=$(id -un)")
  log "fetching mesa-vulkan-drivers from $codename-backports"
  apt-get -qq "${o[@]}" update
  (cd "$work/deb" && apt-get -qq "${o[@]}" download "mesa-vulkan-drivers/$codename-backports")
  rm -rf "$work/mesa" && dpkg -x "$work"/deb/mesa-vulkan-drivers_*.deb "$work/mesa"
  local lib json
  lib=$(find "$work/mesa" -name libvulkan_lvp.so | head -n1)
  json=$(find "$work/mesa" -name 'lvp_icd*.json' | head -n1)
  [ -n "$lib" ] && [ -n "$json" ] || { log "no lavapipe in the package"; exit 2; }
  sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$lib\"#" "$json" >"$work/lvp_icd.json"
}
if [ -z "$icd" ]; then
  icd=$work/lvp_icd.json
  [ -f "$icd" ] || mesa_lavapipe
fi
export VK_ICD_FILENAMES=$icd VK_DRIVER_FILES=$icd

# --- llama.cpp: the npm package's Vulkan libraries and llama-bench built against them
bins=$work/vk/package/bins/linux-x64-vulkan
if [ ! -x "$bins/llama-bench" ]; then
  (cd "$work" && rm -rf vk package llama.cpp &&
    npm pack --silent @node-llama-cpp/linux-x64-vulkan@3.22.1 node-llama-cpp@3.22.1 >/dev/null &&
    mkdir vk && tar -C vk -xzf node-llama-cpp-linux-x64-vulkan-3.22.1.tgz &&
    tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle &&
    git clone -q package/llama/gitRelease.bundle llama.cpp)
  log "building llama-bench against the package's libraries"
  s=$work/llama.cpp
  # The package's libraries carry their own names (libllama.vulkan.*.so, libggml.vulkan.*.so): linked by name.
  g++ -std=c++17 -O2 -DNDEBUG -pthread -I"$s/include" -I"$s/ggml/include" -I"$s/common" -I"$s/vendor" \
    -I"$s/tools/llama-bench" "$s/tools/llama-bench/llama-bench.cpp" "$s/tools/llama-bench/main.cpp" \
    -o "$bins/llama-bench" -L"$bins" -l:libllama-common.so "-l:$(basename "$bins"/libllama.vulkan.*.so)" \
    "-l:$(basename "$bins"/libggml.vulkan.*.so)" -l:libggml-base.so -Wl,-rpath,'$ORIGIN'
fi

# --- the model and its GGUF files
model=$work/flash$layers
[ -f "$model/config.json" ] ||
  "$clef" make-model --preset flash-shaped --layers "$layers" --no-vision --out "$model" >/dev/null
for t in $types; do
  f=$work/flash$layers-$t.gguf
  [ -f "$f" ] || { log "converting to $t"; "$clef" convert --model "$model" --out "$f" --type "$t" \
    --arch qwen35 >/dev/null; }
done

[ -z "$setup_only" ] || exit 0

# --- one table
dev=$("$clef" devices --json | python3 -c '
import json, sys
ds = json.load(sys.stdin)["vulkan_devices"]
print(ds[0]["device"] if len(ds) == 1 else "")')
[ -n "$dev" ] || { log "the ICD $icd does not list exactly one device"; "$clef" devices >&2; exit 2; }
clef_tps() { # FILE TYPE -> tokens/s (the JSON line kept in WORK/clef-TYPE.json)
  "$clef" bench --model "$1" --head "$model" --device "$dev" --tokens "$tokens" --warmup "$warmup" --repeat "$repeat" |
    tee "$work/clef-$2.json" | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["device"]["kind"] == "vulkan", "clef ran on the CPU"
print("%.2f" % b["tokens_per_s"])'
}
llama_tps() { # FILE TYPE -> tokens/s (the JSON kept in WORK/llama-TYPE.json)
  local w=()
  [ "$warmup" -gt 0 ] || w=(--no-warmup)
  GGML_VK_VISIBLE_DEVICES=0 "$bins/llama-bench" -m "$1" -p "$tokens" -n 0 -ngl 99 -r "$repeat" "${w[@]}" -o json \
    2>/dev/null | tee "$work/llama-$2.json" | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
assert "Vulkan" in r["backends"], r["backends"]
print("%.2f" % r["avg_ts"])'
}
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)
echo "CPU: $cpu, $(nproc) cores; ICD $icd"
"$clef" devices | sed -n '1,2p'
echo "$tokens prompt tokens; $warmup warmup run(s), then best of $repeat (clef) / mean of $repeat (llama-bench)"
echo
printf '| file | llama.cpp Vulkan pp%s (tok/s) | clef --device %s (tok/s) | clef / llama.cpp |\n' "$tokens" "$dev"
printf '|---|---|---|---|\n'
for t in $types; do
  f=$work/flash$layers-$t.gguf
  l=$(llama_tps "$f" "$t") c=$(clef_tps "$f" "$t")
  printf '| flash%s %s | %s | %s | %s |\n' "$layers" "$t" "$l" "$c" "$(awk -v c="$c" -v l="$l" 'BEGIN {printf "%.2f", c / l}')"
done
