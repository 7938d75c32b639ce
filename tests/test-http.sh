#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The filter over nbdkit's curl plugin, from a real web server (nginx,
# tests/nginx-functions.sh), which cannot write the image: without -r
# the export is read-only all the same (nbdinfo says so), nbdkit says
# why once at start-up, a client's write is refused, and nginx sees
# only GET and HEAD requests; the image
# reads as qemu reads it.  With -r, no warning.  With nbdkit-cow-filter
# between the two, the export is writable: a write into a cluster the
# image has lands in the cow overlay and reads back, one that needs a
# new cluster fails with ENOSPC and a message that names no truncate
# (there is no file to give room to), and the file on the server is
# never changed.  A sequential reader in small requests takes few range
# requests: the bytes are fetched ahead.  qcow2-create over curl is
# refused at start-up.
source "${top_srcdir:-.}/tests/functions.sh"
source "${top_srcdir:-.}/tests/nginx-functions.sh"
requires qemu-img qemu-io nbdinfo nbdcopy sha256sum
requires_nbd_python
nbdkit curl --dump-plugin > /dev/null 2>&1 ||
    skip "nbdkit has no curl plugin (in Debian 12 it is part of the nbdkit package)"

cd "$TMPDIR_TEST"
mkdir -p www
# Two clusters of data (one plain, one compressed), the rest unallocated;
# no room after the last cluster, as qemu-img makes images.
qemu-img create -q -f qcow2 www/disk.qcow2 8M
qemu-io -f qcow2 -c "write -P 0x5a 0 64k" www/disk.qcow2 > /dev/null
qemu-io -f qcow2 -c "write -c -P 0x33 1M 64k" www/disk.qcow2 > /dev/null
qemu-img convert -O raw www/disk.qcow2 disk.raw
sum=$(sha256sum < www/disk.qcow2)
start_test_nginx "$PWD/www" || skip "$NGINX_SKIP"
URL=$NGINX_URL/disk.qcow2
RO="qcow2zstd: warning: the export is read-only: nbdkit's curl plugin cannot write the image (it would send each write as an HTTP PUT, which web servers refuse or take as the whole new file); give -r to say so, or put --filter=cow after --filter=qcow2zstd to keep the writes in its overlay"

# ------------------------------------------------------------ without -r
start_server "$PWD/sock" curl "$URL"
uri=$(nbd_uri "$PWD/sock")
nbdinfo "$uri" > info.out || fail "nbdinfo failed"
grep -q "is_read_only: true" info.out || { cat info.out; fail "without -r: the export is writable"; }
write_errno "$uri" 0 65536 0xee > write.out
grep -q "^errno E\(PERM\|ROFS\)" write.out || { cat write.out; fail "without -r: a write was not refused"; }
nbdcopy "$uri" out.raw || fail "without -r: nbdcopy failed"
stop_server
cmp disk.raw out.raw || fail "without -r: the image reads differently from qemu"
[ "$(grep -c -F -- "$RO" "$PWD/sock.log")" = 1 ] ||
    { cat "$PWD/sock.log"; fail "without -r: not one warning saying the export is read-only"; }
echo "without -r: read-only ($(tr -d '\n' < write.out) for a write), reads as qemu reads it; warned once: $(grep -o "warning: .*" "$PWD/sock.log" | cut -c1-80)..."

# ------------------------------------------------------------ with -r
start_server "$PWD/sock" -r curl "$URL"
nbdinfo "$uri" > info.out || fail "-r: nbdinfo failed"
grep -q "is_read_only: true" info.out || { cat info.out; fail "-r: the export is writable"; }
stop_server
if grep -q "warning" "$PWD/sock.log"; then cat "$PWD/sock.log"; fail "-r: a warning"; fi
echo "with -r: read-only, no warning"

# ------------------------------------------------------------ with cow
start_server "$PWD/sock" --filter=cow curl "$URL"
nbdinfo "$uri" > info.out || fail "cow: nbdinfo failed"
grep -q "is_read_only: false" info.out || { cat info.out; fail "cow: the export is read-only"; }
[ "$(write_errno "$uri" 0 65536 0xc1)" = ok ] || fail "cow: a write into a plain cluster the image has failed"
write_errno "$uri" 0x400000 65536 0xc2 > write.out
nbdcopy "$uri" out.raw || fail "cow: nbdcopy failed"
stop_server
grep -q "^errno ENOSPC" write.out || { cat write.out; fail "cow: a write that needs a new cluster did not fail with ENOSPC"; }
no_room_names_no_file "$PWD/sock.log" cow
if grep -q "warning" "$PWD/sock.log"; then cat "$PWD/sock.log"; fail "cow: a warning"; fi
head -c 65536 /dev/zero | tr '\0' '\301' > expect.raw
tail -c +65537 disk.raw >> expect.raw
cmp expect.raw out.raw || fail "cow: the write does not read back"
echo "with --filter=cow between: writable; a write in place reads back, one that needs room fails with ENOSPC, the message naming no truncate"

# ------------------------------------------------------------ fetch ahead
# A sequential reader in small requests: each connection fetches
# qcow2-request-size of the file ahead in one HTTP request, and the
# reads that follow inside it cost none (paths/fetchahead.h); after the
# first, a thread of the connection's fetches each stretch through a
# second context of the curl plugin while the reads decode the one
# before.  64 MiB of
# clusters half random, half zeros, compressed to about 32 MiB: nbdcopy's
# 256 KiB requests alone would take at least 256 range requests.
/usr/bin/python3 - <<'EOF'
import os
with open("ahead.raw", "wb") as f:
    for _ in range(1024):
        f.write(os.urandom(32768) + bytes(32768))
EOF
qemu-img convert -q -c -f raw -O qcow2 -o compression_type=zstd ahead.raw www/ahead.qcow2
before=$(grep -c '^GET /ahead.qcow2 206 range=bytes=' "$NGINX_ACCESS_LOG" || true)
start_server "$PWD/sock" -r -v -D qcow2zstd.stats=1 curl "$NGINX_URL/ahead.qcow2" \
    qcow2-request-size=1M
nbdcopy "$uri" ahead.out || fail "fetch ahead: nbdcopy failed"
stop_server
cmp ahead.raw ahead.out || fail "fetch ahead: the image reads differently"
ranges=$(( $(grep -c '^GET /ahead.qcow2 206 range=bytes=' "$NGINX_ACCESS_LOG" || true) - before ))
ahead=$(sed -n 's/.* \([0-9]*\) reads from bytes fetched ahead.*/\1/p' "$PWD/sock.log" | tail -n 1)
behind=$(sed -n 's/.* (\([0-9]*\) fetches in the background).*/\1/p' "$PWD/sock.log" | tail -n 1)
[ -n "$ahead" ] && [ "$ahead" -gt 0 ] ||
    { grep stats "$PWD/sock.log"; fail "fetch ahead: no read was served from bytes fetched ahead"; }
[ -n "$behind" ] && [ "$behind" -ge 8 ] ||
    { grep stats "$PWD/sock.log"; fail "fetch ahead: ${behind:-no} fetches in the background, not the 8 or more of 32 MiB in 1 MiB stretches"; }
[ "$ranges" -lt 128 ] ||
    fail "fetch ahead: $ranges range requests for 32 MiB of compressed data in 1 MiB fetches"
echo "fetch ahead: a 64 MiB disk (about 32 MiB compressed) copied in $ranges range requests, $ahead reads served from bytes fetched ahead, $behind stretches fetched in the background"

# ------------------------------------------------------------ qcow2-create
if NBDKIT_TIMEOUT=120 run_nbdkit -U - --filter="$FILTER" curl "$URL" qcow2-create=1M \
    --run 'touch ran' 2> start.err; then
    fail "qcow2-create over curl: nbdkit started"
fi
[ ! -e ran ] || fail "qcow2-create over curl: --run ran"
grep -q "qcow2-create: cannot create an image read-only: nbdkit's curl plugin cannot write the image" start.err ||
    { cat start.err; fail "qcow2-create over curl: no message"; }
echo "qcow2-create over curl: refused at start-up"

stop_nginx
if grep -v -E '^(GET|HEAD) ' "$NGINX_ACCESS_LOG" | grep -q .; then
    cat "$NGINX_ACCESS_LOG"; fail "nginx got requests other than GET and HEAD"
fi
grep -q '^GET /disk.qcow2 206 range=bytes=' "$NGINX_ACCESS_LOG" ||
    { cat "$NGINX_ACCESS_LOG"; fail "nginx served no range request"; }
[ "$(sha256sum < www/disk.qcow2)" = "$sum" ] || fail "the image on the web server changed"
echo "nginx got GET and HEAD requests only ($(grep -c '^GET ' "$NGINX_ACCESS_LOG") GET); the image on the server is unchanged"
