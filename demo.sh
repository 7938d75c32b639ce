#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# qcow2zstd demo: from a fresh Debian 12 machine to a verified copy.
#
#     bash demo.sh          (as root, from the top of the repository)
#
# 1. installs the dependencies (.ci/deps.sh; nothing to do if present);
# 2. builds the filter in this tree (autoreconf, configure, make);
# 3. makes an ext4 filesystem image from files on this machine and
#    compresses it to qcow2 with zstd using qemu-img;
# 4. serves the qcow2 image with nbdkit and the freshly built filter,
#    copies the guest disk to a raw file with nbdcopy, and checks that it
#    is byte for byte the image qemu-img compressed.
#
# Environment: DEMO_SIZE (ext4 image size, default 512M), DEMO_DATA_MIB
# (MiB of files to put in it, default 200), TMPDIR (scratch space, about
# three times DEMO_SIZE; default /var/tmp).  Exits non-zero on any error
# or mismatch, and removes everything it made except the build.

set -euo pipefail

DEMO_SIZE=${DEMO_SIZE:-512M}
DEMO_DATA_MIB=${DEMO_DATA_MIB:-200}

top=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$top"

step () { printf '\n==> %s\n' "$*"; }
die () { echo "demo.sh: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/var/tmp}/qcow2zstd-demo.XXXXXX")
cleanup () { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Run a command with its output in a log, shown only if it fails.
quietly ()
{
    local log=$work/step.log
    if ! "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "failed: $*"
    fi
}

# ------------------------------------------------------------ dependencies
step "Dependencies (.ci/deps.sh)"
bash .ci/deps.sh

# ------------------------------------------------------------ build
step "Building the filter"
if [ ! -x configure ]; then
    echo "autoreconf -fi"
    quietly autoreconf -fi
fi
# Configure unless already configured for a plain build.  A tree left
# configured with --enable-sanitizers builds a filter that nbdkit cannot
# load without the sanitizer runtimes: reconfigure it and rebuild from
# clean (make alone would keep the instrumented objects).
if [ ! -f Makefile ] || [ ! -x config.status ]; then
    echo "./configure"
    quietly ./configure
elif ./config.status --config | grep -q -- '--enable-sanitizers'; then
    echo "./configure (this tree was configured with --enable-sanitizers)"
    quietly ./configure
    quietly make clean
fi
echo "make -j2"
quietly make -j2

filter=$top/filters/qcow2zstd/.libs/nbdkit-qcow2zstd-filter.so
[ -f "$filter" ] || die "the build did not produce $filter"

# ------------------------------------------------------------ demo image
step "Making a ${DEMO_SIZE} ext4 image with ${DEMO_DATA_MIB} MiB of files from this machine"
files=$work/files
mkdir "$files"

# A mix of what compresses differently: executables, shared libraries and
# text.  Take files in name order until each share of the budget is used.
budget=$((DEMO_DATA_MIB * 1024 * 1024))
pick ()
{
    local share=$1 dir dirs=()
    shift
    for dir in "$@"; do
        [ -d "$dir" ] && dirs+=("$dir")
    done
    [ ${#dirs[@]} -gt 0 ] || return 0
    # Paths relative to / (tar runs there), NUL-terminated.
    find "${dirs[@]}" -xdev -type f -size -16M -printf '%s\t%p\n' |
        sort -t "$(printf '\t')" -k2,2 |
        awk -F '\t' -v limit=$((budget * share / 100)) '
            total + $1 <= limit { total += $1; printf "%s%c", substr($2, 2), 0 }'
}
{
    pick 40 /usr/bin /usr/sbin
    pick 45 /usr/lib
    pick 15 /usr/share/doc /usr/share/man
} > "$work/list"
# tar copies the chosen files with their directory structure.
tar -C / --null --no-recursion -T "$work/list" -cf - | tar -xf - -C "$files"
nfiles=$(find "$files" -type f | wc -l)
data_bytes=$(du -sb "$files" | cut -f1)
printf '%d files, %d MiB\n' "$nfiles" $((data_bytes / 1048576))

raw=$work/demo.raw
truncate -s "$DEMO_SIZE" "$raw"
quietly mke2fs -q -F -t ext4 -L qcow2zstd-demo -d "$files" "$raw"
rm -rf "$files"

step "Compressing it: qemu-img convert -c -O qcow2 -o compression_type=zstd"
qcow2=$work/demo.qcow2
quietly qemu-img convert -c -O qcow2 -o compression_type=zstd "$raw" "$qcow2"

virtual_bytes=$(stat -c %s "$raw")
allocated_bytes=$(( $(stat -c %b "$raw") * $(stat -c %B "$raw") ))
qcow2_bytes=$(stat -c %s "$qcow2")

# ------------------------------------------------------------ the main job
step "Serving it with nbdkit --filter=qcow2zstd and copying it with nbdcopy"
out=$work/copy.raw
echo "nbdkit --filter=$filter file $qcow2 --run 'nbdcopy \"\$uri\" $out'"
start=$(date +%s%N)
# --run starts the server on a private socket, runs the command with $uri
# pointing at it, and shuts the server down when the command ends.
nbdkit --filter="$filter" file "$qcow2" \
    --run "nbdcopy \"\$uri\" $(printf %q "$out")" ||
    die "nbdkit or nbdcopy failed"
end=$(date +%s%N)

step "Checking the copy against the image that was compressed"
cmp "$raw" "$out" || die "MISMATCH: the guest disk served by the filter differs from the source image"
echo "identical: $virtual_bytes bytes"

# ------------------------------------------------------------ summary
awk -v v="$virtual_bytes" -v a="$allocated_bytes" -v q="$qcow2_bytes" \
    -v ns=$((end - start)) '
    BEGIN {
        mib = 1048576; s = ns / 1e9
        printf "\nvirtual disk:     %8.1f MiB (%.1f MiB allocated in the raw image)\n", v / mib, a / mib
        printf "qcow2 (zstd):     %8.1f MiB\n", q / mib
        printf "compression:      %8.2f : 1 of the virtual disk, %.2f : 1 of the allocated data\n", v / q, a / q
        printf "copied in:        %8.2f s (nbdkit start-up included)\n", s
        printf "throughput:       %8.1f MiB/s of virtual disk (%.1f MiB/s of allocated data)\n", v / mib / s, a / mib / s
    }'
echo
echo "demo.sh: OK"
