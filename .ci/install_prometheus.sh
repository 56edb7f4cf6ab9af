#!/usr/bin/env bash
# Install Debian's `prometheus` package (provides /usr/bin/prometheus and /usr/bin/promtool) so
# tests/test_prometheus_server.py runs against a real server instead of skipping.
# Idempotent: does nothing when both binaries are already present. Non-interactive. Sourced or run
# by .ci/run; uses sudo only when not root.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  echo "prometheus already installed: $(prometheus --version 2>&1 | head -n1)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends keeps out the web console assets and node exporter; policy-rc.d style
# service start failures (no systemd in containers) are harmless: tests start their own server.
$SUDO apt-get install -y -qq --no-install-recommends prometheus || {
  # dpkg may report a failed postinst when no init system is running; the binaries are in place.
  command -v prometheus >/dev/null 2>&1 || exit 1
}
echo "installed: $(prometheus --version 2>&1 | head -n1)"
