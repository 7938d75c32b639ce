#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build (or reuse) the benchmark images under $BENCH_DIR/{full,quick}/:
#
#   raw.img        ext4 made by mke2fs -d from a staging copy of files on
#                  this machine: binaries (/usr/bin, /usr/sbin), shared
#                  libraries (/usr/lib/x86_64-linux-gnu, llvm, gcc) and
#                  text/data (/usr/share), each taken in sorted path order
#                  up to a quota, so the mix is the same on every run.
#   zlib.qcow2     qemu-img convert -c -O qcow2 -o cluster_size=64k,compression_type=zlib
#   zstd.qcow2     the same with compression_type=zstd
#   raw.md5        checksum of raw.img, for the correctness checks
#
# Full: ~1.7 GiB of files in a 2 GiB filesystem.  BENCH_QUICK=1: ~190 MiB
# in 256 MiB.  Images are reused while $IMG_DIR/stamp matches the recipe.
#
# Usage: bench/make-image.sh        (or sourced by bench-read.sh)

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Bump when anything below changes what ends up in the images.
IMAGE_RECIPE=2

# Sources and quotas in MiB (full size).  The quick image takes 1/9.
IMAGE_SOURCES=(
    "bin   330 /usr/bin /usr/sbin"
    "lib   700 /usr/lib/x86_64-linux-gnu"
    "tool  250 /usr/lib/gcc /usr/lib/llvm-14"
    "share 450 /usr/share"
)
if [ "$BENCH_QUICK" = 1 ]; then
    IMAGE_SCALE_DIV=9
    IMAGE_FS_MIB=256
else
    IMAGE_SCALE_DIV=1
    IMAGE_FS_MIB=2048
fi
# Single files above this are skipped (keeps one huge file from taking a
# whole quota).
IMAGE_MAX_FILE=$((128 * 1024 * 1024))

image_stamp ()
{
    printf 'recipe=%s fs=%s div=%s max=%s sources=%s host=%s\n' \
        "$IMAGE_RECIPE" "$IMAGE_FS_MIB" "$IMAGE_SCALE_DIV" "$IMAGE_MAX_FILE" \
        "${IMAGE_SOURCES[*]}" "$(hostname)"
}

images_ready ()
{
    [ -f "$IMG_DIR/stamp" ] && [ -f "$RAW_IMG" ] && [ -f "$IMG_DIR/raw.md5" ] &&
        [ -f "$IMG_DIR/qcow2.stat" ] &&
        [ -f "$IMG_DIR/zlib.qcow2" ] && [ -f "$IMG_DIR/zstd.qcow2" ] &&
        [ "$(cat "$IMG_DIR/stamp")" = "$(image_stamp)" ]
}

# Print the list of files (NUL separated, absolute paths) for the staging
# copy: for each source, regular files in sorted path order until the
# quota is reached (a file that would overflow it is skipped and the walk
# goes on, so the quota fills up).
select_files ()
{
    local line quota dirs
    for line in "${IMAGE_SOURCES[@]}"; do
        read -r _ quota dirs <<<"$line"
        quota=$((quota * 1024 * 1024 / IMAGE_SCALE_DIV))
        # shellcheck disable=SC2086
        find $dirs -xdev -type f -readable ! -name '*
*' -printf '%s\t%p\n' 2>/dev/null |
            sort -t "$(printf '\t')" -k2,2 |
            awk -F '\t' -v q="$quota" -v max="$IMAGE_MAX_FILE" '
                $1 > max || sum + $1 > q { next }
                { sum += $1; printf "%s%c", $2, 0 }'
    done
}

build_images ()
{
    local staging=$IMG_DIR/staging tmp=$IMG_DIR/tmp nfiles data_mib \
          need_mib fs_mib ninodes t0
    mkdir -p "$IMG_DIR"
    rm -rf "$staging" "$tmp"
    mkdir -p "$staging" "$tmp"

    msg "image: selecting files ($BENCH_VARIANT)"
    select_files > "$tmp/files"
    nfiles=$(tr -cd '\0' < "$tmp/files" | wc -c)
    msg "image: copying $nfiles files into $staging"
    # tar keeps the directory layout (usr/bin/..., usr/share/...) and the
    # modes; --no-recursion because the list names files only;
    # --hard-dereference so that every selected file holds its own data.
    tar -C / --null --no-recursion --hard-dereference \
            -T <(sed -z 's|^/||' "$tmp/files") -cf - |
        tar -C "$staging" -xf -
    data_mib=$(du -sm --apparent-size "$staging" | cut -f1)
    need_mib=$(du -sm "$staging" | cut -f1)
    ninodes=$(find "$staging" | wc -l)
    # Room for the data (4 KiB blocks, plus extent blocks), the inode
    # tables, the journal (16 MiB below 1 GiB, 64 MiB up to 128 GiB) and
    # the rest of the metadata; grow the filesystem if the files need it.
    fs_mib=$IMAGE_FS_MIB
    local min_mib=$((need_mib + need_mib / 32 + ninodes * 320 / 1048576 + 24))
    if [ "$fs_mib" -ge 1024 ]; then min_mib=$((min_mib + 64)); else min_mib=$((min_mib + 16)); fi
    if [ "$min_mib" -gt "$fs_mib" ]; then
        fs_mib=$min_mib
    fi
    msg "image: $data_mib MiB in $ninodes files/dirs; mke2fs -t ext4 ${fs_mib}M"
    # Fixed UUID, hash seed and time make the filesystem metadata the same
    # from build to build (the data placement follows mke2fs's walk).
    rm -f "$tmp/raw.img"
    E2FSPROGS_FAKE_TIME=1700000000 \
        mke2fs -q -t ext4 -F -d "$staging" \
            -N $((ninodes + ninodes / 4 + 1024)) \
            -U 5f1c0a2e-6b3d-4c8e-9a71-0b2c3d4e5f60 \
            -E hash_seed=0d1e2f30-4152-6374-8596-a7b8c9dae0f1 \
            "$tmp/raw.img" "${fs_mib}M" >&2
    rm -rf "$staging"

    t0=$(now)
    msg "image: qemu-img convert -c (zlib)"
    qemu-img convert -c -O qcow2 -o cluster_size=64k,compression_type=zlib \
        "$tmp/raw.img" "$tmp/zlib.qcow2"
    msg "image: qemu-img convert -c (zstd)"
    qemu-img convert -c -O qcow2 -o cluster_size=64k,compression_type=zstd \
        "$tmp/raw.img" "$tmp/zstd.qcow2"
    msg "image: converted in $(fmt 1 "$(calc "$(now) - $t0")") s"
    md5sum < "$tmp/raw.img" | cut -d' ' -f1 > "$tmp/raw.md5"

    mv -f "$tmp/raw.img" "$RAW_IMG"
    mv -f "$tmp/zlib.qcow2" "$tmp/zstd.qcow2" "$tmp/raw.md5" "$IMG_DIR/"
    printf '%s\n' "$data_mib" > "$IMG_DIR/data-mib"
    mv -f "$tmp/files" "$IMG_DIR/files"
    rmdir "$tmp"
    record_qcow2_stat
    image_stamp > "$IMG_DIR/stamp"
}

# Size and mtime of the qcow2 images, to notice a server changing them.
record_qcow2_stat ()
{
    local img
    for img in zlib zstd; do
        printf '%s %s\n' "$img" "$(stat -c '%s %Y' "$IMG_DIR/$img.qcow2")"
    done > "$IMG_DIR/qcow2.stat"
}

ensure_images ()
{
    need_cmds mke2fs qemu-img md5sum tar
    if images_ready; then
        msg "image: reusing cached images in $IMG_DIR"
    else
        build_images
    fi
}

# Print sizes and compression ratios.
print_images ()
{
    local vsize raw_alloc f fsize
    vsize=$(stat -c %s "$RAW_IMG")
    raw_alloc=$(( $(stat -c %b "$RAW_IMG") * $(stat -c %B "$RAW_IMG") ))
    printf 'Images (%s): %s\n' "$BENCH_VARIANT" "$IMG_DIR"
    printf '  files copied into the filesystem: %s MiB (%s files, %s)\n' \
        "$(cat "$IMG_DIR/data-mib" 2>/dev/null || echo '?')" \
        "$(tr -cd '\0' < "$IMG_DIR/files" | wc -c)" \
        "$(for l in "${IMAGE_SOURCES[@]}"; do printf '%s ' "${l%% *}"; done | sed 's/ $//; s/ /+/g')"
    printf '  %-11s %10s %10s %13s %13s\n' image "size MiB" "alloc MiB" "virt/size" "alloc/size"
    printf '  %-11s %10s %10s %13s %13s\n' raw.img \
        "$(fmt 1 "$(calc "$vsize / 1048576")")" \
        "$(fmt 1 "$(calc "$raw_alloc / 1048576")")" "1.00" "1.00"
    for f in zlib.qcow2 zstd.qcow2; do
        fsize=$(stat -c %s "$IMG_DIR/$f")
        printf '  %-11s %10s %10s %13s %13s\n' "$f" \
            "$(fmt 1 "$(calc "$fsize / 1048576")")" \
            "$(fmt 1 "$(calc "$(stat -c %b "$IMG_DIR/$f") * $(stat -c %B "$IMG_DIR/$f") / 1048576")")" \
            "$(fmt 2 "$(ratio "$vsize" "$fsize")")" \
            "$(fmt 2 "$(ratio "$raw_alloc" "$fsize")")"
    done
    printf '  (virt/size = virtual disk / qcow2 file; alloc/size = allocated blocks of raw.img / qcow2 file)\n'
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    ensure_images
    print_images
fi
