# shellcheck shell=sh
# The changes made to the files of the test filesystem through a mount
# (see mount-functions.sh): sourced by the test scripts on the host and
# by the guest's test script (busybox sh), so only POSIX sh and commands
# busybox has.
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
