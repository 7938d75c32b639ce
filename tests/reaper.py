#!/usr/bin/python3
# reaper.py DIR COMMAND...: run COMMAND (an nbdkit) as a child and
# collect the exit status of it and of every process that it leaves
# behind, such as the server nbdkit forks into the background.
#
# The reaper is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a
# daemon whose parent exits becomes its child instead of init's, and its
# exit status can be collected.  When COMMAND exits, the reaper writes
# one line "STATUS PID..." to the FIFO DIR/fifo: COMMAND's status as
# the shell reports it (128+N for signal N) and the pids of the
# processes it left behind, now children of the reaper.  It then closes
# its standard streams (a caller reading its output sees the end) and,
# for each of those processes that exits, writes its status to
# DIR/exit.PID.  It exits when it has no children left.

import ctypes
import os
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


def main():
    directory, command = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"reaper.py: prctl: {os.strerror(ctypes.get_errno())}")
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"reaper.py: {command[0]}: {e.strerror}", file=sys.stderr)
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    left = children()
    with open(os.path.join(directory, "fifo"), "w") as fifo:
        print(shell_status(status), *left, file=fifo)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        tmp = os.path.join(directory, f".exit.{pid}")
        with open(tmp, "w") as f:
            print(shell_status(status), file=f)
        os.rename(tmp, os.path.join(directory, f"exit.{pid}"))


main()
