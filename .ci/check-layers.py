#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Check the engine's layering.

The engine (common/) is cut into folders that are its layers, lowest
first: format/, base/, meta/, paths/, and common/ itself on top (the
README.md of each folder says what it holds).  This script checks:

- includes point down: a file includes headers of its own folder and of
  the folders below it, never above (read from the sources); qcow2.h,
  the engine's interface, which several layers implement, is the one
  header every layer may include, and it includes only format/ and
  base/ headers;
- the call graph between engine files has no circle, except the one
  between image.c and backing.c (a backing file is an image); the files
  of a module kept in several (those that include one X-internal.h)
  count as one; and the
  call graph between front-end files (nbdkit-glue/, the filter) has none
  (read from the built objects with nm, so it sees real calls, not
  mentions);
- each engine file includes the header of every engine module it calls,
  and no engine header of which it uses nothing;
- every layer folder has its README.md.

    .ci/check-layers.py SRCDIR BUILDDIR [--graph]
    .ci/check-layers.py --includes-only SRCDIR

--includes-only needs no build: it checks the include direction and the
READMEs alone (tests/test-layers.sh feeds it an upward include).
Exit status 0 when everything holds, 1 otherwise.
"""
import glob
import os
import re
import subprocess
import sys

# Lowest first; "" is common/ itself.
LAYERS = ["format", "base", "meta", "paths", ""]
# The engine's interface: declared here, implemented in several layers
# (qcow2_read in paths/, qcow2_image_open on top), so every layer may
# include it; it includes only format/ and base/ headers itself.
PUBLIC = "qcow2.h"
ALLOWED_CIRCLES = [{"image", "backing"}]
# Headers that declare no functions of a module of their own (types,
# bits, inline helpers, the public interface).
NOT_MODULES = {"qcow2", "format/entries", "format/endian", "format/errbuf",
               "base/io", "base/cleanup", "base/check", "base/options",
               "meta/image", "meta/alloc-internal", "meta/bitmap-internal"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(module):
    """The layer index of MODULE ("meta/refcount", "image")."""
    folder = module.rsplit("/", 1)[0] if "/" in module else ""
    return LAYERS.index(folder) if folder in LAYERS else None


def engine_files(srcdir):
    common = os.path.join(srcdir, "common")
    out = []
    for folder in LAYERS:
        for path in sorted(glob.glob(os.path.join(common, folder, "*.[ch]"))):
            out.append(os.path.relpath(path, common))
    return out


def resolve(srcdir, including, name):
    """The engine file (relative to common/) that `#include "NAME"` in
    INCLUDING names, or None for a file outside the engine (config.h,
    a library's header)."""
    common = os.path.join(srcdir, "common")
    here = os.path.dirname(including)
    for candidate in (os.path.normpath(os.path.join(here, name)), name):
        if os.path.isfile(os.path.join(common, candidate)):
            return candidate
    return None


def check_includes(srcdir):
    ok = True
    for folder in LAYERS[:-1]:
        if not os.path.isfile(os.path.join(srcdir, "common", folder,
                                           "README.md")):
            ok = False
            print("common/%s/ has no README.md saying what it may include"
                  % folder)
    for rel in engine_files(srcdir):
        with open(os.path.join(srcdir, "common", rel)) as f:
            text = f.read()
        mine = layer_of(os.path.splitext(rel)[0])
        for name in INCLUDE.findall(text):
            target = resolve(srcdir, rel, name)
            if target is None:
                continue
            theirs = layer_of(os.path.splitext(target)[0])
            if target == PUBLIC and rel != PUBLIC:
                continue
            if rel == PUBLIC and theirs > LAYERS.index("base"):
                ok = False
                print("common/%s, the interface every layer may include, "
                      "includes %s: only format/ and base/ headers may "
                      "be" % (rel, target))
                continue
            if theirs > mine:
                ok = False
                print("common/%s includes %s, which is in a higher layer "
                      "(%s/ above %s/)" % (rel, target,
                                           LAYERS[theirs] or "common",
                                           LAYERS[mine] or "common"))
    return ok


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


def call_graph(objects):
    """{module: set of modules it calls}, from {module: object path}."""
    defined_in, uses = {}, {}
    for mod, obj in objects.items():
        defined, undefined = symbols(obj)
        uses[mod] = undefined
        for sym in defined:
            defined_in[sym] = mod
    return {mod: {defined_in[s] for s in undefined
                  if s in defined_in and defined_in[s] != mod}
            for mod, undefined in uses.items()}


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


def objects_under(builddir, pattern):
    """{module: object} for the libtool objects matching PATTERN (a glob
    relative to BUILDDIR whose last part is PREFIX-NAME.o)."""
    out = {}
    for obj in glob.glob(os.path.join(builddir, pattern)):
        folder = os.path.dirname(os.path.relpath(obj, builddir))
        folder = folder.replace("/.libs", "")
        name = os.path.basename(obj).split("-", 1)[1][:-2]
        out[(folder, name)] = obj
    return out


def declared(srcdir, header):
    """The names a header declares: functions, macros, enum constants,
    structs it defines."""
    with open(os.path.join(srcdir, "common", header + ".h")) as f:
        text = f.read()
    names = set(re.findall(r"^#define (\w+)", text, re.M))
    names |= set(re.findall(r"^\w[\w\s\*]*?\b(\w+) \(", text, re.M))
    names |= set(re.findall(r"^static inline [\w\s\*]*?\b(\w+) \(", text,
                            re.M))
    names |= set(re.findall(r"^struct (\w+) \{", text, re.M))
    for body in re.findall(r"enum\s*\w*\s*\{([^}]*)\}", text):
        names |= set(re.findall(r"^\s*(\w+)", body, re.M))
    names.discard(os.path.basename(header).upper().replace("-", "_") + "_H")
    return names


def module_groups(srcdir):
    """{file: group}: the files that include one folder-internal header
    (X-internal.h) are one module in several files, and call each other
    freely."""
    groups = {}
    for rel in engine_files(srcdir):
        if not rel.endswith(".c"):
            continue
        with open(os.path.join(srcdir, "common", rel)) as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            if name.endswith("-internal.h"):
                groups[os.path.splitext(rel)[0]] = os.path.splitext(name)[0]
    return groups


def check_engine_calls(srcdir, builddir, show_graph):
    found = {}
    for folder in LAYERS:
        where = os.path.join("common", folder) if folder else "common"
        for pattern in ("libqcow2engine_la-*.o", ".libs/libqcow2engine_la-*.o"):
            found.update(objects_under(builddir, os.path.join(where, pattern)))
    objects = {}
    for (folder, name), obj in found.items():
        sub = folder[len("common"):].strip("/")
        objects[(sub + "/" if sub else "") + name] = obj
    if not objects:
        print("no engine objects under %s/common: build first" % builddir)
        return False
    calls = call_graph(objects)
    groups = module_groups(srcdir)
    grouped = {}
    for mod, targets in calls.items():
        g = groups.get(mod, mod)
        grouped.setdefault(g, set()).update(
            t for t in (groups.get(x, x) for x in targets) if t != g)
    ok = True
    for comp in strongly_connected(grouped):
        if len(comp) > 1 and comp not in ALLOWED_CIRCLES:
            ok = False
            print("circle between engine files: " + ", ".join(sorted(comp)))

    headers = {os.path.splitext(h)[0] for h in engine_files(srcdir)
               if h.endswith(".h")}
    for mod in sorted(calls):
        with open(os.path.join(srcdir, "common", mod + ".c")) as f:
            text = f.read()
        included = {os.path.splitext(t)[0] for t in
                    (resolve(srcdir, mod + ".c", n)
                     for n in INCLUDE.findall(text)) if t}
        needed = {m for m in calls[mod] if m in headers and m not in NOT_MODULES}
        own = {mod} if mod in headers else set()
        for m in sorted(needed - included):
            ok = False
            print("%s.c calls %s.c but does not include %s.h" % (mod, m, m))
        words = set(re.findall(r"\w+", re.sub(r'#include "[^"]*"', "", text)))
        for m in sorted(included - needed - own - NOT_MODULES):
            if m in headers and not (declared(srcdir, m) & words):
                ok = False
                print("%s.c includes %s.h but uses nothing of it" % (mod, m))
    if show_graph:
        for mod in sorted(calls):
            print("%s -> %s" % (mod, " ".join(sorted(calls[mod])) or "-"))
    return ok


def front_end_includes(srcdir, files):
    """Edges FILE -> MODULE for each front-end header FILE includes whose
    module (the .c of the same name beside it) is another file: a macro
    or an inline function of that header is a use nm cannot see."""
    edges = {}
    for mod in files:
        src = os.path.join(srcdir, mod + ".c")
        with open(src) as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            target = os.path.normpath(os.path.join(os.path.dirname(mod), name))
            target = os.path.splitext(target)[0]
            if target != mod and target in files:
                edges.setdefault(mod, set()).add(target)
    return edges


def check_front_end_calls(srcdir, builddir):
    glue = {}
    for pattern in ("nbdkit-glue/.libs/*.o", "nbdkit-glue/*.o"):
        for (folder, name), obj in objects_under(builddir, pattern).items():
            glue[folder + "/" + name] = obj
    ok = True
    # The filter and the plugin are separate programs, each with the glue.
    for form in ("filters/qcow2zstd", "plugins/qcow2zstd"):
        found = dict(glue)
        for pattern in (form + "/.libs/*.o", form + "/*.o"):
            for (folder, name), obj in objects_under(builddir, pattern).items():
                found[folder + "/" + name] = obj
        graph = call_graph(found)
        for mod, targets in front_end_includes(srcdir, set(found)).items():
            graph.setdefault(mod, set()).update(targets)
        for comp in strongly_connected(graph):
            if len(comp) > 1:
                ok = False
                print("circle between front-end files: "
                      + ", ".join(sorted(comp)))
    return ok


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if "--includes-only" in flags and len(args) == 1:
        ok = check_includes(args[0])
    elif len(args) == 2:
        ok = check_includes(args[0])
        ok = check_engine_calls(args[0], args[1], "--graph" in flags) and ok
        ok = check_front_end_calls(args[0], args[1]) and ok
    else:
        sys.exit(__doc__)
    print("layers: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
