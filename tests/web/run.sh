#!/usr/bin/env bash
# Runs a tests/web script against `clef serve` on the tiny fixture (tests/e2e/run_with_server.sh starts it with an
# API key and sets TYPESAFE_BASE_URL / TYPESAFE_API_KEY), after installing the pinned npm packages the scripts
# use, once per build tree. The playground test drives Debian's chromium (scripts/setup).
# Usage: run.sh CLEF_BINARY MODEL_DIR NODE_MODULES_DIR SCRIPT.test.cjs
set -euo pipefail
clef=$1 model=$2 modules=$3 script=$4
here=$(cd "$(dirname "$0")" && pwd)

# One install for all of them: npm removes packages a later --no-save install does not name.
pkgs=(@typesafe-ai/sdk@0.6.0 ajv@8.20.0 @seriousme/openapi-schema-validator@2.11.0 playwright-core@1.65.2)
if [ "$(cat "$modules/.installed" 2>/dev/null)" != "${pkgs[*]}" ]; then
  mkdir -p "$modules"
  npm install --silent --no-audit --no-fund --no-save --prefix "$modules" "${pkgs[@]}" >/dev/null
  echo "${pkgs[*]}" >"$modules/.installed"
fi
exec "$here/../e2e/run_with_server.sh" "$clef" "$model" "$modules" "../web/$script"
