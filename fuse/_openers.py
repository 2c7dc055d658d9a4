"""Who opened a file for writing, and what has become of them: read from ``/proc``.

The kernel sends FLUSH whenever a descriptor of an open file is closed: the
writer's own close, but also a subprocess dropping its inherited copy at
exec, or a forked child exiting. pyfuse3 gives ``flush`` no request context,
so the daemon cannot ask who is closing. It can ask about the process that
opened the handle (``open`` has its pid), and that answer decides a flush:

- the opener still holds the file open for writing: someone else closed a
  copy; publishing now would publish a file still being written;
- it holds it no more: it closed it, or exited normally without closing;
- it is exiting from a signal (killed, crashed): it dies mid-write.

A process killed by a signal closes its files in ``do_exit`` with
``PF_EXITING`` set and its exit code already holding the signal (field 52 of
``/proc/<pid>/stat``, Linux 3.5+), and waits for the FLUSH reply meanwhile.
Its descriptors are read before its state: by the time they are gone from
``/proc``, its exit code is set.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass

from graben.store import InvalidArgument

PF_EXITING = 0x4
"""``task_struct.flags``: the task is in ``do_exit``."""
_FLAGS, _START, _EXIT_CODE = 9, 22, 52
"""Fields of ``/proc/<pid>/stat`` (numbered from 1, as ``proc(5)`` does)."""
SIGNAL_BITS = 0x7F
"""The part of an exit code that holds the signal a process died of (0: it exited)."""


class Fate(enum.Enum):
    """What the opener of a handle has done with it, seen at a flush."""

    HOLDS = "holds"
    """It still has the file open for writing: the flush is someone else's."""
    CLOSED = "closed"
    """It holds it no more, and did not die of a signal: it is done writing."""
    KILLED = "killed"
    """It is exiting from a signal: what it wrote is torn."""
    UNKNOWN = "unknown"
    """``/proc`` would not say (another user's process, say)."""


@dataclass(frozen=True, slots=True)
class Opener:
    """The process that opened a handle."""

    pid: int
    """Its process (thread group) id."""
    start: int
    """Its start time (clock ticks after boot): tells a reused pid apart."""


def opener(tid: int) -> Opener | None:
    """The process thread ``tid`` belongs to; ``None`` if ``/proc`` cannot tell."""
    if tid <= 0:  # a process outside the mount's pid namespace
        return None
    try:
        pid = _thread_group(tid)
        return Opener(pid, int(_stat(pid)[_START]))
    except (OSError, ValueError, IndexError):
        return None


def fate(who: Opener, inode: int, device: str | None) -> Fate:
    """What ``who`` has done with the file ``inode`` of the mount on ``device`` (blocks)."""
    try:
        if _holds(who.pid, inode, device):
            return Fate.HOLDS
        fields = _stat(who.pid)
    except FileNotFoundError:  # gone (it answered its own flush before it could go)
        return Fate.CLOSED
    except (OSError, ValueError, IndexError, KeyError):  # KeyError: no ino in fdinfo (< 5.14)
        return Fate.UNKNOWN
    if int(fields[_START]) != who.start:  # the pid names another process now
        return Fate.CLOSED
    exiting = int(fields[_FLAGS]) & PF_EXITING
    return Fate.KILLED if exiting and int(fields[_EXIT_CODE]) & SIGNAL_BITS else Fate.CLOSED


def mount_device(mount_point: str) -> str | None:
    """The ``major:minor`` of the mount at ``mount_point`` (``None`` if there is none)."""
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            # mountinfo writes a space, tab, newline or backslash in a path as \ooo.
            if re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]) == mount_point:
                return fields[2]
    return None


def _thread_group(tid: int) -> int:
    with open(f"/proc/{tid}/status") as status:
        for line in status:
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    raise InvalidArgument("no Tgid line", f"/proc/{tid}/status")


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` as fields indexed from 1 (``[0]`` is a placeholder)."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    # The command name (field 2) may hold spaces and parentheses: it ends at the last ')'.
    head, _, rest = text.rpartition(")")
    pid_field = head.partition(" ")[0]
    return ["", pid_field, head, *rest.split()]


def _holds(pid: int, inode: int, device: str | None) -> bool:
    """Whether process ``pid`` has ``inode`` of our mount open for writing."""
    for tid in _threads(pid):
        try:
            fds = os.listdir(f"/proc/{pid}/task/{tid}/fd")
        except FileNotFoundError:  # the thread is gone
            continue
        if fds:  # a thread's table is its process's (one that has exited shows none)
            return any(_writes(pid, tid, fd, inode, device) for fd in fds)
    return False


def _threads(pid: int) -> list[int]:
    """The process's threads, its first one first (it usually holds the table)."""
    return sorted((int(tid) for tid in os.listdir(f"/proc/{pid}/task")), key=lambda t: t != pid)


def _writes(pid: int, tid: int, fd: str, inode: int, device: str | None) -> bool:
    where = f"/proc/{pid}/task/{tid}"
    try:
        if not os.readlink(f"{where}/fd/{fd}").startswith("/"):
            return False  # a pipe, socket or anonymous inode
        with open(f"{where}/fdinfo/{fd}") as info:
            fields = dict(line.split(":", 1) for line in info if ":" in line)
    except FileNotFoundError:  # closed meanwhile
        return False
    if int(fields["ino"]) != inode or int(fields["flags"], 8) & os.O_ACCMODE == os.O_RDONLY:
        return False
    return device is None or _device_of(pid, int(fields["mnt_id"])) == device


def _device_of(pid: int, mount_id: int) -> str | None:
    """The ``major:minor`` of mount ``mount_id`` in ``pid``'s namespace (a bind mount's too)."""
    with open(f"/proc/{pid}/mountinfo") as table:
        for line in table:
            fields = line.split()
            if int(fields[0]) == mount_id:
                return fields[2]
    return None
