#!/usr/bin/env bash
# The Debian packages the test suite drives: a throwaway PostgreSQL server (tests/test_postgres.py, the production
# storage) and headless Chromium (tests/test_webserver.py, the UI). `make test` and .ci/run call this first.
# Missing ones are installed with apt-get when we are root; otherwise it prints the command to run and fails.
set -euo pipefail

missing() {
  local out=""
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || out="postgresql"
  command -v chromium >/dev/null || out="${out:+$out }chromium"
  echo "$out"
}

packages=$(missing)
[ -z "$packages" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "test-deps: the tests need the Debian packages: $packages. Install them with:" >&2
  echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y $packages" >&2
  exit 1
fi
echo "test-deps: installing $packages with apt-get"
apt-get update -qq
# shellcheck disable=SC2086  # one word per package
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
still=$(missing)
if [ -n "$still" ]; then
  echo "test-deps: apt-get finished but $still is still missing" >&2
  exit 1
fi
