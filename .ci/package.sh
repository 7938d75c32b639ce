#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Debian packages from end to end, as root (CI runs it as one stage):
#
# 1. installs the packaging tools (.ci/deps.sh --packaging);
# 2. copies the tree's files (git's, with uncommitted changes) to a
#    scratch directory, builds the source package and, as the README
#    says, `dpkg-buildpackage -us -uc -b` (the .debs land beside the
#    source directory; the test suite is not run, debian/rules);
# 3. lintian on the source and binary packages: any error or warning
#    fails the stage;
# 4. checks the packages' files and their dependency on nbdkit;
# 5. installs both with apt, which must install nothing else;
# 6. uses them BY NAME: nbdkit finds the installed .so files, serves a
#    zstd image that qemu-img made through the filter (file plugin) and
#    the plugin, nbdcopy reads the disk, cmp against qemu-img's raw;
#    the plugin creates an image that qemu-img checks and compares;
#    man -w finds both man pages;
# 7. purges them, which must remove nothing else, and checks that the
#    machine is as it was: dpkg knows neither package, every file they
#    installed is gone, and nbdkit and man find nothing of theirs.
#
# It refuses to start if either package is installed or anything of
# theirs is in place already (a `make install` leaves the same .so
# files: the test would then prove nothing, and the purge would remove
# a file dpkg had overwritten).  Exits non-zero on the first failure,
# after purging what it installed.  QCOW2ZSTD_PACKAGE_KEEP=DIR keeps
# the built packages in DIR.

set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

packages=(nbdkit-filter-qcow2zstd nbdkit-plugin-qcow2zstd)

say () { printf 'package: %s\n' "$*"; }
fail () { printf 'package.sh: FAIL: %s\n' "$*" >&2; exit 1; }
# Run a command with its output in a log, shown only if it fails.
quietly ()
{
    local log=$work/step.log
    if ! "$@" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        fail "$*"
    fi
}

[ "$(id -u)" = 0 ] || fail "run it as root: it installs and removes packages"

bash .ci/deps.sh --packaging

filterdir=$(pkg-config --variable=filterdir nbdkit)
plugindir=$(pkg-config --variable=plugindir nbdkit)
nbdkit_version=$(pkg-config --modversion nbdkit)
filter_so=$filterdir/nbdkit-qcow2zstd-filter.so
plugin_so=$plugindir/nbdkit-qcow2zstd-plugin.so
[ -n "$filterdir" ] && [ -n "$plugindir" ] && [ -n "$nbdkit_version" ] ||
    fail "pkg-config knows no nbdkit (nbdkit-plugin-dev)"

# ------------------------------------------------------------ versions
version=$(sed -n 's/^AC_INIT(\[qcow2zstd\], *\[\([^]]*\)\].*/\1/p' configure.ac)
changelog_version=$(dpkg-parsechangelog -l debian/changelog -S Version)
[ -n "$version" ] || fail "no version in configure.ac's AC_INIT"
[ "$changelog_version" = "$version" ] ||
    fail "debian/changelog says $changelog_version, configure.ac $version: add a changelog entry (dch -v $version)"
say "version $version (configure.ac and debian/changelog), nbdkit $nbdkit_version"

# ------------------------------------------------------------ nothing there yet
nothing_of_ours ()
{
    local p what=$1 status
    for p in "${packages[@]}"; do
        status=$(dpkg-query -W -f '${db:Status-Abbrev}' "$p" 2>/dev/null) || status=
        case $status in
            ''|un*|pn*) ;;
            *) fail "$what: $p is known to dpkg ($status)" ;;
        esac
    done
    for p in "$filter_so" "$plugin_so"; do
        [ ! -e "$p" ] || fail "$what: $p exists (left by make install? remove it)"
    done
    for p in nbdkit-qcow2zstd-filter nbdkit-qcow2zstd-plugin; do
        if man -w "$p" >/dev/null 2>&1; then
            fail "$what: man -w finds $p at $(man -w "$p")"
        fi
    done
    # By name nbdkit looks only in its own directories.
    if nbdkit qcow2zstd --dump-plugin >/dev/null 2>&1; then
        fail "$what: nbdkit finds a plugin named qcow2zstd"
    fi
    if nbdkit --filter=qcow2zstd null --dump-plugin >/dev/null 2>&1; then
        fail "$what: nbdkit finds a filter named qcow2zstd"
    fi
}
nothing_of_ours "before installing"

work=$(mktemp -d "${TMPDIR:-/var/tmp}/qcow2zstd-package.XXXXXX")
# apt reads the .debs as its unprivileged user
chmod 755 "$work"
# Another engineer's apt on this shared machine holds dpkg's lock for a
# while: wait for it rather than fail.
apt_get () { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"; }

installed=no
cleanup ()
{
    local rc=$?
    if [ "$installed" = yes ]; then
        echo "package.sh: purging ${packages[*]} after a failure" >&2
        apt_get purge -y "${packages[@]}" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------ build
src=$work/qcow2zstd-$version
mkdir "$src"
# The files git knows, as they are in the work tree, and new ones it
# does not ignore: no build products, no _ci/, no .git.
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do
        if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
    done |
    tar --null -T - -cf - | tar -xf - -C "$src"

start=$SECONDS
(cd "$work" && quietly dpkg-source -b "qcow2zstd-$version")
(cd "$src" && quietly dpkg-buildpackage -us -uc -b -J2)
say "built in $((SECONDS - start)) s:" $(cd "$work" && ls *.dsc *.deb *.changes)

filter_deb=$(echo "$work"/nbdkit-filter-qcow2zstd_"$version"_*.deb)
plugin_deb=$(echo "$work"/nbdkit-plugin-qcow2zstd_"$version"_*.deb)
[ -f "$filter_deb" ] && [ -f "$plugin_deb" ] ||
    fail "dpkg-buildpackage made no $filter_deb or $plugin_deb"

# ------------------------------------------------------------ lintian
say "lintian (info tags shown; errors and warnings fail)"
start=$SECONDS
lintian_rc=0
lintian_out=$(lintian -I --fail-on error,warning "$work"/*.dsc "$work"/*.changes 2>&1) ||
    lintian_rc=$?
grep -v '^running with root privileges is not recommended!$' <<<"$lintian_out" || true
[ $lintian_rc = 0 ] || fail "lintian exits $lintian_rc: an error or a warning (above)"
say "lintian: no error, no warning ($((SECONDS - start)) s)"

# ------------------------------------------------------------ what they hold
contents ()
{
    dpkg-deb -c "$1" | awk '{ print $6 }' | sed 's,^\.,,' | grep -v '/$' | sort
}
expect_files ()
{
    local deb=$1 got want
    shift
    got=$(contents "$deb")
    want=$(printf '%s\n' "$@" | sort)
    [ "$got" = "$want" ] || {
        diff -u <(echo "$want") <(echo "$got") >&2 || true
        fail "$(basename "$deb") holds other files than expected (diff: - expected, + got)"
    }
}
expect_files "$filter_deb" "$filter_so" \
    /usr/share/man/man1/nbdkit-qcow2zstd-filter.1.gz \
    /usr/share/doc/nbdkit-filter-qcow2zstd/changelog.gz \
    /usr/share/doc/nbdkit-filter-qcow2zstd/copyright
expect_files "$plugin_deb" "$plugin_so" \
    /usr/share/man/man1/nbdkit-qcow2zstd-plugin.1.gz \
    /usr/share/doc/nbdkit-plugin-qcow2zstd/changelog.gz \
    /usr/share/doc/nbdkit-plugin-qcow2zstd/copyright

# nbdkit loads a filter only if built for its very version; a plugin
# from the version it was built for on (debian/rules).
next=$(echo "$nbdkit_version" | awk -F. '{ print $1 "." $2 "." $3 + 1 }')
filter_depends=$(dpkg-deb -f "$filter_deb" Depends)
plugin_depends=$(dpkg-deb -f "$plugin_deb" Depends)
[[ $filter_depends == "nbdkit (>= $nbdkit_version), nbdkit (<< $next~), "* ]] ||
    fail "the filter's Depends lacks nbdkit (>= $nbdkit_version), nbdkit (<< $next~): $filter_depends"
[[ $plugin_depends == "nbdkit (>= $nbdkit_version), "* ]] ||
    fail "the plugin's Depends lacks nbdkit (>= $nbdkit_version): $plugin_depends"
say "filter Depends: $filter_depends"
say "plugin Depends: $plugin_depends"

# ------------------------------------------------------------ install
# Nothing but the two: anything else apt pulled in would stay behind.
would=$(apt_get install -s --no-install-recommends "$filter_deb" "$plugin_deb" |
        sed -n 's/^Inst \([^ ]*\) .*/\1/p' | sort | xargs)
[ "$would" = "${packages[*]}" ] ||
    fail "apt would install '$would', not only ${packages[*]}"
installed=yes
start=$SECONDS
quietly apt_get install -y --no-install-recommends "$filter_deb" "$plugin_deb"
for p in "${packages[@]}"; do
    [ "$(dpkg-query -W -f '${db:Status-Abbrev}' "$p")" = "ii " ] ||
        fail "$p is not installed after apt-get install"
done
say "installed: $(dpkg-query -W -f '${Package} ${Version}\n' "${packages[@]}" | paste -sd, | sed 's/,/, /g') ($((SECONDS - start)) s)"

# ------------------------------------------------------------ by name
start=$SECONDS
owner ()
{
    dpkg-query -S "$1" 2>/dev/null | cut -d: -f1
}
[ "$(owner "$filter_so")" = nbdkit-filter-qcow2zstd ] || fail "dpkg says no package owns $filter_so"
[ "$(owner "$plugin_so")" = nbdkit-plugin-qcow2zstd ] || fail "dpkg says no package owns $plugin_so"

dump=$(nbdkit qcow2zstd --dump-plugin) || fail "nbdkit qcow2zstd --dump-plugin failed"
grep -qx "path=$plugin_so" <<<"$dump" ||
    fail "nbdkit qcow2zstd loads another plugin: $(grep '^path=' <<<"$dump")"
grep -qx "version=$version" <<<"$dump" ||
    fail "the plugin nbdkit loads is not version $version: $(grep '^version=' <<<"$dump")"
dump=$(nbdkit -v --filter=qcow2zstd null --dump-plugin 2>&1) ||
    fail "nbdkit --filter=qcow2zstd null --dump-plugin failed: $dump"
grep -q "registered filter $filter_so (name qcow2zstd)" <<<"$dump" ||
    fail "nbdkit --filter=qcow2zstd loads another filter: $(grep 'registered filter' <<<"$dump")"
grep -q '^qcow2zstd_codecs=zlib,zstd$' <<<"$dump" ||
    fail "the filter's --dump-plugin lacks qcow2zstd_codecs=zlib,zstd"
say "nbdkit finds $filter_so and $plugin_so by name"

# A 48 MiB disk: incompressible data, text, zeros and a hole, that
# qemu-img compresses with zstd.
img=$work/img
mkdir "$img"
truncate -s 48M "$img/disk.raw"
head -c 5M /dev/urandom | dd of="$img/disk.raw" bs=1M seek=1 conv=notrunc status=none
(yes 'qcow2zstd packaged and loaded by name' || true) | head -c 9M |
    dd of="$img/disk.raw" bs=1M seek=10 conv=notrunc status=none
head -c 3M /dev/urandom | dd of="$img/disk.raw" bs=1M seek=40 conv=notrunc status=none
quietly qemu-img convert -c -f raw -O qcow2 -o compression_type=zstd \
    "$img/disk.raw" "$img/disk.qcow2"
info=$(qemu-img info "$img/disk.qcow2")
grep -q 'compression type: zstd' <<<"$info" || fail "qemu-img did not make a zstd image: $info"
# The oracle: qemu's own reading of the image.
quietly qemu-img convert -f qcow2 -O raw "$img/disk.qcow2" "$img/expected.raw"
cmp "$img/disk.raw" "$img/expected.raw" || fail "qemu-img's raw differs from the disk it compressed"

# --run: the server on a private socket, $uri for the command, and the
# server stopped when the command ends.
quietly nbdkit -U - -r --filter=qcow2zstd file "$img/disk.qcow2" \
    --run "nbdcopy \"\$uri\" $(printf %q "$img/filter.raw")"
cmp "$img/expected.raw" "$img/filter.raw" ||
    fail "nbdkit --filter=qcow2zstd file: the disk read differs from qemu-img's"
say "nbdkit --filter=qcow2zstd file disk.qcow2: nbdcopy read $(stat -c %s "$img/filter.raw") bytes, identical to qemu-img convert's"

quietly nbdkit -U - -r qcow2zstd "$img/disk.qcow2" \
    --run "nbdcopy \"\$uri\" $(printf %q "$img/plugin.raw")"
cmp "$img/expected.raw" "$img/plugin.raw" ||
    fail "nbdkit qcow2zstd: the disk read differs from qemu-img's"
say "nbdkit qcow2zstd disk.qcow2: nbdcopy read $(stat -c %s "$img/plugin.raw") bytes, identical to qemu-img convert's"

# And a write: the plugin creates an image and nbdcopy fills it.
quietly nbdkit -U - qcow2zstd "$img/new.qcow2" qcow2-create=48M \
    --run "nbdcopy $(printf %q "$img/disk.raw") \"\$uri\""
quietly qemu-img check "$img/new.qcow2"
quietly qemu-img compare -f raw -F qcow2 "$img/disk.raw" "$img/new.qcow2"
say "nbdkit qcow2zstd new.qcow2 qcow2-create=48M: qemu-img check clean, qemu-img compare identical"

for page in nbdkit-qcow2zstd-filter nbdkit-qcow2zstd-plugin; do
    path=$(man -w "$page") || fail "man -w $page finds nothing"
    [ "$path" = "/usr/share/man/man1/$page.1.gz" ] || fail "man -w $page: $path"
    text=$(man -P cat "$page" 2>/dev/null) || fail "man $page fails"
    grep -q "$page" <<<"$text" || fail "man $page shows no page about $page"
    say "man -w $page: $path"
done

say "used by name in $((SECONDS - start)) s"

# ------------------------------------------------------------ remove
start=$SECONDS
# Every file and directory of theirs except those other packages share.
dpkg-query -L "${packages[@]}" | grep -vx '/\.' | sort -u > "$work/installed-paths"
would=$(apt_get purge -s "${packages[@]}" | sed -n 's/^Purg \([^ ]*\).*/\1/p' | sort | xargs)
[ "$would" = "${packages[*]}" ] ||
    fail "apt would purge '$would', not only ${packages[*]}"
quietly apt_get purge -y "${packages[@]}"
installed=no
nothing_of_ours "after apt-get purge"
left=() dirs=()
while IFS= read -r path; do
    if [ -d "$path" ]; then
        dirs+=("$path")
    elif [ -e "$path" ] || [ -L "$path" ]; then
        left+=("$path")
    fi
done < "$work/installed-paths"
# A directory still there must belong to another package.  dpkg-query -S
# prints "PACKAGES: PATH" for each path it knows (and fails for the rest).
if [ ${#dirs[@]} -gt 0 ]; then
    owned=$(dpkg-query -S "${dirs[@]}" 2>/dev/null | sed 's/^.*: //' || true)
    for path in "${dirs[@]}"; do
        grep -qxF "$path" <<<"$owned" || left+=("$path")
    done
fi
[ ${#left[@]} = 0 ] || fail "left behind after the purge: ${left[*]}"
say "purged ($((SECONDS - start)) s): dpkg knows neither package; none of their $(wc -l < "$work/installed-paths") paths is left (but directories other packages own)"

if [ -n "${QCOW2ZSTD_PACKAGE_KEEP:-}" ]; then
    mkdir -p "$QCOW2ZSTD_PACKAGE_KEEP"
    cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$work"/*.dsc "$work"/*.tar.* \
        "$QCOW2ZSTD_PACKAGE_KEEP"/
    say "packages kept in $QCOW2ZSTD_PACKAGE_KEEP"
fi
say "OK ($SECONDS s)"
