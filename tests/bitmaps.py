#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# The persistent bitmaps of a qcow2 image, read (and damaged) byte by byte
# from the file, for the tests: written from qcow2.txt ("Bitmaps"), apart
# from the engine.
#
#   bitmaps.py IMAGE list              one line per bitmap: name, flags,
#                                      granularity bits, table offset, size
#   bitmaps.py IMAGE digest NAME       the SHA-256 of its directory entry,
#                                      its table and its data clusters, as
#                                      on disk
#   bitmaps.py IMAGE set NAME FIELD VALUE
#                                      overwrite a field of its directory
#                                      entry: flags, type, table_offset
#                                      (VALUE may name a place: "l1" or
#                                      "refcount-table" for where that
#                                      table is, "eof+N" for
#                                      N bytes past the end of the file's
#                                      last cluster)
#   bitmaps.py IMAGE autoclear         the header's autoclear bits

import hashlib
import os
import struct
import sys

EXT_BITMAPS = 0x23852875


def header(f):
    f.seek(0)
    h = f.read(4096)
    return {
        "cluster_bits": struct.unpack_from(">I", h, 20)[0],
        "l1_offset": struct.unpack_from(">Q", h, 40)[0],
        "refcount_table_offset": struct.unpack_from(">Q", h, 48)[0],
        "autoclear": struct.unpack_from(">Q", h, 88)[0],
        "header_length": struct.unpack_from(">I", h, 100)[0],
        "raw": h,
    }


def directory(f):
    """(directory offset, [(name, entry offset, entry bytes, fields)])"""
    h = header(f)
    raw = h["raw"]
    pos = h["header_length"]
    while pos + 8 <= len(raw):
        etype, elen = struct.unpack_from(">II", raw, pos)
        if etype == 0:
            break
        if etype == EXT_BITMAPS:
            nb, _, dsize, doff = struct.unpack_from(">IIQQ", raw, pos + 8)
            f.seek(doff)
            d = f.read(dsize)
            out, p = [], 0
            for _ in range(nb):
                toff, tsize, flags, btype, gbits, nlen, extra = \
                    struct.unpack_from(">QIIBBHI", d, p)
                name = d[p + 24 + extra:p + 24 + extra + nlen].decode()
                size = (24 + extra + nlen + 7) & ~7
                out.append((name, doff + p, d[p:p + size], {
                    "table_offset": toff, "table_size": tsize,
                    "flags": flags, "type": btype, "granularity_bits": gbits,
                }))
                p += size
            return doff, out
        pos += 8 + ((elen + 7) & ~7)
    sys.exit("no bitmaps extension")


def find(f, name):
    for b in directory(f)[1]:
        if b[0] == name:
            return b
    sys.exit(f"no bitmap {name!r}")


def main():
    path, cmd = sys.argv[1], sys.argv[2]
    with open(path, "r+b" if cmd == "set" else "rb") as f:
        if cmd == "list":
            for name, _, _, fl in directory(f)[1]:
                print(name, fl["flags"], fl["granularity_bits"],
                      fl["table_offset"], fl["table_size"])
        elif cmd == "autoclear":
            print(header(f)["autoclear"])
        elif cmd == "digest":
            cs = 1 << header(f)["cluster_bits"]
            _, _, entry, fl = find(f, sys.argv[3])
            md = hashlib.sha256(entry)
            f.seek(fl["table_offset"])
            table = f.read(8 * fl["table_size"])
            md.update(table)
            for i in range(fl["table_size"]):
                e = struct.unpack_from(">Q", table, 8 * i)[0]
                if e & 0x00fffffffffffe00:
                    f.seek(e & 0x00fffffffffffe00)
                    md.update(f.read(cs))
            print(md.hexdigest())
        elif cmd == "set":
            name, field, value = sys.argv[3:6]
            _, at, _, _ = find(f, name)
            if value == "l1":
                value = header(f)["l1_offset"]
            elif value == "refcount-table":
                value = header(f)["refcount_table_offset"]
            elif value.startswith("eof+"):
                cs = 1 << header(f)["cluster_bits"]
                end = -(-os.fstat(f.fileno()).st_size // cs) * cs
                value = end + int(value[4:])
            else:
                value = int(value, 0)
            place = {"table_offset": (0, ">Q"), "flags": (12, ">I"),
                     "type": (16, ">B")}[field]
            f.seek(at + place[0])
            f.write(struct.pack(place[1], value))
        else:
            sys.exit(f"unknown command {cmd}")


main()
