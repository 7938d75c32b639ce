#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Regenerates the seed corpora in corpus-*/ from small qemu-made images.
# Run by hand when the image layouts worth seeding change; the output is
# committed so that make check and the fuzzers need no qemu.
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf corpus-header corpus-image corpus-decode corpus-write
mkdir corpus-header corpus-image corpus-decode corpus-write

n=0
for cs in 512 4096; do
  for comp in zlib zstd; do
    for compat in 0.10 1.1; do
      [ "$comp/$compat" = zstd/0.10 ] && continue
      img=$work/i.qcow2
      qemu-img create -q -f qcow2 -o cluster_size=$cs,compat=$compat,compression_type=$comp "$img" 40k
      qemu-io -f qcow2 -c "write -c -P 0x61 0 $cs" \
        -c "write -P 0x62 $((2 * cs)) $((cs + 100))" \
        -c "write -c -P 0x63 $((8 * cs)) $cs" "$img" >/dev/null
      if [ "$compat" = 1.1 ]; then
        qemu-io -f qcow2 -c "write -z $((5 * cs)) $cs" "$img" >/dev/null
      fi
      n=$((n + 1))
      # Image target: 32 bytes of request parameters, then the image.
      printf '\x01\x02\x03\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > corpus-image/$n
      cat "$img" >> corpus-image/$n
      head -c "$cs" "$img" > corpus-header/$n
      # Write target: 8 operations of 8 bytes (kind, fill byte, offset,
      # length), then the image.
      python3 -c 'import sys
ops = [(0, 0x41, 100, 3000), (1, 0, 2 * 512, 5000), (0, 0x42, 0, 9000),
       (2, 0, 4096, 8192), (3, 0, 0, 0), (0, 0x43, 7000, 20000),
       (4, 0, 0, 40000), (1, 2, 300, 100)]
out = b"".join(bytes([k, f]) + o.to_bytes(4, "big") + l.to_bytes(4, "big")[2:] for k, f, o, l in ops)
sys.stdout.buffer.write(out)' > corpus-write/$n
      cat "$img" >> corpus-write/$n
    done
  done
done

# Decode target: a type byte then a compressed cluster as qemu stores it.
head -c 65536 /usr/share/common-licenses/GPL-3 > "$work/plain"
python3 - "$work/plain" <<'PY'
import sys, zlib
data = open(sys.argv[1], "rb").read()
for bits in (9, 12, 16):
    size = 1 << bits
    chunk = (data * 2)[:size]
    c = zlib.compressobj(6, zlib.DEFLATED, -12)
    raw = c.compress(chunk) + c.flush()
    # type byte: bit 0 = zstd?, the rest picks cluster_bits - 9
    open(f"corpus-decode/zlib-{bits}", "wb").write(bytes([(bits - 9) << 1]) + raw + b"\0" * 300)
PY
for bits in 9 12 16; do
  size=$((1 << bits))
  head -c $size "$work/plain" > "$work/c"
  zstd -q -f -c "$work/c" > "$work/c.zst" 2>/dev/null || continue
  { printf "\\x$(printf %02x $(( ((bits - 9) << 1) | 1 )))"; cat "$work/c.zst"; } > corpus-decode/zstd-$bits
done
# LUKS target: areas from make-luks-seed.c (one iteration, few stripes,
# passphrase "fuzz") for each cipher path, and the header and slot 0 of
# an image qemu-img made.
rm -rf corpus-luks corpus-snapshot
mkdir corpus-luks corpus-snapshot
: > "$work/config.h"
gcc -std=gnu11 -D_GNU_SOURCE -I"$work" -I../../common make-luks-seed.c \
  ../../common/format/luks.c ../../common/format/crypto.c \
  $(pkg-config --cflags --libs gnutls nettle) -o "$work/make-luks-seed"
n=0
while read -r cipher mode key_bytes hash stripes; do
  n=$((n + 1))
  "$work/make-luks-seed" "$cipher" "$mode" "$key_bytes" "$hash" "$stripes" \
    corpus-luks/$n
done <<'SEEDS'
aes xts-plain64 64 sha256 8
aes cbc-essiv:sha256 16 sha1 32
aes xts-essiv:sha256 48 md5 32
serpent xts-plain64 64 sha512 8
twofish ctr-plain 24 sha256 64
cast5 ecb-plain64 16 ripemd160 32
aes cbc-plain 32 sha224 16
SEEDS
bash ../qemu-img-luks.sh create -q -f qcow2 --object secret,id=s0,data=fuzz \
  -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10,encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,encrypt.ivgen-alg=essiv \
  "$work/luks.qcow2" 1M
python3 - "$work/luks.qcow2" corpus-luks/qemu <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
off = struct.unpack(">I", d[100:104])[0]
while True:
    t, n = struct.unpack(">II", d[off:off + 8])
    if t == 0x0537be77:
        area, length = struct.unpack(">QQ", d[off + 8:off + 24])
        break
    off += 8 + (n + 7) // 8 * 8
# The header and slot 0's material (16-byte key, 4000 stripes).
open(sys.argv[2], "wb").write(d[area:area + 4096 + 64000])
PY

# Snapshot target: 16 bytes of image parameters, then the table, from
# images with snapshots made by qemu-img.
n=0
for compat in 0.10 1.1; do
  for cs in 512 65536; do
    img=$work/s.qcow2
    qemu-img create -q -f qcow2 -o compat=$compat,cluster_size=$cs "$img" 1M
    for name in first 2 "with space" "$(printf 'x%.0s' $(seq 1 100))"; do
      qemu-io -f qcow2 -c "write -P 0x42 0 4k" "$img" >/dev/null
      qemu-img snapshot -c "$name" "$img"
    done
    n=$((n + 1))
    python3 - "$img" corpus-snapshot/$n <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
version, bits, size = struct.unpack(">I", d[4:8])[0], struct.unpack(">I", d[20:24])[0], struct.unpack(">Q", d[24:32])[0]
nb, table = struct.unpack(">IQ", d[60:72])
end = table
for _ in range(nb):
    end = (end + 7) // 8 * 8
    id_len, name_len = struct.unpack(">HH", d[end + 12:end + 16])
    extra = struct.unpack(">I", d[end + 36:end + 40])[0]
    end += 40 + extra + id_len + name_len
params = bytes([version - 2, bits - 9]) + struct.pack(">I", nb) + b"\0\0" + struct.pack(">Q", size)
open(sys.argv[2], "wb").write(params + d[table:end])
PY
  done
done

# Image and write targets: images with internal snapshots (fuzz-image
# serves snapshot "1" when bit 0 of its fourth byte is set), so that reads
# of a snapshot and writes that copy shared clusters and L2 tables are
# reached.
for cs in 512 4096; do
  img=$work/snap.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 40k
  qemu-io -f qcow2 -c "write -P 0x61 0 $((3 * cs))" -c "write -P 0x62 $((6 * cs)) $cs" \
    "$img" >/dev/null
  qemu-img snapshot -c one "$img"
  qemu-io -f qcow2 -c "write -P 0x63 $cs $cs" "$img" >/dev/null
  qemu-img snapshot -c two "$img"
  qemu-io -f qcow2 -c "write -P 0x64 $((2 * cs)) 100" "$img" >/dev/null
  printf '\x01\x02\x03\x01\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > corpus-image/snap-$cs
  cat "$img" >> corpus-image/snap-$cs
  python3 -c 'import sys
ops = [(0, 0x41, 100, 3000), (1, 0, 512, 5000), (0, 0x42, 0, 9000),
       (2, 0, 4096, 8192), (3, 0, 0, 0), (0, 0x43, 7000, 20000),
       (4, 0, 0, 40000), (1, 2, 300, 100)]
out = b"".join(bytes([k, f]) + o.to_bytes(4, "big") + l.to_bytes(4, "big")[2:] for k, f, o, l in ops)
sys.stdout.buffer.write(out)' > corpus-write/snap-$cs
  cat "$img" >> corpus-write/snap-$cs
done

# Write target: small qemu-made images with one table entry pointed at
# the image's own metadata (as tests/overlap-shapes.py damages bigger
# ones for test-overlap.sh), and writes where that entry leads: the
# engine must refuse them, and fuzz-write checks that no other guest
# cluster reads differently, at every step.  Compression off (bit 0 of
# the first fill byte clear), so that the first write goes in place.
python3 -c 'import sys
cs = 4096
ops = [(0, 0x40, 0, cs - 1), (0, 0x42, 5 * cs, cs - 1), (3, 0, 0, 0),
       (4, 0, 0, 16 * cs - 1), (0, 0x46, 3 * cs, cs - 1), (1, 0, 6 * cs, cs - 1),
       (3, 0, 0, 0), (4, 0, 0, 16 * cs - 1)]
sys.stdout.buffer.write(b"".join(bytes([k, f]) + o.to_bytes(4, "big") + l.to_bytes(4, "big")[2:] for k, f, o, l in ops))' > "$work/overlap-ops"
for shape in l2-reftable l2-refblock l2-l1 l2-own rt-l1 rt-l2 comp-l1; do
  img=$work/overlap.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=4096 "$img" 64k
  qemu-io -f qcow2 -c "write -P 0x61 0 4k" -c "write -P 0x62 4k 4k" \
    -c "write -P 0x63 8k 4k" -c "write -c -P 0x64 12k 4k" "$img" >/dev/null
  python3 -c 'import struct, sys
COPIED = 1 << 63
path, shape = sys.argv[1], sys.argv[2]
f = open(path, "r+b")
def be64(o):
    f.seek(o)
    return struct.unpack(">Q", f.read(8))[0]
def put64(o, v):
    f.seek(o)
    f.write(struct.pack(">Q", v))
f.seek(0)
h = f.read(104)
bits = struct.unpack(">I", h[20:24])[0]
cs = 1 << bits
l1, rt = struct.unpack(">QQ", h[40:56])
l2 = be64(l1) & 0x00fffffffffffe00
def l2pos(guest): return l2 + 8 * (guest // cs)
if shape.startswith("l2-"):
    put64(l2pos(0), COPIED | {"l2-reftable": rt, "l2-refblock": be64(rt),
                              "l2-l1": l1, "l2-own": l2}[shape])
elif shape.startswith("rt-"):
    put64(rt, {"rt-l1": l1, "rt-l2": l2}[shape])
else:
    e = be64(l2pos(3 * cs))
    x = 62 - (bits - 8)
    put64(l2pos(3 * cs), (e & ~((1 << x) - 1)) | l1)' "$img" "$shape"
  cat "$work/overlap-ops" "$img" > "corpus-write/overlap-$shape"
done

ls corpus-* | wc -l
du -sh corpus-*
