"""Run file system steps in a directory, each as its own user in its own process.

``python as_users.py DIR`` reads a JSON list of steps on stdin, ``[uid, op,
*args]`` with paths relative to ``DIR``, and prints one JSON list of results:
each step runs in a forked child that takes the uid (its group the same
number, no supplementary groups) before it acts, so the kernel decides every
permission as it would for that user's program. A result is ``"ok"``, the
errno's name (``"EPERM"``), or what the step reads (``owner``: ``"uid:gid"``;
``ino``: the inode number). Run as root; single-threaded, so forking is safe.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable

Step = list[object]


def _create(path: str, kind: str) -> None:
    if kind == "regular":
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    elif kind == "fifo":
        os.mkfifo(path, 0o644)
    elif kind == "symlink":
        os.symlink("target", path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
    elif kind == "dir":
        os.mkdir(path, 0o755)
    else:
        raise ValueError(kind)


def _write(path: str, data: str) -> None:
    """What ``echo data > path`` does: open (create, truncate), write, close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _owner(path: str) -> str:
    st = os.lstat(path)
    return f"{st.st_uid}:{st.st_gid}"


OPS: dict[str, Callable[..., object]] = {
    "mkdir": os.mkdir,
    "chmod": os.chmod,
    "chown": os.lchown,
    "create": _create,
    "write": _write,
    "rename": os.rename,
    "link": os.link,
    "unlink": os.unlink,
    "rmdir": os.rmdir,
    "owner": _owner,
    "ino": lambda p: os.lstat(p).st_ino,
    "read": lambda p: open(p).read(),  # noqa: SIM115  (the child exits at once)
    "listed": lambda p: sorted(os.listdir(p)),
    "sleep": time.sleep,
}


def _act(uid: int, op: str, args: list[object]) -> object:
    if uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    try:
        found = OPS[op](*args)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok" if found is None else found


def run(step: Step) -> object:
    """One step in a child process of its own user; what it gave."""
    uid, op, *args = step
    assert isinstance(uid, int) and isinstance(op, str)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: act, say what happened, go
        os.close(read)
        try:
            result = _act(uid, op, args)
        except BaseException as exc:  # a bug in a step: said, not hidden
            result = f"raised {exc!r}"
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(said)


def main() -> None:
    os.chdir(sys.argv[1])
    os.umask(0)
    steps: list[Step] = json.load(sys.stdin)
    json.dump([run(step) for step in steps], sys.stdout)


if __name__ == "__main__":
    main()
