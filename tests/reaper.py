#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# reaper.py DIR COMMAND...: run COMMAND (an nbdkit) as a child, keep a
# copy of its stderr, and collect the exit status of it and of every
# process that it leaves behind, such as the server nbdkit forks into
# the background.
#
# The reaper is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a
# daemon whose parent exits becomes its child instead of init's, and its
# exit status can be collected.  COMMAND's stderr goes through a pipe:
# the reaper copies it to its own stderr and to DIR/stderr (UBSan, for
# one, writes its reports there and nowhere else, and the caller may
# send stderr anywhere).  When COMMAND exits, the reaper copies what is
# left in the pipe, then writes one line "STATUS PID..." to the FIFO
# DIR/fifo: COMMAND's status as the shell reports it (128+N for signal
# N) and the pids of the processes it left behind, now children of the
# reaper.  It then closes its standard streams (a caller reading its
# output sees the end; what those processes write to stderr goes on
# into DIR/stderr) and, for each of them that exits, writes its status
# to DIR/exit.PID.  It exits when it has no children left.

import ctypes
import os
import select
import sys

PR_SET_CHILD_SUBREAPER = 36


def shell_status(wait_status):
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def children():
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += f.read().split()
    return pids


class Copier:
    """Copies the pipe to DIR/stderr and, until detach(), to stderr."""

    def __init__(self, fd, path):
        self.fd = fd
        self.copy = open(path, "wb", buffering=0)
        self.to_stderr = True
        os.set_blocking(fd, False)

    def pump(self, timeout):
        """Copy what is there (waiting up to TIMEOUT); False at EOF."""
        if self.fd is None:
            return False
        while True:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return True
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return True
            if not data:
                os.close(self.fd)
                self.fd = None
                return False
            self.copy.write(data)
            if self.to_stderr:
                try:
                    os.write(2, data)
                except OSError:
                    self.to_stderr = False
            timeout = 0


def main():
    directory, command = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"reaper.py: prctl: {os.strerror(ctypes.get_errno())}")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.dup2(wfd, 2)
        os.close(wfd)
        try:
            os.execvp(command[0], command)
        except OSError as e:
            os.write(2, f"reaper.py: {command[0]}: {e.strerror}\n".encode())
        os._exit(127)
    os.close(wfd)
    copier = Copier(rfd, os.path.join(directory, "stderr"))
    while True:
        copier.pump(0.05)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    # What it wrote before it exited is in the pipe.
    copier.pump(0)
    left = children()
    with open(os.path.join(directory, "fifo"), "w") as fifo:
        print(shell_status(status), *left, file=fifo)
    copier.to_stderr = False
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    pipe_open = True
    while True:
        if pipe_open:
            pipe_open = copier.pump(0.1)
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            if not pipe_open:
                break
            continue
        if done:
            tmp = os.path.join(directory, f".exit.{done}")
            with open(tmp, "w") as f:
                print(shell_status(status), file=f)
            os.rename(tmp, os.path.join(directory, f"exit.{done}"))
        elif not pipe_open:
            select.select([], [], [], 0.1)


main()
