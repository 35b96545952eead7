#!/usr/bin/env bash
# Installs what the client test suite needs, only when missing: the aws cli and rclone from apt, and a
# Python venv (outside the clone, reused across runs) with boto3, requests, pytest, selenium and kubernetes-validate from PyPI.
set -euo pipefail
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"
VENV="$1"
REQ="$(dirname "$0")/../tests/python/requirements.txt"

need_apt=()
command -v aws >/dev/null 2>&1 || need_apt+=(awscli)
command -v rclone >/dev/null 2>&1 || need_apt+=(rclone)
# The console's browser test: Debian's Chromium and its WebDriver (a browser download does not work here).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
apt_install "${need_apt[@]}"

stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/pytest" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "client-deps: preparing the Python venv in $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -r "$REQ"
    echo "$want" > "$stamp"
fi
