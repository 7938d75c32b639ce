#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The layering check itself (.ci/check-layers.py, make check-layers):
# the engine's includes as they are pass, and an include that points up
# the folder order, or a public header that reaches above base/, fails it
# with a line naming the file and the header.  It runs on a copy of
# common/, so the tree is never touched.
source "${top_srcdir:-.}/tests/functions.sh"

T=$TMPDIR_TEST
check="${top_srcdir:-.}/.ci/check-layers.py"
[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"

fresh_copy ()
{
    rm -rf "$T/tree"
    mkdir -p "$T/tree"
    cp -R "${top_srcdir:-.}/common" "$T/tree/common"
}

# expect_failure FILE WHAT: after the change made to the copy, the check
# fails and says that FILE includes WHAT.
expect_failure ()
{
    local rc=0
    /usr/bin/python3 "$check" --includes-only "$T/tree" > "$T/out" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || { cat "$T/out" >&2; fail "$1 including $2 passed the check"; }
    grep -q -F "common/$1 includes $2" "$T/out" ||
        { cat "$T/out" >&2; fail "the check did not name $1 including $2"; }
    echo "ok: $1 including $2 fails: $(grep -F "common/$1" "$T/out" | head -n 1)"
}

fresh_copy
/usr/bin/python3 "$check" --includes-only "$T/tree" > "$T/out" 2>&1 ||
    { cat "$T/out" >&2; fail "the engine's own includes fail the check"; }
echo "ok: the engine's includes point down"

# One layer up, two layers up, and into the top.
for change in "format/header.c base/pool.h" "base/cache.c meta/map.h" \
              "meta/map.c paths/conn.h" "paths/read.c backing.h"; do
    set -- $change
    fresh_copy
    sed -i "0,/^#include \"/s||#include \"$2\"\n#include \"|" "$T/tree/common/$1"
    expect_failure "$1" "$2"
done

# The interface header may be included from any layer, but itself
# includes only format/ and base/.
fresh_copy
sed -i '0,/^#include "/s||#include "meta/map.h"\n#include "|' "$T/tree/common/qcow2.h"
rc=0
/usr/bin/python3 "$check" --includes-only "$T/tree" > "$T/out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "qcow2.h, the interface every layer may include, includes meta/map.h" "$T/out" ||
    { cat "$T/out" >&2; fail "qcow2.h including meta/map.h was not refused"; }
echo "ok: qcow2.h including meta/map.h fails"

# A layer folder without its README fails too.
fresh_copy
rm "$T/tree/common/paths/README.md"
rc=0
/usr/bin/python3 "$check" --includes-only "$T/tree" > "$T/out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "common/paths/ has no README.md" "$T/out" ||
    { cat "$T/out" >&2; fail "a layer without its README passed"; }
echo "ok: a layer folder without README.md fails"
