# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# A small Linux guest for the tests that need a real kernel: Debian's
# own kernel, booted by qemu-system-x86_64 from an initramfs holding
# busybox, nbd-client with its libraries, and the modules that mounting
# ext4 from an NBD device or a virtio disk needs.  Sourced after
# functions.sh by test-mount-kernel.sh, test-vm-disk.sh and
# test-man-examples.sh.
#
# The guest is made at test time from Debian packages (apt-get download,
# dpkg-deb -x, depmod, cpio) and cached in $QCOW2ZSTD_GUEST_CACHE (default:
# tests/guest-cache in the build tree; .ci/run points every build of one
# CI run at the same one).  Building it needs apt-get to reach the
# Debian archive: without it the tests skip, saying why.
#
#   guest_prepare       build the guest or find it in the cache; 1 and
#                       the reason in $GUEST_SKIP when that cannot be done
#   guest_boot NAME SECONDS DIR [QEMU ARGS...]
#                       boot it with DIR's files under /test in the guest;
#                       the guest runs /test/run.sh and powers off.  0 if
#                       run.sh exited 0.  The console is in NAME.console
#                       and is printed when the boot fails.
#   guest_nbdkit_cmd LOG STATUS NBDKIT-ARGS...
#                       the command line for qemu's guestfwd=...-cmd: that
#                       runs nbdkit -s on the connection's pipe (through
#                       the sanitizer environment if there is one), with
#                       its stderr in LOG and its exit status in STATUS.
#   guest_nbdkit_end WHAT LOG STATUS
#                       after the guest disconnected: that nbdkit must
#                       exit, in time, with status 0 and a clean log
#                       (as functions.sh's stop_server judges a server);
#                       else the test fails, naming WHAT.

: "${QCOW2ZSTD_GUEST_CACHE:=$top_builddir/tests/guest-cache}"
GUEST_CACHE=$QCOW2ZSTD_GUEST_CACHE

# The modules loaded at boot, in this order, each after the modules it
# needs (modules.dep): a virtio network card for qemu's user network, a
# virtio disk, the NBD client device, and ext4 (whose checksums need
# crc32c, which ext4 asks the crypto API for by name).
GUEST_MODULES=(virtio_pci virtio_net virtio_blk nbd crc32c_generic ext4)

# guest_prepare: set GUEST_KERNEL and GUEST_INITRD (the cached kernel and
# base initramfs) and GUEST_ACCEL (kvm or tcg).
guest_prepare ()
{
    GUEST_SKIP=
    local cmd
    for cmd in qemu-system-x86_64 apt-get apt-cache dpkg-deb depmod cpio readelf gzip flock timeout; do
        if ! command -v "$cmd" > /dev/null 2>&1; then
            GUEST_SKIP="'$cmd' is not installed (packages: qemu-system-x86 kmod cpio binutils; see .ci/deps.sh)"
            return 1
        fi
    done
    mkdir -p "$GUEST_CACHE" || { GUEST_SKIP="cannot create $GUEST_CACHE"; return 1; }
    # The tests of a make -j2 run may both get here first: one builds,
    # the other waits for it.
    local lock
    exec {lock}> "$GUEST_CACHE/lock"
    flock "$lock"
    # A guest cached by an older recipe (another init, other modules) is
    # made again.
    local recipe
    recipe="recipe $(cat "$top_srcdir/tests/guest-init.sh" - <<< "${GUEST_MODULES[*]}" | md5sum | cut -c1-16)"
    if [ "$(head -n 1 "$GUEST_CACHE/ready" 2> /dev/null)" != "$recipe" ]; then
        rm -rf "$GUEST_CACHE/build"
        if ! (_guest_build "$GUEST_CACHE/build") > "$GUEST_CACHE/build.log" 2>&1; then
            GUEST_SKIP=$(grep -m1 '^guest: ' "$GUEST_CACHE/build.log" || true)
            [ -n "$GUEST_SKIP" ] || { cat "$GUEST_CACHE/build.log" >&2; fail "building the guest failed (see above)"; }
            GUEST_SKIP=${GUEST_SKIP#guest: }
            exec {lock}>&-
            return 1
        fi
        mv "$GUEST_CACHE/build/vmlinuz" "$GUEST_CACHE/build/base.cpio.gz" "$GUEST_CACHE/"
        { echo "$recipe"; cat "$GUEST_CACHE/build/packages"; } > "$GUEST_CACHE/ready"
        rm -rf "$GUEST_CACHE/build"
    fi
    GUEST_KERNEL=$GUEST_CACHE/vmlinuz
    GUEST_INITRD=$GUEST_CACHE/base.cpio.gz
    _guest_accel
    exec {lock}>&-
    echo "guest: $(grep -E '^(linux-image|busybox|nbd-client)' "$GUEST_CACHE/ready" | tr '\n' ' ')($GUEST_ACCEL)"
}

# _guest_build DIR: run in a subshell, output in build.log.  A line
# "guest: REASON" and status 1 when the archive cannot be reached; any
# other failure is a test failure.
_guest_build ()
{
    set -euo pipefail
    local dir=$1
    mkdir -p "$dir/debs" "$dir/x" "$dir/root"
    cd "$dir"

    # linux-image-amd64 is the metapackage; the kernel is what it
    # depends on, e.g. linux-image-6.1.0-57-amd64.
    local kernel
    kernel=$(apt-cache depends linux-image-amd64 2> /dev/null |
             awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
    if [ -z "$kernel" ]; then
        echo "guest: apt-cache knows no linux-image-amd64 (run apt-get update)"
        return 1
    fi
    # nbd-client and the libraries it depends on, recursively (only the
    # packages named lib*: debconf and the like are for installing it).
    local -A seen=()
    local todo=(nbd-client) pkg dep libs=()
    while [ ${#todo[@]} -gt 0 ]; do
        pkg=${todo[0]}
        todo=("${todo[@]:1}")
        [ -z "${seen[$pkg]:-}" ] || continue
        seen[$pkg]=1
        [ "$pkg" = nbd-client ] || libs+=("$pkg")
        for dep in $(apt-cache depends --no-recommends --no-suggests --no-conflicts \
                         --no-breaks --no-replaces --no-enhances "$pkg" 2> /dev/null |
                     awk '$1 ~ /^\|?(Pre)?Depends:$/ && $2 ~ /^lib/ { print $2 }'); do
            todo+=("$dep")
        done
    done

    local packages=("$kernel" busybox-static nbd-client "${libs[@]}")
    if ! (cd debs && apt-get download -o APT::Sandbox::User=root "${packages[@]}") > download.log 2>&1; then
        echo "guest: apt-get download of $kernel, busybox-static, nbd-client and its libraries failed: $(grep -m1 '^E:' download.log || grep -m1 '^W:' download.log || tail -n1 download.log)"
        return 1
    fi
    local deb name
    for deb in debs/*.deb; do
        name=$(dpkg-deb -f "$deb" Package)
        dpkg-deb -x "$deb" "x/$name"
        echo "$name $(dpkg-deb -f "$deb" Version)" >> packages
    done

    local root=$dir/root kdir=x/$kernel
    local kver
    kver=$(ls "$kdir/lib/modules")
    cp "$kdir/boot/vmlinuz-$kver" vmlinuz

    # The modules and, before each, what modules.dep says it needs.
    depmod -b "$kdir" "$kver"
    local mdir=$kdir/lib/modules/$kver
    local -A loaded=()
    local order=()
    _guest_add_module ()
    {
        local m=$1 path deps d
        path=$(awk -v m="$m" -F: '{ n = $1; sub(/.*\//, "", n); sub(/\.ko(\.[a-z]+)?$/, "", n);
                                      gsub(/-/, "_", n) } n == m { print $1; exit }' "$mdir/modules.dep")
        [ -n "$path" ] || { echo "$m is not a module of $kver" >&2; return 1; }
        [ -z "${loaded[$path]:-}" ] || return 0
        deps=$(awk -v p="$path" -F: '$1 == p { print $2 }' "$mdir/modules.dep")
        # modules.dep lists the dependencies of a dependency too, the
        # deepest last: load them from the end.
        local -a list
        read -r -a list <<< "$deps"
        for (( d = ${#list[@]} - 1; d >= 0; d-- )); do
            if [ -z "${loaded[${list[d]}]:-}" ]; then
                loaded[${list[d]}]=1
                order+=("${list[d]}")
            fi
        done
        loaded[$path]=1
        order+=("$path")
    }
    local m
    for m in "${GUEST_MODULES[@]}"; do _guest_add_module "$m"; done
    mkdir -p "$root/lib/modules"
    for m in "${order[@]}"; do
        case $m in
        *.ko) cp "$mdir/$m" "$root/lib/modules/" ;;
        *) echo "compressed module $m: not supported" >&2; return 1 ;;
        esac
        echo "${m##*/}" >> "$root/lib/modules/load"
    done

    # busybox (static) and nbd-client with the shared objects it needs.
    mkdir -p "$root/bin" "$root/sbin" "$root/lib64" "$root/lib/x86_64-linux-gnu" \
             "$root/proc" "$root/sys" "$root/dev" "$root/mnt" "$root/tmp"
    cp x/busybox-static/bin/busybox "$root/bin/"
    cp x/nbd-client/sbin/nbd-client "$root/sbin/"
    local -A have=()
    local so lib found
    local interp
    interp=$(readelf -l "$root/sbin/nbd-client" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    cp -L "x/libc6$interp" "$root$interp"
    local queue=("$root/sbin/nbd-client")
    while [ ${#queue[@]} -gt 0 ]; do
        lib=${queue[0]}
        queue=("${queue[@]:1}")
        for so in $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            [ -z "${have[$so]:-}" ] || continue
            have[$so]=1
            found=$(find x/*/lib/x86_64-linux-gnu x/*/usr/lib/x86_64-linux-gnu \
                         -maxdepth 1 -name "$so" 2> /dev/null | head -n1)
            [ -n "$found" ] || { echo "nbd-client needs $so, in none of: ${libs[*]}" >&2; return 1; }
            cp -L "$found" "$root/lib/x86_64-linux-gnu/$so"
            queue+=("$root/lib/x86_64-linux-gnu/$so")
        done
    done

    cp "$top_srcdir/tests/guest-init.sh" "$root/init"
    chmod 755 "$root/init"
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -1 > base.cpio.gz
    # The kernel looks for the next archive of the initramfs only at a
    # multiple of 4 bytes, skipping zeros.
    truncate -s %4 base.cpio.gz
}

# _guest_accel: KVM when a guest boots under it, else TCG.  Nested KVM
# can hang a guest at boot, so KVM is used only after a probe boot
# (which powers off at once) has finished under it within a time limit;
# the answer is cached with the guest.  QCOW2ZSTD_GUEST_ACCEL=tcg or kvm
# forces one.
_guest_accel ()
{
    if [ -n "${QCOW2ZSTD_GUEST_ACCEL:-}" ]; then
        GUEST_ACCEL=$QCOW2ZSTD_GUEST_ACCEL
        return
    fi
    if [ -s "$GUEST_CACHE/accel" ]; then
        GUEST_ACCEL=$(cat "$GUEST_CACHE/accel")
        return
    fi
    GUEST_ACCEL=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
        local probe=$GUEST_CACHE/probe
        rm -rf "$probe" && mkdir -p "$probe/test"
        printf 'echo kvm probe\n' > "$probe/test/run.sh"
        if GUEST_ACCEL=kvm GUEST_QUIET=1 guest_boot "$probe/kvm" 15 "$probe/test"; then
            GUEST_ACCEL=kvm
        fi
        rm -rf "$probe"
    fi
    echo "$GUEST_ACCEL" > "$GUEST_CACHE/accel"
}

# guest_boot NAME SECONDS DIR [QEMU ARGS...]
guest_boot ()
{
    local name=$1 seconds=$2 dir=$3
    shift 3
    # The test's files in a second, uncompressed archive after the base
    # one: the kernel unpacks both into the same root.
    local extra=$name.cpio
    rm -rf "$name.root" && mkdir -p "$name.root"
    cp -al "$dir" "$name.root/test" 2> /dev/null || cp -a "$dir" "$name.root/test"
    (cd "$name.root" && find test | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$extra"
    rm -rf "$name.root"
    cat "$GUEST_INITRD" "$extra" > "$name.initrd"
    rm -f "$extra"

    local accel=(-accel tcg)
    [ "$GUEST_ACCEL" = kvm ] && accel=(-accel kvm -cpu host)
    local status=0
    timeout -k 10 "$seconds" qemu-system-x86_64 "${accel[@]}" -m 768 -smp 1 \
        -nodefaults -no-user-config -display none -no-reboot \
        -serial "file:$name.console" \
        -kernel "$GUEST_KERNEL" -initrd "$name.initrd" \
        -append "console=ttyS0 panic=-1 loglevel=4" \
        "$@" > "$name.qemu" 2>&1 || status=$?
    rm -f "$name.initrd"
    if [ $status = 124 ] || [ $status = 137 ]; then
        GUEST_FAILURE="the guest did not power off within $seconds s"
    elif [ $status != 0 ]; then
        GUEST_FAILURE="qemu-system-x86_64 exited with status $status: $(head -c 300 "$name.qemu")"
    elif ! grep -q '^GUEST-EXIT 0' "$name.console"; then
        GUEST_FAILURE="the guest's test script failed: $(grep -m1 '^GUEST-EXIT' "$name.console" || echo 'no exit status on the console')"
        status=1
    elif grep -Eq 'EXT4-fs error|I/O error|Kernel panic|BUG:|Call Trace' "$name.console"; then
        GUEST_FAILURE="the kernel reported an error on the console"
        status=1
    fi
    if [ $status != 0 ] && [ -z "${GUEST_QUIET:-}" ]; then
        echo "===== guest console ($name.console):" >&2
        cat "$name.console" >&2
        echo "===== qemu:" >&2
        cat "$name.qemu" >&2
        echo "$GUEST_FAILURE" >&2
    fi
    return $status
}

# guest_nbdkit_cmd LOG STATUS NBDKIT-ARGS...: prints the guestfwd command
# (commas doubled, as qemu's option syntax wants).  slirp runs it with
# the connection on stdin, stdout and stderr alike, so stderr is sent to
# LOG; nbdkit -s serves that one connection and exits when the client
# disconnects, and STATUS then holds its exit status.
guest_nbdkit_cmd ()
{
    local log=$1 status=$2
    shift 2
    local words=() w
    for w in "${NBDKIT_ENV[@]}" nbdkit -s "$@"; do words+=("$(_guest_quote "$w")"); done
    local cmd
    cmd="/bin/sh -c $(_guest_quote "exec 2> $(_guest_quote "$log"); ${words[*]}; echo \$? > $(_guest_quote "$status")")"
    printf '%s' "${cmd//,/,,}"
}

# _guest_quote WORD: WORD in single quotes, for sh and for glib's
# g_shell_parse_argv (which slirp splits the guestfwd command with).
_guest_quote ()
{
    local q="'\\''"
    printf "'%s'" "${1//\'/$q}"
}

# guest_nbdkit_end WHAT LOG STATUS: qemu, not the test, started this
# nbdkit, so functions.sh cannot wait for it: its status comes from the
# file guest_nbdkit_cmd's shell writes when it exits.
guest_nbdkit_end ()
{
    local what=$1 log=$2 status_file=$3
    local limit=$(( STOP_TIMEOUT * 2 )) i pid cmd
    for (( i = 0; i < limit * 10; i++ )); do
        [ ! -s "$status_file" ] || break
        sleep 0.1
    done
    if [ ! -s "$status_file" ]; then
        {
            echo "FAIL: $what: nbdkit -s did not exit within $limit s of the guest's disconnect"
            for pid in $(_our_processes); do
                cmd=$(tr '\0' ' ' 2> /dev/null < "/proc/$pid/cmdline") || continue
                [[ " $cmd" != *" nbdkit -s "* ]] || _backtrace "$pid"
            done
            echo "----- last lines of $log"
            tail -n 30 "$log"
        } >&"$_TEST_STDERR"
        fail "$what: nbdkit hangs at shutdown"
    fi
    local status errors
    status=$(cat "$status_file")
    if [ "$status" != 0 ]; then
        {
            _reports || true
            echo "----- last lines of $log"
            tail -n 40 "$log"
        } >&"$_TEST_STDERR"
        if [ "$status" = 99 ] && [ "${VALGRIND:-0}" = 1 ]; then
            fail "$what: valgrind found errors in nbdkit -s"
        fi
        fail "$what: nbdkit -s ended with $(_describe_status "$status"), expected status 0"
    fi
    errors=$(_log_errors "$log")
    if [ -n "$errors" ] || _reports > /dev/null; then
        { echo "$errors"; _reports || true; } >&"$_TEST_STDERR"
        fail "$what: nbdkit -s: its log shows a crash or a sanitizer report"
    fi
}
