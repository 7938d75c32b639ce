#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Check the engine's layering from a build tree.

Reads the symbols of the engine's objects (nm), so it sees real calls,
not mentions, and the #include lines of common/*.c:

- the call graph between engine files has no circle, except the one
  between qcow2-image.c and qcow2-backing.c (a backing file is an image);
- each file includes the header of every engine module it calls, and no
  header of which it uses nothing (no function, macro or enum constant).

    .ci/check-layers.py SRCDIR BUILDDIR [--graph]

Exit status 0 when both hold, 1 otherwise.
"""
import glob
import os
import re
import subprocess
import sys

ALLOWED_CIRCLES = [{"qcow2-image", "qcow2-backing"}]
# Headers that declare no functions of their own module (types, bits,
# inline helpers) or whose functions live in several files.
NOT_MODULES = {"qcow2", "qcow2-types", "qcow2-entries", "qcow2-endian",
               "qcow2-io", "qcow2-errbuf"}


def module_of_object(path):
    base = os.path.basename(path)
    m = re.match(r"libqcow2engine_la-(.*)\.o$", base)
    return m.group(1) if m else None


def symbols(obj):
    out = subprocess.run(["nm", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBR":
            defined.add(parts[2])
    return defined, undefined


def declared(srcdir, header):
    """The names a header declares: functions, macros, enum constants."""
    with open(os.path.join(srcdir, "common", header + ".h")) as f:
        text = f.read()
    names = set(re.findall(r"^#define (\w+)", text, re.M))
    names |= set(re.findall(r"^\w[\w\s\*]*?\b(\w+) \(", text, re.M))
    for body in re.findall(r"enum\s*\w*\s*\{([^}]*)\}", text):
        names |= set(re.findall(r"^\s*(\w+)", body, re.M))
    names.discard(header.upper().replace("-", "_") + "_H")
    return names


def strongly_connected(graph):
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            result.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    srcdir, builddir = sys.argv[1], sys.argv[2]
    show_graph = "--graph" in sys.argv[3:]
    objects = (glob.glob(os.path.join(builddir, "common", ".libs",
                                      "libqcow2engine_la-*.o")) or
               glob.glob(os.path.join(builddir, "common", "libqcow2engine_la-*.o")))
    if not objects:
        sys.exit("no engine objects under %s/common: build first" % builddir)

    defined_in, uses = {}, {}
    for obj in objects:
        mod = module_of_object(obj)
        defined, undefined = symbols(obj)
        uses[mod] = undefined
        for sym in defined:
            defined_in[sym] = mod

    calls = {}
    for mod, undefined in uses.items():
        calls[mod] = {defined_in[s] for s in undefined
                      if s in defined_in and defined_in[s] != mod}

    ok = True
    for comp in strongly_connected(calls):
        if len(comp) > 1 and comp not in ALLOWED_CIRCLES:
            ok = False
            print("circle between: " + ", ".join(sorted(comp)))

    headers = {os.path.basename(h)[:-2]
               for h in glob.glob(os.path.join(srcdir, "common", "*.h"))}
    for mod in sorted(calls):
        src = os.path.join(srcdir, "common", mod + ".c")
        with open(src) as f:
            text = f.read()
        included = set(re.findall(r'^#include "([^"]+)\.h"', text, re.M))
        # A module's own header, and the public header for the public
        # functions, count as used.
        needed = {m for m in calls[mod] if m in headers and m not in NOT_MODULES}
        own = {mod} if mod in headers else set()
        for m in sorted(needed - included):
            ok = False
            print("%s.c calls %s.c but does not include %s.h" % (mod, m, m))
        words = set(re.findall(r"\w+", re.sub(r'#include "[^"]*"', "", text)))
        for m in sorted(included - needed - own - NOT_MODULES):
            if m in headers and not (declared (srcdir, m) & words):
                ok = False
                print("%s.c includes %s.h but uses nothing of it" % (mod, m))

    if show_graph:
        for mod in sorted(calls):
            print("%s -> %s" % (mod, " ".join(sorted(calls[mod])) or "-"))
    print("layers: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
