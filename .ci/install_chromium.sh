#!/usr/bin/env bash
# Install Debian's `chromium` (headless browser for tests/test_report_browser.py, which renders the HTML
# report the way the Kubeflow UI's HTML viewer does). With CI=true that test fails instead of skipping when
# the browser is missing, so this must run before `make test`. Spec pictures need no system package (their
# layout is plain Python, lemon_core/spec_layout.py).
# Idempotent: does nothing when chromium is present. Non-interactive; uses sudo only when not root.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
if have chromium || have chromium-browser; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || chromium-browser --version)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# fonts-dejavu-core: the font the spec pictures name and size their boxes by, so the browser draws their
# text with the metrics the layout measured.
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
echo "installed: $(chromium --version)"
