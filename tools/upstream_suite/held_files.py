# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Which files some live process holds open or maps (Linux ``/proc``).

Two kinds of file outlive the process that made them when it is killed, and the runner removes them
between tests: torch's JIT build lock (``<op>/lock``, which torch's ``FileBaton`` keeps open from
creation until the build releases it) and the CPU comm op's ``/dev/shm`` buffers (each rank keeps its
own open and maps the others'). While another pytest process runs beside (the other side, or another
job of ``--jobs``), "created during my test process" no longer means "mine and dead": a file is left
over only if no process holds it.
"""

import os
from pathlib import Path

PROC = Path("/proc")


def can_tell(proc=PROC):
    """Whether /proc shows each process's open files (Linux)."""
    return (proc / "self" / "fd").is_dir()


def held_paths(proc=PROC):
    """Real paths of every file a process holds open or maps, or None where /proc cannot tell (not Linux).

    Another user's processes may be unreadable: the runner's own pytest processes, the only ones that
    matter, run as its user.
    """
    if not can_tell(proc):
        return None
    held = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(os.path.join(entry.path, "fd")):
                try:
                    held.add(os.readlink(fd.path))
                except OSError:  # closed since listed
                    pass
        except OSError:  # ended since listed, or not ours
            pass
        try:
            with open(os.path.join(entry.path, "maps")) as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith("/"):
                        held.add(fields[5].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            pass
    return held


def unheld(paths, held):
    """``paths`` that no process holds; all of them where ``held`` is None (nothing known)."""
    if held is None:
        return list(paths)
    return [path for path in paths if os.path.realpath(path) not in held]
