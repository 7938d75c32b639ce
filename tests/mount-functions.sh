# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Helpers shared by test-mount.sh (nbdfuse + fuse2fs) and
# test-mount-kernel.sh (nbd-client + the kernel's ext4): an ext4
# filesystem made from a few files and compressed into qcow2, the changes
# made to it through a mount, and the checks of the image afterwards.
# Sourced after functions.sh, in $TMPDIR_TEST.

source "$top_srcdir/tests/tree-changes.sh"

# wait_until SECONDS COMMAND...: run COMMAND every 0.1 s until it
# succeeds; fail (return 1) after SECONDS.
wait_until ()
{
    local limit=$(( $1 * 10 ))
    shift
    local i
    for (( i = 0; i < limit; i++ )); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}

# wait_exit PID SECONDS: wait for a child process to exit and return its
# status; 124 if it is still running after SECONDS.
wait_exit ()
{
    local pid=$1 secs=$2
    if ! wait_until "$secs" eval "! kill -0 $pid 2>/dev/null"; then
        return 124
    fi
    local status=0
    wait "$pid" 2>/dev/null || status=$?
    return $status
}

# make_fs_image [SIZE]: src/ (the files), img.raw (an ext4 filesystem of
# SIZE, 64M by default, made by mke2fs -d from src/), img.qcow2 (img.raw
# compressed with zstd, with SIZE of room) and expect/ (a copy of src/
# that the changes are applied to).
make_fs_image ()
{
    local size=${1:-64M}
    /usr/bin/python3 - <<'EOF'
import os, random
rng = random.Random(99)
os.makedirs("src/sub/dir", exist_ok=True)
os.makedirs("src/sub/many", exist_ok=True)
open("src/bin.dat", "wb").write(rng.randbytes(1536 * 1024))
words = ["ext4", "fuse", "qcow2", "zstd", "nbd", "guest", "disk", "file"]
text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(6000))
open("src/text.txt", "w").write(text + "\n")
open("src/sub/dir/small.txt", "w").write("hello from the guest\n")
open("src/empty", "w").close()
for i in range(40):
    open("src/sub/many/f%02d" % i, "wb").write(rng.randbytes(rng.randrange(1, 20000)))
# A sparse file: data at 0 and at 1 MiB, a hole between.
with open("src/sparse.dat", "wb") as f:
    f.write(b"start" * 100)
    f.seek(1 << 20)
    f.write(rng.randbytes(70000))
EOF
    rm -f img.raw
    mke2fs -q -t ext4 -d src img.raw "$size" > /dev/null || fail "mke2fs -d failed"
    qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd img.raw img.qcow2 ||
        fail "qemu-img convert -c failed"
    truncate -s "+$size" img.qcow2
    rm -rf expect
    cp -a src expect
}

# tree_sums DIR: the md5sum of every file under DIR (lost+found aside),
# as ./PATH, sorted: what check_sums (tree-changes.sh) checks.
tree_sums ()
{
    (cd "$1" && find . -path ./lost+found -prune -o -type f -print | LC_ALL=C sort |
         xargs -d '\n' md5sum)
}

# compare_tree DIR WHAT: DIR holds exactly the files of expect/ (ignoring
# lost+found), with the same contents.
compare_tree ()
{
    diff -r --exclude=lost+found expect "$1" > diff.out 2>&1 ||
        { cat diff.out; fail "$2: the files differ from the expected ones"; }
    local f
    for f in bin.dat text.txt sub/dir/small.txt sparse.dat; do
        if [ -e "expect/$f" ]; then
            cmp "expect/$f" "$1/$f" || fail "$2: $f differs"
        fi
    done
}

# change_tree DIR: the changes made through the mount (tree-changes.sh),
# with 3 MiB of new data in new-big.dat; applied to DIR and to expect/
# alike.
change_tree ()
{
    head -c 3M /dev/urandom > new-big.dat
    apply_tree_changes "$1" new-big.dat
    apply_tree_changes expect new-big.dat
}

# check_image_after WHAT: after the server has stopped, img.qcow2 passes
# qemu-img check, its disk passes e2fsck -fn, and debugfs finds the
# files that change_tree left (expect/) in it.
check_image_after ()
{
    local what=$1
    check_image_fs "$what"
    debugfs -R 'cat /new/big.dat' after.raw > got-big.dat 2>/dev/null
    cmp got-big.dat new-big.dat || fail "$what: debugfs: /new/big.dat differs"
    debugfs -R 'cat /text.txt' after.raw > got-text.txt 2>/dev/null
    cmp got-text.txt expect/text.txt || fail "$what: debugfs: /text.txt differs"
}

# check_image_fs WHAT [IMAGE]: IMAGE (img.qcow2) passes qemu-img check;
# its disk, in after.raw, passes e2fsck -fn, differs from img.raw, and
# holds exactly the files of expect/ as debugfs reads them (by itself,
# without any mount).
check_image_fs ()
{
    local what=$1 image=${2:-img.qcow2}
    qemu-img check "$image" > check.out 2>&1 || { cat check.out; fail "$what: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$what: qemu-img check found problems"; }
    rm -f after.raw
    qemu-img convert -f qcow2 -O raw "$image" after.raw
    e2fsck -fn after.raw > fsck.out 2>&1 || { cat fsck.out; fail "$what: e2fsck -fn found errors"; }
    cmp -s after.raw img.raw && fail "$what: the disk did not change"
    rm -rf dump
    mkdir dump
    debugfs -R 'rdump / dump' after.raw > /dev/null 2>&1 || fail "$what: debugfs rdump failed"
    compare_tree dump "$what: debugfs rdump"
}
