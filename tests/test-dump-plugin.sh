#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit --dump-plugin with the filter: the filter's own lines (its
# version, codecs and their versions) and the plugin's usual lines; the
# plugin form's dump, with the same version in its version= line and its
# own; --help lists every qcow2-* parameter; and the codec lines appear
# only when dumping.
source "${top_srcdir:-.}/tests/functions.sh"

T=$TMPDIR_TEST

# ------------------------------------------------------------ --dump-plugin
rc=0
run_nbdkit --dump-plugin --filter="$FILTER" null >"$T/dump.out" 2>"$T/dump.err" || rc=$?
if [ "$rc" -ne 0 ]; then
    cat "$T/dump.err" >&2
    fail "nbdkit --dump-plugin --filter=... null exited with $rc"
fi

# has_line LINE: exactly one line of the dump is LINE.
has_line ()
{
    local n
    n=$(grep -c -x -F -- "$1" "$T/dump.out" || true)
    [ "$n" = 1 ] || {
        cat "$T/dump.out" >&2
        fail "--dump-plugin: expected the line '$1' once, found it $n times"
    }
}
# line_of KEY: the value of the one KEY=... line of the dump.
line_of ()
{
    local n
    n=$(grep -c "^$1=" "$T/dump.out" || true)
    [ "$n" = 1 ] || {
        cat "$T/dump.out" >&2
        fail "--dump-plugin: expected one '$1=' line, found $n"
    }
    sed -n "s/^$1=//p" "$T/dump.out"
}

has_line "qcow2zstd_codecs=zlib,zstd"
echo "ok: qcow2zstd_codecs=zlib,zstd"

# The version: the build's (config.h), else configure.ac's AC_INIT.
config_h="${top_builddir:-.}/config.h"
if [ -f "$config_h" ]; then
    want_version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$config_h")
else
    want_version=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([^]]*\)\].*/\1/p' \
        "${top_srcdir:-.}/configure.ac")
fi
[ -n "$want_version" ] || fail "cannot tell which version this build is"
has_line "qcow2zstd_version=$want_version"
# nbdkit's own version= line is nbdkit's (a filter has no other).
[ "$(line_of version)" = "$(nbdkit --version | sed 's/^nbdkit //')" ] ||
    fail "version= is not nbdkit's version"
echo "ok: qcow2zstd_version=$want_version, beside nbdkit's version=$(line_of version)"

versions=$(line_of qcow2zstd_codec_versions)
decoder=$(line_of qcow2zstd_deflate_decoder)

# Each version is a dotted number, and each codec appears once.
for codec in zlib zstd; do
    [ "$(grep -o -E "(^| )$codec=[0-9]+(\.[0-9]+)+( |$)" <<<"$versions" | wc -l)" = 1 ] ||
        fail "qcow2zstd_codec_versions: no single '$codec=VERSION' in '$versions'"
done

# libdeflate is listed exactly when the filter uses it, and the build's
# config.h (when there is one) agrees.
case "$decoder" in
    libdeflate)
        grep -q -E "(^| )libdeflate=[0-9]+(\.[0-9]+)+( |$)" <<<"$versions" ||
            fail "the deflate decoder is libdeflate but '$versions' has no libdeflate version"
        ;;
    zlib)
        if grep -q libdeflate <<<"$versions"; then
            fail "the deflate decoder is zlib but '$versions' mentions libdeflate"
        fi
        ;;
    *)
        fail "qcow2zstd_deflate_decoder: unexpected value '$decoder'"
        ;;
esac
if [ -f "$config_h" ]; then
    if grep -q '^#define HAVE_LIBDEFLATE 1' "$config_h"; then
        [ "$decoder" = libdeflate ] ||
            fail "config.h has HAVE_LIBDEFLATE but the decoder is '$decoder'"
    else
        [ "$decoder" = zlib ] ||
            fail "config.h has no HAVE_LIBDEFLATE but the decoder is '$decoder'"
    fi
fi

# The versions are those of the libraries on this machine, when
# pkg-config knows them.
if command -v pkg-config >/dev/null 2>&1; then
    for pair in zlib:zlib zstd:libzstd libdeflate:libdeflate; do
        codec=${pair%%:*} pc=${pair#*:}
        got=$(grep -o -E "(^| )$codec=[^ ]+" <<<"$versions" | sed "s/.*=//" || true)
        [ -n "$got" ] || continue
        want=$(pkg-config --modversion "$pc" 2>/dev/null || true)
        [ -n "$want" ] || continue
        [ "$got" = "$want" ] ||
            fail "qcow2zstd_codec_versions says $codec=$got but pkg-config says $want"
    done
fi
echo "ok: qcow2zstd_codec_versions=$versions (deflate decoder: $decoder)"

# The usual plugin lines are still there.
has_line "name=null"
line_of version >/dev/null
line_of api_version >/dev/null
grep -q '^path=.*null' "$T/dump.out" || fail "--dump-plugin: no path= line for the null plugin"
echo "ok: plugin lines (name=null, version=$(line_of version))"

# The plugin form: its version= line and its own line, both this build's.
run_nbdkit --dump-plugin "$PLUGIN" >"$T/dump.out" 2>"$T/dump.err" ||
    { cat "$T/dump.err" >&2; fail "nbdkit --dump-plugin PLUGIN failed"; }
has_line "name=qcow2zstd"
has_line "version=$want_version"
has_line "qcow2zstd_version=$want_version"
has_line "qcow2zstd_codecs=zlib,zstd"
echo "ok: the plugin: version=$want_version and qcow2zstd_version=$want_version"

# Without the filter there are no qcow2zstd lines.
run_nbdkit --dump-plugin null >"$T/plain.out" 2>/dev/null ||
    fail "nbdkit --dump-plugin null failed"
if grep -q qcow2zstd "$T/plain.out"; then
    fail "qcow2zstd lines without the filter"
fi
grep -q -x 'name=null' "$T/plain.out" || fail "nbdkit --dump-plugin null: no name=null"

# Serving (not dumping) prints nothing on stdout.
run_nbdkit -U - --filter="$FILTER" null size=1M --run true \
    >"$T/run.out" 2>"$T/run.err" || {
    cat "$T/run.err" >&2
    fail "nbdkit --filter=... null --run true failed"
}
if [ -s "$T/run.out" ]; then
    cat "$T/run.out" >&2
    fail "the filter printed on stdout while serving"
fi
echo "ok: codec lines only with --dump-plugin"

# ------------------------------------------------------------ --help
rc=0
run_nbdkit --filter="$FILTER" null --help >"$T/help.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "nbdkit --filter=... null --help exited with $rc"
for p in qcow2-threads qcow2-request-size qcow2-l2-cache-size qcow2-cluster-cache-size
do
    grep -q -E "^$p=[A-Z]+ " "$T/help.out" || {
        cat "$T/help.out" >&2
        fail "--help does not describe $p"
    }
done
grep -q 'qcow2zstd' "$T/help.out" || fail "--help does not name the filter"
echo "ok: --help describes qcow2-threads, qcow2-request-size, qcow2-l2-cache-size, qcow2-cluster-cache-size"

echo "test-dump-plugin: all cases passed"
