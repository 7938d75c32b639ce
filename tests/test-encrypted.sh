#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# LUKS-encrypted images (crypt_method 2) through the filter and the plugin,
# qemu as the oracle:
# - images qemu-img made (several ciphers, modes and IV generators, and
#   cluster sizes) read through us equal what qemu reads; written through
#   us by a random workload (writes, zeroes, trims, flushes) they pass
#   qemu-img check and qemu-img compare (with the secret) finds them
#   equal to a raw mirror of the same operations;
# - images made by qcow2-create with qcow2-encrypt-format=luks open in
#   qemu with the same passphrase and hold what was copied in;
# - a wrong or missing passphrase is refused at open (the plugin form: at
#   start-up), saying so, in both forms, and the file is not changed; nbdkit's password conventions
#   (+FILE, -FD); the key slot unlocked once for connections that come one
#   after the other; legacy AES refused with its message; compression
#   with encryption refused with qemu's message.
source "${top_srcdir:-.}/tests/functions.sh"
requires qemu-io nbdcopy nbdinfo
requires_nbd_python

cd "$TMPDIR_TEST"

PASS="correct horse battery"
printf '%s' "$PASS" > pass.txt
SECRET=(--object "secret,id=s0,file=$PWD/pass.txt")

# qemu's options for IMG (qcow2, decrypted with the secret).
qopts ()
{
    echo "driver=qcow2,file.filename=$1,encrypt.key-secret=s0"
}


# check_clean IMG WHAT: qemu-img check finds no error and no leak.
check_clean ()
{
    qemu-img check "${SECRET[@]}" --image-opts "$(qopts "$1")" > check.out 2>&1 || {
        cat check.out; fail "$2: qemu-img check failed"; }
    grep -q "No errors were found" check.out || { cat check.out; fail "$2: qemu-img check found errors"; }
    if grep -qi leak check.out; then cat check.out; fail "$2: leaked clusters"; fi
}

# same_as IMG RAW WHAT: qemu reads the encrypted IMG as RAW.
same_as ()
{
    qemu-img compare -q "${SECRET[@]}" --image-opts "$(qopts "$1")" \
        "driver=raw,file.filename=$2" || fail "$3: qemu reads something else"
}

# The disk: random, text and zero regions, not a multiple of 64 KiB.
mixed_disk base.raw $((5 * 1024 * 1024 + 7 * 512)) 18

# ------------------------------------------------ images qemu-img made
seed=1
while read -r name cs cipher mode ivgen ivhash hash; do
    img=$name.qcow2
    qemu_img_luks convert -O qcow2 "${SECRET[@]}" \
        -o "cluster_size=$cs,encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10" \
        -o "encrypt.cipher-alg=$cipher,encrypt.cipher-mode=$mode,encrypt.ivgen-alg=$ivgen" \
        -o "encrypt.ivgen-hash-alg=$ivhash,encrypt.hash-alg=$hash" base.raw "$img" ||
        fail "$name: qemu-img convert failed"

    # Reading, in both forms.
    rm -f out.raw
    NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file "$img" \
        "qcow2-passphrase=$PASS" --run 'nbdcopy "$uri" out.raw' ||
        fail "$name: the filter did not serve it"
    cmp base.raw out.raw || fail "$name: the filter read wrong data"
    rm -f out.raw
    NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "$PLUGIN" "$img" qcow2-passphrase=+pass.txt \
        --run 'nbdcopy "$uri" out.raw' || fail "$name: the plugin did not serve it"
    cmp base.raw out.raw || fail "$name: the plugin read wrong data"

    # Writing: a random workload, mirrored into a raw file.
    truncate -s +8M "$img"
    cp base.raw mirror.raw
    start_server "$PWD/sock" file "$img" "qcow2-passphrase=$PASS"
    $PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
        mirror.raw "$seed" 3 300 "$cs" > workload.out ||
        { cat workload.out "$PWD/sock.log"; fail "$name: the workload failed"; }
    stop_server
    check_clean "$img" "$name"
    same_as "$img" mirror.raw "$name after writes"
    echo "$name ($cipher-$mode-$ivgen, $cs-byte clusters): read as qemu reads it; after 3 x 300 writes, zeroes and trims check clean and qemu reads the mirror"
    seed=$((seed + 1))
done <<'EOF'
xts 65536 aes-256 xts plain64 sha256 sha256
cbc-essiv 65536 aes-128 cbc essiv sha256 sha1
serpent 4096 serpent-256 xts plain64 sha256 sha512
twofish 512 twofish-128 cbc plain sha256 sha256
EOF

# A write with the plugin form, which grows the file.
img=xts.qcow2
qemu_img_luks convert "${SECRET[@]}" --image-opts "$(qopts $img)" -O raw mirror2.raw
start_nbdkit "$PWD/sock" "$PLUGIN" "$img" "qcow2-passphrase=$PASS"
$PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
    mirror2.raw 40 2 300 65536 > workload.out ||
    { cat workload.out "$PWD/sock.log"; fail "plugin: the workload failed"; }
stop_server
check_clean "$img" "plugin"
same_as "$img" mirror2.raw "plugin after writes"
echo "plugin form: writes to an encrypted image check clean, qemu reads the mirror"

# ------------------------------------------------ images we make
# The plugin creates the file; the filter formats a sparse file.
rm -f ours-plugin.qcow2
NBDKIT_TIMEOUT=120 run_nbdkit -U - "$PLUGIN" ours-plugin.qcow2 qcow2-create=6M \
    qcow2-encrypt-format=luks "qcow2-passphrase=$PASS" qcow2-encrypt-iter-time=50 \
    --run 'nbdcopy base.raw "$uri"' || fail "plugin: qcow2-create with LUKS failed"
truncate -s 12M ours-filter.qcow2
NBDKIT_TIMEOUT=120 run_nbdkit -U - --filter="$FILTER" file ours-filter.qcow2 \
    qcow2-create=6M qcow2-cluster-size=4K qcow2-encrypt-format=luks \
    qcow2-passphrase=+pass.txt qcow2-encrypt-iter-time=50 \
    --run 'nbdcopy base.raw "$uri"' || fail "filter: qcow2-create with LUKS failed"
cp base.raw base6.raw; truncate -s 6M base6.raw
for img in ours-plugin.qcow2 ours-filter.qcow2; do
    qemu-img info "$img" > info.out
    grep -q "encrypted: yes" info.out || { cat info.out; fail "$img: not encrypted"; }
    grep -q "format: luks" info.out || { cat info.out; fail "$img: not LUKS"; }
    grep -q "cipher alg: aes-256" info.out && grep -q "cipher mode: xts" info.out &&
        grep -q "ivgen alg: plain64" info.out ||
        { cat info.out; fail "$img: not aes-256-xts-plain64"; }
    check_clean "$img" "$img"
    same_as "$img" base6.raw "$img"
    # qemu refuses another passphrase.
    if qemu-io --object secret,id=s1,data=wrong --image-opts \
         "driver=qcow2,file.filename=$img,encrypt.key-secret=s1" -c 'read 0 512' \
         > qio.out 2>&1; then
        fail "$img: qemu opened it with a wrong passphrase"
    fi
    grep -qi "Invalid password" qio.out || { cat qio.out; fail "$img: qemu says no password error"; }
    echo "$img: made by qcow2-create, qemu opens it with the passphrase (and not without), check clean, same data"
done
# Our own image again through us, written and read back by qemu.
cp base6.raw mirror3.raw
start_nbdkit "$PWD/sock" "$PLUGIN" ours-plugin.qcow2 "qcow2-passphrase=$PASS"
$PYTHON "$top_srcdir/tests/write-workload.py" "$(nbd_uri "$PWD/sock")" \
    mirror3.raw 50 2 200 65536 > workload.out ||
    { cat workload.out "$PWD/sock.log"; fail "ours: the workload failed"; }
stop_server
check_clean ours-plugin.qcow2 "ours after writes"
same_as ours-plugin.qcow2 mirror3.raw "ours after writes"
echo "our image written again: check clean, qemu reads the mirror"

# ------------------------------------------------ wrong or missing passphrase
# expect_refusal WHAT PATTERN NBDKIT-ARGS...: a client's connection fails,
# the log says PATTERN, the server lives on and the file stays as it was.
expect_refusal ()
{
    local what=$1 pattern=$2 img=xts.qcow2 before
    shift 2
    before=$(md5sum < "$img")
    start_nbdkit "$PWD/sock" "$@"
    if nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1; then
        fail "$what: the client connected"
    fi
    kill -0 "$SERVER_PID" || fail "$what: the server died"
    grep -q -- "$pattern" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$what: no error saying '$pattern'"; }
    stop_server
    [ "$(md5sum < "$img")" = "$before" ] || fail "$what: the image changed"
    echo "$what: refused at open ('$(grep -o -m1 -- "$pattern.*" "$PWD/sock.log" | cut -c1-90)'), file unchanged"
}
expect_refusal "filter, wrong passphrase" "qcow2-passphrase: wrong passphrase" \
    --filter="$FILTER" file xts.qcow2 qcow2-passphrase=wrong
expect_refusal "filter, no passphrase" "give its passphrase with qcow2-passphrase" \
    --filter="$FILTER" file xts.qcow2
# The plugin form opens its file at start-up: nbdkit stops there.
plugin_refusal ()
{
    local what=$1 pattern=$2 before
    shift 2
    before=$(md5sum < xts.qcow2)
    if run_nbdkit -U - "$PLUGIN" xts.qcow2 "$@" --run true > start.out 2>&1; then
        fail "$what: nbdkit started"
    fi
    grep -q -- "$pattern" start.out || { cat start.out; fail "$what: no error saying '$pattern'"; }
    [ "$(md5sum < xts.qcow2)" = "$before" ] || fail "$what: the image changed"
    echo "$what: nbdkit refuses to start ('$(grep -o -m1 -- "$pattern.*" start.out | cut -c1-90)'), file unchanged"
}
plugin_refusal "plugin, wrong passphrase" "qcow2-passphrase: wrong passphrase" \
    qcow2-passphrase=wrong
plugin_refusal "plugin, no passphrase" "give its passphrase with qcow2-passphrase"
expect_refusal "compressed writes" "Compression and encryption not supported at the same time" \
    --filter="$FILTER" file xts.qcow2 "qcow2-passphrase=$PASS" qcow2-compress=true

# The passphrase from a file descriptor (nbdkit's -FD).
rm -f out.raw
NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file serpent.qcow2 \
    qcow2-passphrase=-7 --run 'nbdcopy "$uri" out.raw' 7< pass.txt ||
    fail "qcow2-passphrase=-FD: not served"
qemu_img_luks convert "${SECRET[@]}" --image-opts "$(qopts serpent.qcow2)" -O raw expect.raw
cmp out.raw expect.raw || fail "qcow2-passphrase=-FD: wrong data"
echo "qcow2-passphrase=-FD and =+FILE read the passphrase as nbdkit does"

# Refusals at startup.
refuse_start ()
{
    local what=$1 pattern=$2
    shift 2
    if run_nbdkit -U - --filter="$FILTER" file xts.qcow2 "$@" --run true > start.out 2>&1; then
        fail "$what: nbdkit started"
    fi
    grep -q -- "$pattern" start.out || { cat start.out; fail "$what: no error saying '$pattern'"; }
    echo "$what: refused at startup"
}
refuse_start "compression with encryption at create" \
    "Compression and encryption not supported at the same time" \
    qcow2-create=1M qcow2-encrypt-format=luks qcow2-passphrase=x qcow2-compress=true
refuse_start "encrypt-format without passphrase" "needs the passphrase" \
    qcow2-create=1M qcow2-encrypt-format=luks
refuse_start "encrypt-format other than luks" "only luks" \
    qcow2-create=1M qcow2-encrypt-format=aes qcow2-passphrase=x
refuse_start "encrypt-format without create" "only apply with qcow2-create" \
    qcow2-encrypt-format=luks qcow2-passphrase=x

# A passphrase for an image that is not encrypted is not used, as qemu
# takes encrypt.key-secret for such an image.
qemu-img convert -O qcow2 base.raw plain.qcow2
rm -f out.raw
NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file plain.qcow2 \
    qcow2-passphrase=x --run 'nbdcopy "$uri" out.raw' ||
    fail "plain image with a passphrase: not served"
cmp base.raw out.raw || fail "plain image with a passphrase: wrong data"
echo "a passphrase for an image that is not encrypted: not used, as in qemu"

# ------------------------------------------------ the key slot, once
# Connections one after the other close and open the export's image
# again; only the first unlocks the key slot.
start_server "$PWD/sock" -v -D qcow2zstd.image=1 -r file xts.qcow2 "qcow2-passphrase=$PASS"
for i in 1 2 3; do
    nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null || fail "connection $i failed"
done
stop_server
unlocked=$(grep -c "LUKS key slot 0 unlocked" "$PWD/sock.log" || true)
cached=$(grep -c "LUKS master key from the key cache" "$PWD/sock.log" || true)
[ "$unlocked" = 1 ] || { grep LUKS "$PWD/sock.log"; fail "the key slot was unlocked $unlocked times"; }
[ "$cached" -ge 2 ] || { grep LUKS "$PWD/sock.log"; fail "the key cache served $cached opens"; }
echo "3 connections one after the other: the key slot unlocked once, then $cached opens from the key cache"

# ------------------------------------------------ legacy AES
if qemu-img create -q -f qcow2 --object secret,id=s0,data=x \
       -o encrypt.format=aes,encrypt.key-secret=s0 aes.qcow2 1M 2>/dev/null; then
    before=$(md5sum < aes.qcow2)
    start_server "$PWD/sock" file aes.qcow2 qcow2-passphrase=x
    nbdinfo "$(nbd_uri "$PWD/sock")" > /dev/null 2>&1 && fail "legacy AES: served"
    grep -q "legacy AES method (crypt_method 1" "$PWD/sock.log" ||
        { cat "$PWD/sock.log"; fail "legacy AES: no message saying what it is"; }
    grep -q "encrypt.format=luks" "$PWD/sock.log" || fail "legacy AES: no hint to convert"
    stop_server
    [ "$(md5sum < aes.qcow2)" = "$before" ] || fail "legacy AES: changed"
    echo "legacy AES (crypt_method 1): refused, saying what it is and how to convert it"
else
    skip_section "legacy AES: qemu-img cannot create it"
fi

echo "test-encrypted: all cases passed"
