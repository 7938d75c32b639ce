#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# A small HTTP/1.1 server for the tests, serving the files of a directory
# with byte ranges (Python's http.server ignores Range headers, which
# nbdkit's curl plugin needs).
#
#   http-range-server.py DIR PORTFILE [LOGFILE]
#
# Listens on 127.0.0.1 on a port chosen by the kernel and writes the port
# number to PORTFILE once it accepts connections.  Answers HEAD and GET,
# GET with a single "Range: bytes=A-B" (or "A-", or "-N") with 206 and
# the bytes asked for, and counts the requests it served in LOGFILE
# (one line per request: method, path, range), so that a test can see
# that ranges were really used.  Runs until killed.

import http.server
import os
import re
import socketserver
import sys

root, portfile = sys.argv[1], sys.argv[2]
logfile = sys.argv[3] if len(sys.argv) > 3 else None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _log(self, what):
        if logfile:
            with open(logfile, "a") as f:
                f.write(what + "\n")

    def _file(self):
        name = os.path.normpath(self.path.split("?", 1)[0]).lstrip("/")
        path = os.path.join(root, name)
        if name.startswith("..") or not os.path.isfile(path):
            self.send_error(404)
            return None
        return path

    def _range(self, size):
        """(start, end) inclusive, None for the whole file, or False."""
        h = self.headers.get("Range")
        if h is None:
            return None
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", h.strip())
        if not m or (m.group(1) == "" and m.group(2) == ""):
            return False
        if m.group(1) == "":
            n = int(m.group(2))
            return (max(0, size - n), size - 1)
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) else size - 1
        end = min(end, size - 1)
        if start > end:
            return False
        return (start, end)

    def _serve(self, body):
        path = self._file()
        if path is None:
            return
        size = os.path.getsize(path)
        r = self._range(size)
        self._log("%s %s %s" % (self.command, self.path,
                                self.headers.get("Range", "-")))
        if r is False:
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % size)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if r is None:
            start, end = 0, size - 1
            self.send_response(200)
        else:
            start, end = r
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        length = end - start + 1 if size else 0
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if body and length:
            with open(path, "rb") as f:
                f.seek(start)
                left = length
                while left:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)

    def do_HEAD(self):
        self._serve(False)

    def do_GET(self):
        self._serve(True)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(("127.0.0.1", 0), Handler)
tmp = portfile + ".tmp"
with open(tmp, "w") as f:
    f.write("%d\n" % srv.server_address[1])
os.rename(tmp, portfile)
srv.serve_forever()
