#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Crypto library benchmark for LUKS-encrypted images: builds bench-xts.c
# against OpenSSL's libcrypto, GnuTLS and nettle and runs it once, single
# thread.  It prints AES-256-XTS (per 512-byte sector with a plain64 IV,
# as qcow2 LUKS encrypts, and as one message per 64 KiB cluster),
# AES-256-CBC per sector, and PBKDF2-HMAC-SHA256 iterations per second,
# with ratios against OpenSSL.
#
#   bench/bench-crypto.sh                   full run (3 runs of 1 s each)
#   BENCH_QUICK=1 bench/bench-crypto.sh     smoke run (1 run of 0.2 s)
#
# Needs: gcc, pkg-config, libssl-dev, libgnutls28-dev, nettle-dev.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for pc in libcrypto gnutls nettle; do
    if ! pkg-config --exists "$pc"; then
        echo "bench-crypto: pkg-config $pc not found (apt-get install libssl-dev libgnutls28-dev nettle-dev)" >&2
        exit 1
    fi
done

${CC:-gcc} -O2 -std=gnu11 -Wall -Wextra -o "$work/bench-xts" "$here/bench-xts.c" \
    $(pkg-config --cflags --libs libcrypto gnutls nettle)

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    export BENCH_SECONDS=${BENCH_SECONDS:-0.2} BENCH_REPEATS=${BENCH_REPEATS:-1}
fi
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)," \
     "aes-ni: $(grep -qw aes /proc/cpuinfo && echo yes || echo no)," \
     "vaes: $(grep -qw vaes /proc/cpuinfo && echo yes || echo no)"
"$work/bench-xts"
