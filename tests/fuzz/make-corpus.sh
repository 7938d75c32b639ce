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
ls corpus-* | wc -l
du -sh corpus-*
