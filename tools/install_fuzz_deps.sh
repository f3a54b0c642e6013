#!/usr/bin/env bash
# Installs what `make fuzz` needs beyond tools/install_deps.sh: clang and its libFuzzer /
# sanitizer runtimes. Safe to run repeatedly; does nothing when clang can already link a
# -fsanitize=fuzzer program. The runtimes' package is named after clang's major version
# (libclang-rt-N-dev on Debian 12 / Ubuntu 23.04+; older releases ship them with clang).
set -euo pipefail

can_link_fuzzer() {
    command -v clang >/dev/null 2>&1 || return 1
    local dir
    dir=$(mktemp -d)
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$dir/t.c"
    clang -fsanitize=fuzzer,address,undefined "$dir/t.c" -o "$dir/t" >/dev/null 2>&1
    local rc=$?
    rm -rf "$dir"
    return $rc
}

can_link_fuzzer && exit 0

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
apt_install() {
    echo "install_fuzz_deps: installing $*" >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

$SUDO apt-get update -qq
command -v clang >/dev/null 2>&1 || apt_install clang
if ! can_link_fuzzer; then
    major=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
    apt_install "libclang-rt-${major}-dev"
fi
can_link_fuzzer || { echo "install_fuzz_deps: clang still cannot link -fsanitize=fuzzer" >&2; exit 1; }
