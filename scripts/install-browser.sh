#!/usr/bin/env bash
# Install Debian's Chromium and ChromeDriver for the explorer's browser test (tests/test_explorer.py),
# only if /usr/bin/chromium or /usr/bin/chromedriver is missing. Idempotent and non-interactive:
# `apt-get update` runs only when a package is missing and apt cannot find it in its current lists.
# Needs root (or sudo). Selenium drives /usr/bin/chromedriver directly, so nothing is downloaded at
# test time.
set -euo pipefail

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    echo "install-browser: $(/usr/bin/chromium --version 2>/dev/null | head -n1); $(/usr/bin/chromedriver --version 2>/dev/null | head -n1)"
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-browser: run as root (apt-get install chromium chromium-driver)" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# --no-install-recommends keeps out printing/desktop extras; fonts-liberation (a Recommends) gives
# headless Chromium real fonts to lay out text with.
PACKAGES=(chromium chromium-driver fonts-liberation)

# Update the package lists only when apt does not know a candidate for one of the packages.
needs_update=0
for pkg in "${PACKAGES[@]}"; do
    candidate=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
        needs_update=1
    fi
done
if [[ $needs_update -eq 1 ]]; then
    echo "install-browser: apt-get update"
    $SUDO apt-get update -qq
fi

echo "install-browser: apt-get install ${PACKAGES[*]}"
$SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
/usr/bin/chromium --version
/usr/bin/chromedriver --version
