#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install everything qcow2zstd needs on Debian 12 (bookworm): the build
# tools, both compilers and the sanitizer runtimes, nbdkit and libnbd,
# the decompression libraries, and the tools that the tests, the demo
# and the benchmark drive.
#
# Run it as root, or source it:
#     bash .ci/deps.sh
#     . .ci/deps.sh
# `bash .ci/deps.sh --packaging` installs instead what building, checking
# and trying the Debian packages needs beyond that (.ci/package.sh): kept
# apart because debhelper and lintian bring about 140 packages that a
# build from the tree never uses.
# It is idempotent: when every package is already installed it does not
# touch apt at all (set QCOW2ZSTD_DEPS_FORCE=1 to update and install
# anyway).  Sourcing it changes no shell options of the caller and leaves
# behind only the function qcow2zstd_install_deps.

qcow2zstd_install_deps ()
(
    set -eu

    # Every name here was checked with `apt-cache policy` on Debian 12.
    local packages=(
        # build
        build-essential autoconf automake libtool pkg-config
        clang libclang-rt-14-dev        # clang builds, ASan/UBSan, fuzzers
        perl                            # pod2man and podchecker
        # nbdkit and libnbd
        nbdkit nbdkit-plugin-dev
        libnbd-dev libnbd-bin           # nbdcopy, nbdinfo, nbdsh, nbdfuse
        python3 python3-libnbd
        # decompression
        libzstd-dev zlib1g-dev libdeflate-dev libisal-dev
        # LUKS-encrypted images
        libgnutls28-dev nettle-dev
        # tests, demo and benchmark
        qemu-utils                      # qemu-img, qemu-io, qemu-nbd
        fio e2fsprogs
        fuse3 fuse2fs                   # nbdfuse + fuse2fs mount test
        time                            # GNU /usr/bin/time for peak RSS
        valgrind
        mount                           # losetup: test-mount's loop round
        gdb                             # where a server hangs, when one does
        # a real kernel, a VM and a web server (tests/guest-functions.sh,
        # test-mount-kernel.sh, test-vm-disk.sh, tests/nginx-functions.sh)
        qemu-system-x86                 # qemu-system-x86_64 boots the test guest
        cpio kmod                       # its initramfs; depmod for its modules.dep
        nbd-client                      # the host's own kernel client, where it has one
        nginx                           # the curl tests and bench/bench-http.sh
    )
    # --packaging: dpkg-buildpackage, dh (it brings dh_autoreconf) and the
    # checker; the build dependencies (debian/control) are the list above.
    local packaging=(
        dpkg-dev debhelper lintian
        git                             # .ci/package.sh exports the tree
        man-db                          # man -w finds the installed pages
    )
    [ "${1:-}" != --packaging ] || packages=("${packaging[@]}")
    local missing=() p status

    for p in "${packages[@]}"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) || status=
        if [ "$status" != installed ]; then
            missing+=("$p")
        fi
    done

    if [ ${#missing[@]} -eq 0 ] && [ "${QCOW2ZSTD_DEPS_FORCE:-0}" != 1 ]; then
        echo "deps.sh: all ${#packages[@]} packages are installed"
        return 0
    fi
    [ ${#missing[@]} -gt 0 ] && echo "deps.sh: installing: ${missing[*]}"

    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "deps.sh: run this as root to install: ${missing[*]}" >&2
            return 1
        fi
    fi

    # Only what is missing, so that a rerun upgrades nothing behind the
    # user's back; forced, the whole list.
    local install=("${missing[@]}")
    [ "${QCOW2ZSTD_DEPS_FORCE:-0}" = 1 ] && install=("${packages[@]}")

    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${install[@]}"
)

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    qcow2zstd_install_deps "$@"     # sourced: the caller sees the status
else
    qcow2zstd_install_deps "$@"
    exit $?
fi
