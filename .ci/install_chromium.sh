#!/usr/bin/env bash
# Install Debian's `chromium` (headless browser for tests/test_report_browser.py, which renders the HTML
# report the way the Kubeflow UI's HTML viewer does) and `graphviz` (the `dot` layout program behind the
# spec pictures in lemon_core/spec_picture.py). With CI=true those tests fail instead of skipping when a
# program is missing, so this must run before `make test`.
# Idempotent: does nothing when both programs are present. Non-interactive; uses sudo only when not root.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
if (have chromium || have chromium-browser) && have dot; then
  echo "chromium and graphviz already installed: $(chromium --version 2>/dev/null || chromium-browser --version), $(dot -V 2>&1)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# fonts-dejavu-core: the font the spec pictures and the report name, so text has the same metrics everywhere.
$SUDO apt-get install -y -qq --no-install-recommends chromium graphviz fonts-dejavu-core
echo "installed: $(chromium --version), $(dot -V 2>&1)"
