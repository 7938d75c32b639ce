# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=sh
# The changes made to the files of the test filesystem through a mount
# (see mount-functions.sh), and the check of a tree against the sums made
# on the host: sourced by the test scripts on the host and by the test
# guest's scripts (busybox sh), so only POSIX sh and commands busybox
# has.
#
# apply_tree_changes DIR DATA: in DIR, add new/ with a copy of the file
# DATA, a text file and an empty directory; overwrite the middle of a
# file in place and append to it; shrink one file, delete ten, and write
# into the hole of a sparse one.
apply_tree_changes ()
{
    mkdir -p "$1/new/empty"
    cp "$2" "$1/new/big.dat"
    printf 'written through the filter\n%.0s' $(seq 500) > "$1/new/notes.txt"
    printf 'CHANGED IN PLACE' | dd of="$1/text.txt" bs=1 seek=100000 conv=notrunc status=none
    echo "appended line" >> "$1/text.txt"
    truncate -s 1M "$1/bin.dat"
    rm -f "$1"/sub/many/f1?
    printf 'inside the hole' | dd of="$1/sparse.dat" bs=1 seek=500000 conv=notrunc status=none
}

# check_sums DIR SUMS: every file under DIR (lost+found aside) has the
# md5sum that the file SUMS (made by tree_sums, mount-functions.sh) gives
# it, and SUMS names every file.
check_sums ()
{
    (cd "$1" && md5sum -c "$2") > /tmp/check_sums.out 2>&1 ||
        { grep -v ': OK$' /tmp/check_sums.out | head -n 20; echo "$1: files differ from $2"; return 1; }
    (cd "$1" && find . -path ./lost+found -prune -o -type f -print | sort) > /tmp/check_sums.have
    sed 's/^[0-9a-f]*  //' "$2" | sort > /tmp/check_sums.want
    diff /tmp/check_sums.want /tmp/check_sums.have ||
        { echo "$1: other files than in $2"; return 1; }
    echo "$1: $(wc -l < /tmp/check_sums.want) files match $2"
}
