"""What the bench ran on, recorded beside its figures."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine and the scratch directory of one bench run."""

    cpu: str
    """CPU model name."""
    cores: int
    """Logical CPUs in the machine."""
    cores_usable: int
    """Logical CPUs this process may run on."""
    memory_bytes: int
    """Physical memory."""
    python: str
    """Python implementation and version."""
    kernel: str
    """Operating system and kernel release."""
    scratch: str
    """Where the workloads wrote their files."""
    filesystem: str
    """Filesystem type of the scratch directory (``unknown`` off Linux)."""
    device: str
    """What that filesystem is mounted from."""
    free_bytes: int
    """Free space in the scratch directory before the run."""
    graben: str
    """Installed graben version."""
    date: str
    """When the run started (ISO 8601, UTC)."""

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.cpu}, {self.cores_usable} cores, {self.memory_bytes / GiB:.1f} GiB RAM; "
            f"{self.filesystem} on {self.device}, {self.free_bytes / GiB:.0f} GiB free; "
            f"{self.python}, {self.kernel}; graben {self.graben}"
        )


def describe(scratch: Path) -> Machine:
    """This machine, with ``scratch`` as the directory workloads write into."""
    fstype, device = _mount(scratch)
    return Machine(
        cpu=_cpu_model(),
        cores=os.cpu_count() or 1,
        cores_usable=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        memory_bytes=_memory(),
        python=f"{platform.python_implementation()} {platform.python_version()}",
        kernel=f"{platform.system()} {platform.release()}",
        scratch=str(scratch),
        filesystem=fstype,
        device=device,
        free_bytes=shutil.disk_usage(scratch).free,
        graben=_graben_version(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )


def _cpu_model() -> str:
    # x86 names the model "model name"; many ARM kernels only give "Hardware".
    for key in ("model name", "Hardware", "Processor"):
        value = _proc_field("/proc/cpuinfo", key)
        if value:
            return value
    return platform.processor() or platform.machine() or "unknown"


def _proc_field(path: str, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == key:
                    return value.strip()
    except OSError:
        return None
    return None


def _memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _mount(path: Path) -> tuple[str, str]:
    """(filesystem type, source) of the mount holding ``path``: the longest matching mount point."""
    target = os.path.realpath(path)
    best: tuple[int, str, str] = (-1, "unknown", "unknown")
    for point, fstype, source in _mounts():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best[0]:
            best = (len(point), fstype, source)
    return best[1], best[2]


def _mounts() -> list[tuple[str, str, str]]:
    # /proc/self/mountinfo: "id parent dev root point options [tags] - fstype source super".
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if sep and len(fields) >= 5 and len(rest) >= 2:
            found.append((_unescape(fields[4]), rest[0], _unescape(rest[1])))
    return found


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in octal (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _graben_version() -> str:
    try:
        return version("graben")
    except PackageNotFoundError:
        return "unknown"
