#!/usr/bin/env bash
# Validates the deployment files (docs/DEPLOY.md) with validators we did not write, and against the real server:
#   deploy/k8s      the Kubernetes schemas and API types (kubernetes-models, typescript; check_deploy.cjs k8s)
#   Dockerfile      dockerfile-utils' linter; the runtime stage installs every library `ldd CLEF_BINARY` needs,
#                   the build stage only packages of scripts/setup, apt knows them all; the build context that
#                   .dockerignore leaves configures and holds every input of `clef` (ninja -t inputs)
#   deploy/systemd  systemd-analyze verify, and systemd-analyze security (exposure at most 2.0)
#   all three       `clef serve` run with the Deployment's arguments: probes, metric, key, HEALTHCHECK, flags
# and checks that each validator rejects a deliberately broken copy. npm packages: pinned, installed by name from
# the registry once per build tree. No docker daemon needed.
# Usage: check.sh CLEF_BINARY MODEL_DIR WORK_DIR
set -euo pipefail
clef=$(realpath "$1") model=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
pkgs=(kubernetes-models@4.5.1 typescript@5.9.3 yaml@2.9.1 dockerfile-utils@0.16.3 @balena/dockerignore@1.0.2)
if [ ! -f "$work/node_modules/@balena/dockerignore/package.json" ]; then
  mkdir -p "$work"
  npm install --silent --no-audit --no-fund --no-save --prefix "$work" "${pkgs[@]}" >/dev/null
fi
export NODE_PATH="$work/node_modules"
check() { node "$here/check_deploy.cjs" "$@"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A systemd unit: verify (warnings count: it exits 0 on unknown keys) and the hardening score. ExecStart's binary
# must exist, so the copy runs the clef under test.
check_unit() {
  local dir out
  dir=$(mktemp -d -p "$tmp")
  sed "s#/usr/local/bin/clef#$clef#" "$1" >"$dir/clef.service"
  out=$(cd "$dir" && systemd-analyze verify --man=no ./clef.service 2>&1) || { echo "$out"; return 1; }
  if grep "clef.service" <<<"$out"; then return 1; fi
  (cd "$dir" && systemd-analyze security --offline=true --threshold=20 ./clef.service >/dev/null) ||
    { echo "$1: exposure above 2.0 (systemd-analyze security --offline=true)"; return 1; }
}

# Every shared library the binary loads comes from a package the runtime stage installs (or one apt pulls in).
check_runtime_libs() {
  local listed closure lib pkg status=0
  listed=$(check packages "$1" runtime)
  # shellcheck disable=SC2086
  closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances $listed | grep -v '^ ' | sed 's/:.*//' | sort -u)
  for lib in $(ldd "$clef" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
    pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null) || pkg=""
    pkg=${pkg%%:*}
    if [ -z "$pkg" ] || ! grep -qx "$pkg" <<<"$closure"; then
      echo "$1: the runtime stage does not install ${pkg:-the package of} $lib"
      status=1
    fi
  done
  return $status
}

# The build stage installs packages of scripts/setup, and apt knows every package of both stages.
check_packages() {
  local setup build all known pkg status=0
  setup=$(sed -n '/^PKGS=(/,/^)/p' "$root/scripts/setup" | tr -s ' \n' '\n')
  build=$(check packages "$1" build)
  all="$build $(check packages "$1" runtime)"
  for pkg in $build; do
    grep -qx "$pkg" <<<"$setup" || { echo "$1: the build stage installs $pkg, which scripts/setup does not"; status=1; }
  done
  # shellcheck disable=SC2086
  known=$(apt-cache policy $all 2>/dev/null | sed -n 's/^\([^ ].*\):$/\1/p')
  for pkg in $all; do
    grep -qx "$pkg" <<<"$known" || { echo "$1: apt knows no package $pkg"; status=1; }
  done
  return $status
}

# The files `docker build` would send configure as the build stage does, and hold every input of the clef target.
check_context() {
  local ctx
  ctx=$(mktemp -d -p "$tmp")
  check context "$root" "$1" "$ctx"
  cmake -S "$ctx" -B "$ctx/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLEF_BUILD_TESTS=OFF -DCLEF_BUILD_BENCH=OFF \
    >"$ctx/cmake.log" 2>&1 || { cat "$ctx/cmake.log"; return 1; }
  # The inputs of clef that no build step makes must be in the context (sources, embedded files).
  ninja -C "$ctx/build" -t targets all | sed 's/: [^:]*$//' | sort -u >"$ctx/made"
  ninja -C "$ctx/build" -t inputs clef | sort -u | comm -23 - "$ctx/made" | while read -r f; do
    [ -e "$f" ] || [ -e "$ctx/build/$f" ] || { echo "$1: the build context lacks ${f#"$ctx"/}"; exit 1; }
  done
}

# The command must fail on the broken copy, or its validator proves nothing.
must_reject() {
  local what=$1
  shift
  if "$@" >/dev/null 2>&1; then
    echo "a broken copy passed: $what"
    exit 1
  fi
}

command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing (scripts/setup installs systemd)"; exit 1; }
check k8s "$root/deploy/k8s"
check dockerfile "$root/Dockerfile"
check_unit "$root/deploy/systemd/clef.service"
check_runtime_libs "$root/Dockerfile"
check_packages "$root/Dockerfile"
check_context "$root/.dockerignore"

cp -r "$root/deploy/k8s" "$tmp/k8s-typo"
sed -i 's/readinessProbe:/readinesProbe:/' "$tmp/k8s-typo/deployment.yaml"
must_reject "deployment.yaml with readinesProbe" check k8s "$tmp/k8s-typo"
cp -r "$root/deploy/k8s" "$tmp/k8s-type"
sed -i 's/containerPort: 8080/containerPort: "8080"/' "$tmp/k8s-type/deployment.yaml"
must_reject "deployment.yaml with a string containerPort" check k8s "$tmp/k8s-type"
sed 's/--start-period=600s/--start-period=ten/' "$root/Dockerfile" >"$tmp/Dockerfile.bad"
must_reject "Dockerfile with HEALTHCHECK --start-period=ten" check dockerfile "$tmp/Dockerfile.bad"
sed 's/ libdnnl2 / /' "$root/Dockerfile" >"$tmp/Dockerfile.nolib"
must_reject "Dockerfile without libdnnl2" check_runtime_libs "$tmp/Dockerfile.nolib"
sed 's/ libdnnl-dev / libdnnl3-dev /' "$root/Dockerfile" >"$tmp/Dockerfile.badpkg"
must_reject "Dockerfile building with libdnnl3-dev" check_packages "$tmp/Dockerfile.badpkg"
grep -v '^!docs/' "$root/.dockerignore" >"$tmp/dockerignore.nodocs"
must_reject ".dockerignore without docs/ (the embedded openapi.json)" check_context "$tmp/dockerignore.nodocs"
sed 's/^Restart=on-failure/Restart=sometimes/' "$root/deploy/systemd/clef.service" >"$tmp/restart.service"
must_reject "clef.service with Restart=sometimes" check_unit "$tmp/restart.service"
grep -v '^Protect\|^Private' "$root/deploy/systemd/clef.service" >"$tmp/weak.service"
must_reject "clef.service without the Protect*/Private* options" check_unit "$tmp/weak.service"

check live "$clef" "$model" "$root/deploy/k8s" "$root/Dockerfile" "$root/deploy/systemd/clef.service"
echo "deploy: Kubernetes manifests, Dockerfile and systemd unit valid"
