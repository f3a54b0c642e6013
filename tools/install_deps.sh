#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages deepinfer needs to build and test, if they are missing.
# Safe to run repeatedly; does nothing when everything is present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev python3)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install_deps: installing ${missing[*]}" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
