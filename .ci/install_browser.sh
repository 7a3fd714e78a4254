#!/usr/bin/env bash
# Install what the MLflow-UI browser test needs: Debian's chromium (never a downloaded browser build)
# and the fonts it renders with. Idempotent: returns at once when chromium is already there.
# playwright (the Python driver) comes from the project's dev extra, not from here.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && chromium --version >/dev/null 2>&1; then
  echo "install_browser: $(chromium --version 2>/dev/null) already installed"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install_browser: not root, cannot apt-get install chromium; the browser test will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
echo "install_browser: $(chromium --version 2>/dev/null) installed"
