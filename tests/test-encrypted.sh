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
# - a wrong or missing passphrase is refused at start-up in both forms
#   (nbdkit exits before serving; the filter over nbdkit's file plugin
#   with file=), and at the first client where the filter learns the file
#   only then (dir=), saying so, and the file is not changed;
#   nbdkit's password conventions (+FILE, -FD); an image whose passphrase
#   file qemu read as echo wrote it (with a newline) served with one
#   warning, and a wrong passphrase for it refused with a hint that names
#   the newline; the key slot unlocked once for connections that come one
#   after the other; a passphrase in key slot 3 (qemu-img amend), beside
#   slot 0 and alone; legacy AES refused with its message; compression
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
qemu-img convert "${SECRET[@]}" --image-opts "$(qopts $img)" -O raw mirror2.raw
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
# expect_refusal WHAT PATTERN NBDKIT-ARGS...: with dir=, the filter
# learns the file when a client names the export: that client's
# connection fails, the log says PATTERN, the server lives on and the
# file stays as it was.
expect_refusal ()
{
    local what=$1 pattern=$2 img=xts.qcow2 before
    shift 2
    before=$(md5sum < "$img")
    start_nbdkit "$PWD/sock" "$@"
    if nbdinfo "nbd+unix:///$img?socket=$PWD/sock" > /dev/null 2>&1; then
        fail "$what: the client connected"
    fi
    kill -0 "$SERVER_PID" || fail "$what: the server died"
    grep -q -- "$pattern" "$PWD/sock.log" || { cat "$PWD/sock.log"; fail "$what: no error saying '$pattern'"; }
    stop_server
    [ "$(md5sum < "$img")" = "$before" ] || fail "$what: the image changed"
    echo "$what: refused at open ('$(grep -o -m1 -- "$pattern.*" "$PWD/sock.log" | cut -c1-90)'), file unchanged"
}
expect_refusal "filter with dir=, wrong passphrase" "qcow2-passphrase: wrong passphrase" \
    --filter="$FILTER" file dir="$PWD" qcow2-passphrase=wrong
expect_refusal "filter with dir=, no passphrase" "give its passphrase with qcow2-passphrase" \
    --filter="$FILTER" file dir="$PWD"
# startup_refusal WHAT PATTERN PARAMS...: both forms open the file at
# start-up: nbdkit stops there, before serving (its --run command never
# runs), and the file stays as it was.
startup_refusal ()
{
    local what=$1 pattern=$2 before form
    shift 2
    before=$(md5sum < xts.qcow2)
    for form in filter plugin; do
        if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
        rm -f ran
        if run_nbdkit -U - "${args[@]}" xts.qcow2 "$@" --run 'touch ran' > start.out 2>&1; then
            fail "$form, $what: nbdkit started"
        fi
        [ ! -e ran ] || fail "$form, $what: --run ran"
        grep -q -- "$pattern" start.out || { cat start.out; fail "$form, $what: no error saying '$pattern'"; }
        [ "$(md5sum < xts.qcow2)" = "$before" ] || fail "$form, $what: the image changed"
        echo "$form, $what: nbdkit refuses to start ('$(grep -o -m1 -- "$pattern.*" start.out | cut -c1-90)'), file unchanged"
    done
}
startup_refusal "wrong passphrase" "qcow2-passphrase: wrong passphrase" \
    qcow2-passphrase=wrong
startup_refusal "no passphrase" "give its passphrase with qcow2-passphrase"
startup_refusal "compressed writes" "Compression and encryption not supported at the same time" \
    "qcow2-passphrase=$PASS" qcow2-compress=true

# The passphrase from a file descriptor (nbdkit's -FD).
rm -f out.raw
NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file serpent.qcow2 \
    qcow2-passphrase=-7 --run 'nbdcopy "$uri" out.raw' 7< pass.txt ||
    fail "qcow2-passphrase=-FD: not served"
qemu-img convert "${SECRET[@]}" --image-opts "$(qopts serpent.qcow2)" -O raw expect.raw
cmp out.raw expect.raw || fail "qcow2-passphrase=-FD: wrong data"
echo "qcow2-passphrase=-FD and =+FILE read the passphrase as nbdkit does"

# ------------------------------------------------ a passphrase file made by echo
# qemu's secret,file= reads the file whole, newline and all; nbdkit's
# +FILE drops the newline.  The passphrase that fails as given is tried
# once more with the newline: served, with one warning saying why, in
# both forms and for every form of the passphrase; a wrong one is still
# refused, and the message names the newline.
if section echo-newline; then
    echo "$PASS" > echo-pass.txt
    ECHO_SECRET=(--object "secret,id=s0,file=$PWD/echo-pass.txt")
    qemu_img_luks convert -O qcow2 "${ECHO_SECRET[@]}" \
        -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
        base.raw echo.qcow2 || fail "echo newline: qemu-img convert failed"
    # qemu opens it with the file echo wrote, and not with the passphrase
    # without the newline: the newline is part of the image's passphrase.
    qemu-io "${ECHO_SECRET[@]}" --image-opts \
        "driver=qcow2,file.filename=echo.qcow2,encrypt.key-secret=s0" -c 'read 0 512' \
        > qio.out 2>&1 || { cat qio.out; fail "echo newline: qemu cannot open it with its file"; }
    if qemu-io "${SECRET[@]}" --image-opts "$(qopts echo.qcow2)" -c 'read 0 512' \
           > qio.out 2>&1; then
        fail "echo newline: qemu opened it without the newline"
    fi
    before=$(md5sum < echo.qcow2)
    W="qcow2zstd: warning: .*qcow2-passphrase: unlocked with a newline added: the image's passphrase ends with one"
    for form in filter plugin; do
        for given in +echo-pass.txt "$PASS" -7; do
            rm -f out.raw
            if [ $form = filter ]; then
                args=(--filter="$FILTER" file echo.qcow2)
            else
                args=("$PLUGIN" echo.qcow2)
            fi
            # Two clients: the key comes from the cache for the second,
            # and the warning is given once.
            NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "${args[@]}" "qcow2-passphrase=$given" \
                --run 'nbdinfo "$uri" > /dev/null && nbdcopy "$uri" out.raw' \
                7< echo-pass.txt 2> serve.err ||
                { cat serve.err; fail "echo newline, $form, $given: not served"; }
            cmp base.raw out.raw || fail "echo newline, $form, $given: wrong data"
            [ "$(grep -c -- "$W" serve.err)" = 1 ] ||
                { cat serve.err; fail "echo newline, $form, $given: not one warning"; }
        done
        echo "echo newline, $form: served with +FILE, the value and -FD, one warning: $(grep -o "qcow2zstd: warning: .*" serve.err | sed "s|$PWD/||")"
    done
    # The passphrase as qemu read it, given exactly, needs no warning.
    rm -f out.raw
    NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "$PLUGIN" echo.qcow2 "qcow2-passphrase=$PASS"$'\n' \
        --run 'nbdcopy "$uri" out.raw' 2> serve.err ||
        { cat serve.err; fail "echo newline, given exactly: not served"; }
    cmp base.raw out.raw || fail "echo newline, given exactly: wrong data"
    if grep -q "warning" serve.err; then cat serve.err; fail "echo newline, given exactly: a warning"; fi
    # A wrong passphrase: refused in both forms, and the message names
    # the newline difference.
    H="wrong passphrase: it unlocks none of the image's 1 active LUKS key slot, nor with a newline added (qemu's secret,file= keeps the final newline of a passphrase file"
    for form in filter plugin; do
        if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
        if run_nbdkit -U - "${args[@]}" echo.qcow2 qcow2-passphrase=wrong --run true > start.out 2>&1; then
            fail "echo newline, $form: a wrong passphrase started"
        fi
        grep -q -- "$H" start.out || { cat start.out; fail "echo newline, $form: no hint"; }
    done
    [ "$(md5sum < echo.qcow2)" = "$before" ] || fail "echo newline: the image changed"
    echo "echo newline, wrong passphrase: $(grep -o "error: .*" start.out | sed "s|$PWD/||")"
fi

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

# ------------------------------------------------ other key slots
# qemu-img amend moves the passphrase around the key slots: every slot
# must be tried, not only the first.  A second passphrase in slot 3
# beside slot 0; then slot 0 removed, so that slot 3 alone opens it.
# Both forms read the image with each passphrase that opens it, and
# refuse the one that no longer does.
if section key-slots; then
    printf 'second slot' > pass2.txt
    SECRET2=(--object "secret,id=s1,file=$PWD/pass2.txt")
    cp xts.qcow2 slots.qcow2
    qemu-img convert "${SECRET[@]}" --image-opts "$(qopts slots.qcow2)" -O raw slots.raw
    # serve_with PASSFILE: both forms read slots.qcow2 as slots.raw.
    serve_with ()
    {
        local form
        for form in filter plugin; do
            rm -f out.raw
            if [ $form = filter ]; then
                NBDKIT_TIMEOUT=120 run_nbdkit -U - -r --filter="$FILTER" file slots.qcow2 \
                    "qcow2-passphrase=+$1" --run 'nbdcopy "$uri" out.raw' ||
                    fail "key slots, $form: the passphrase of $1 did not open it"
            else
                NBDKIT_TIMEOUT=120 run_nbdkit -U - -r "$PLUGIN" slots.qcow2 \
                    "qcow2-passphrase=+$1" --run 'nbdcopy "$uri" out.raw' ||
                    fail "key slots, $form: the passphrase of $1 did not open it"
            fi
            cmp slots.raw out.raw || fail "key slots, $form: wrong data with $1"
        done
    }
    qemu_img_luks amend "${SECRET[@]}" "${SECRET2[@]}" --image-opts "$(qopts slots.qcow2)" \
        -o encrypt.state=active,encrypt.new-secret=s1,encrypt.keyslot=3,encrypt.iter-time=10 ||
        fail "key slots: qemu-img amend could not add slot 3"
    serve_with pass.txt
    serve_with pass2.txt
    qemu_img_luks amend "${SECRET[@]}" "${SECRET2[@]}" \
        --image-opts "driver=qcow2,file.filename=slots.qcow2,encrypt.key-secret=s1" \
        -o encrypt.state=inactive,encrypt.old-secret=s0 ||
        fail "key slots: qemu-img amend could not remove slot 0"
    qemu-img info slots.qcow2 > info.out
    [ "$(grep -c 'active: true' info.out)" = 1 ] || { cat info.out; fail "key slots: not one slot left"; }
    serve_with pass2.txt
    before=$(md5sum < slots.qcow2)
    for form in filter plugin; do
        if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
        if run_nbdkit -U - "${args[@]}" slots.qcow2 qcow2-passphrase=+pass.txt --run true > start.out 2>&1; then
            fail "key slots, $form: the removed passphrase opened it"
        fi
        grep -q "wrong passphrase" start.out || { cat start.out; fail "key slots, $form: no message"; }
    done
    [ "$(md5sum < slots.qcow2)" = "$before" ] || fail "key slots: the refused open changed the file"
    echo "key slots: a passphrase in slot 3 beside slot 0 opens in both forms, and alone after slot 0 is removed; the removed one is refused"
fi

# ------------------------------------------------ legacy AES
if qemu-img create -q -f qcow2 --object secret,id=s0,data=x \
       -o encrypt.format=aes,encrypt.key-secret=s0 aes.qcow2 1M 2>/dev/null; then
    before=$(md5sum < aes.qcow2)
    for form in filter plugin; do
        if [ $form = filter ]; then args=(--filter="$FILTER" file); else args=("$PLUGIN"); fi
        if run_nbdkit -U - "${args[@]}" aes.qcow2 qcow2-passphrase=x --run true > start.out 2>&1; then
            fail "legacy AES, $form: served"
        fi
        grep -q "legacy AES method (crypt_method 1" start.out ||
            { cat start.out; fail "legacy AES, $form: no message saying what it is"; }
        grep -q "encrypt.format=luks" start.out || fail "legacy AES, $form: no hint to convert"
    done
    [ "$(md5sum < aes.qcow2)" = "$before" ] || fail "legacy AES: changed"
    echo "legacy AES (crypt_method 1): refused at start-up in both forms, saying what it is and how to convert it"
else
    skip_section "legacy AES: qemu-img cannot create it"
fi

echo "test-encrypted: all cases passed"
