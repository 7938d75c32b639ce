#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Over a plugin that cannot flush (tests/noflush-filter.c over the file
# plugin), the filter offers its clients neither flush nor FUA, says once
# (without -v) that the image's crash safety is then the plugin's, and
# still writes correctly: qemu-img check is clean and qemu reads back
# what was written.  Over the same plugin with flush, both are offered
# and nothing is said.
source "${top_srcdir:-.}/tests/functions.sh"
requires nbdinfo qemu-io
requires_nbd_python
: "${NOFLUSH_FILTER:=$top_builddir/tests/.libs/nbdkit-noflush-filter.so}"
[ -f "$NOFLUSH_FILTER" ] || fail "the test filter is not built: $NOFLUSH_FILTER"

cd "$TMPDIR_TEST"
SAID="qcow2zstd: warning: the plugin cannot flush, so neither flush nor FUA is offered to clients: the image's crash safety is the plugin's"

# offers URI FLUSH FUA: what nbdinfo says the export offers.
offers ()
{
    nbdinfo --json "$1" > info.json
    "$PYTHON" - "$2" "$3" <<'EOF'
import json, sys
e = json.load(open("info.json"))["exports"][0]
want = {"can_flush": sys.argv[1] == "yes", "can_fua": sys.argv[2] == "yes",
        "is_read_only": False}
got = {k: e[k] for k in want}
if got != want:
    sys.exit(f"nbdinfo: {got}, expected {want}")
EOF
}

qemu-img create -q -f qcow2 img.qcow2 16M
qemu-io -f qcow2 -c "write -P 0x11 0 1M" img.qcow2 > /dev/null
truncate -s +4M img.qcow2

# ------------------------------------------------------------ with flush
start_server "$PWD/a.sock" file img.qcow2
offers "$(nbd_uri "$PWD/a.sock")" yes yes || fail "over a plugin that flushes"
stop_server
! grep -q "plugin cannot flush" a.sock.log || fail "over a plugin that flushes: $(cat a.sock.log)"
echo "over the file plugin: flush and FUA offered, nothing said"

# ------------------------------------------------------------ without
start_server "$PWD/a.sock" --filter="$NOFLUSH_FILTER" file img.qcow2
uri=$(nbd_uri "$PWD/a.sock")
offers "$uri" no no || fail "over a plugin that cannot flush"
# Written on two connections, one after the other: partial and whole
# clusters, new clusters and in place, a zero and a trim.
"$PYTHON" - "$uri" <<'EOF'
import nbd, sys
for _ in range(2):
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    h.pwrite(b"\x22" * 70000, 100000)
    h.pwrite(b"\x33" * 65536, 2 << 20)
    h.pwrite(b"\x44" * 512, 3 << 20)
    h.zero(65536, 4 << 20)
    h.trim(65536, 5 << 20)
    assert h.pread(70000, 100000) == b"\x22" * 70000
    h.shutdown()
EOF
stop_server
n=$(grep -c "$SAID" a.sock.log || true)
[ "$n" = 1 ] || { cat a.sock.log; fail "the warning was logged $n times, not once"; }
qemu-img check -q img.qcow2 || fail "qemu-img check after writes over a plugin that cannot flush"
qemu-io -r -f qcow2 -c "read -P 0x11 0 100000" -c "read -P 0x22 100000 70000" \
    -c "read -P 0x11 170000 $(( (1 << 20) - 170000 ))" -c "read -P 0x33 2M 64k" \
    -c "read -P 0x44 3M 512" -c "read -P 0 $(( (3 << 20) + 512 )) $(( (1 << 20) - 512 ))" \
    -c "read -P 0 5M 64k" img.qcow2 > read.out ||
    { cat read.out; fail "qemu does not read what was written"; }
! grep -q "Pattern verification failed" read.out || { cat read.out; fail "qemu reads other data"; }
echo "over a plugin that cannot flush: neither flush nor FUA offered; said once: $(grep -o "the plugin cannot flush.*" a.sock.log | cut -c1-80)...; qemu-img check clean, qemu reads the writes"
