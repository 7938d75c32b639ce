#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Replay the fuzz targets' seed corpora (qemu-made images and compressed
# clusters, committed in tests/fuzz/corpus-*) through the engine, plus
# mutated copies of them, so make check runs the fuzz entry points.
source "${top_srcdir:-.}/tests/functions.sh"

for t in header decode image write luks snapshot; do
    prog="$top_builddir/tests/fuzz/fuzz-$t"
    corpus="$top_srcdir/tests/fuzz/corpus-$t"
    [ -x "$prog" ] || fail "$prog is not built"
    # (Without nullglob an empty directory would give one word, the
    # pattern itself.)
    shopt -s nullglob
    files=("$corpus"/*)
    shopt -u nullglob
    [ "${#files[@]}" -gt 0 ] || fail "empty corpus $corpus"

    # Deterministic mutations: flip bytes at several positions, truncate.
    mkdir -p "$TMPDIR_TEST/$t"
    python3 - "$TMPDIR_TEST/$t" "${files[@]}" <<'PY'
import random, sys, os
out = sys.argv[1]
rng = random.Random(42)
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    base = os.path.basename(path)
    for k in range(40):
        m = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            if m:
                m[rng.randrange(len(m))] = rng.randrange(256)
        if k % 5 == 0:
            m = m[:rng.randrange(len(m) + 1)]
        open(os.path.join(out, f"{base}-{k}"), "wb").write(m)
PY
    "$prog" "${files[@]}" "$TMPDIR_TEST/$t"/* | tail -1
    echo "fuzz-$t: seed corpus and mutations replayed"
done
