"""
Who serves a loopback port: the check that a server the suite started is the one a client reaches.

:func:`~tests.support.processes.free_port` only says a port was free a moment ago. Between that
and the server's bind, another process (another xdist worker's broker, a client's ephemeral port)
can take it. Then the server we started either fails to bind and goes on running, or shares the
port through ``SO_REUSEPORT`` (gRPC's C core sets it on every listener by default), and
``127.0.0.1:<port>`` answers from someone else's server: a test that freezes or stops "its"
broker by PID goes on talking to a live one. :func:`port_ownership` reads the kernel's socket
tables (``/proc/net/tcp*``) and the processes' descriptors (``/proc/<pid>/fd``) to say which
processes hold a listener a connection to ``127.0.0.1:<port>`` can land on.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"
"""``TCP_LISTEN`` in the ``st`` column of ``/proc/net/tcp``."""
REACHABLE_FROM_127_0_0_1 = {
    "0100007F",  # 127.0.0.1
    "00000000",  # 0.0.0.0
    "00000000000000000000000000000000",  # ::, dual-stack
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1 (a JVM's IPv6 socket bound to 127.0.0.1)
}
"""Local addresses, as ``/proc/net/tcp*`` spells them, of listeners a connection to 127.0.0.1 reaches."""


class PortNotOursError(RuntimeError):
    """Another process serves (or also serves) the port a server of ours was started on."""


@dataclass(frozen=True)
class PortOwnership:
    """The listeners on one loopback port, split into ours and everyone else's."""

    port: int
    ours: frozenset[int]
    """PIDs of the owner's family that hold a listener on the port."""
    foreign: tuple[str, ...]
    """Each other listener, described (``pid 123 (java -jar ...)``, or a socket of a process we
    cannot see)."""

    def check(self, what: str) -> None:
        """Raise :class:`PortNotOursError` unless the port is served by the owner's family only."""
        if self.foreign:
            raise PortNotOursError(
                f"{what}: 127.0.0.1:{self.port} is served by another process too: "
                f"{'; '.join(self.foreign)}. free_port() handed out a port someone else took; a "
                "client would reach their server, not ours."
            )
        if not self.ours:
            raise PortNotOursError(f"{what}: nothing of ours listens on 127.0.0.1:{self.port}")


def listener_inodes(port: int) -> set[int]:
    """Socket inodes listening on ``port`` where a connection to 127.0.0.1 can land."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port and address in REACHABLE_FROM_127_0_0_1:
                inodes.add(int(fields[9]))
    return inodes


def socket_holders(inodes: set[int]) -> dict[int, set[int]]:
    """Socket inode -> PIDs holding a descriptor of it (an inode no visible process holds: empty)."""
    holders: dict[int, set[int]] = {inode: set() for inode in inodes}
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    inode = wanted.get(os.readlink(fd))
                    if inode is not None:
                        holders[inode].add(int(proc.name))
    return holders


def family(pid: int) -> set[int]:
    """``pid`` and every process descended from it (a launcher's JVM, a server's forked workers)."""
    children: dict[int, set[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The command name (field 2) is in parentheses and may hold spaces.
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, set()).add(int(proc.name))
    members, todo = set(), [pid]
    while todo:
        member = todo.pop()
        if member not in members:
            members.add(member)
            todo.extend(children.get(member, ()))
    return members


def port_ownership(port: int, owner: int) -> PortOwnership:
    """
    The listeners on 127.0.0.1:``port``: held by ``owner``'s family, or by anyone else.

    ``owner`` is a server process we started (its descendants count as ours), or this process for
    a server on a thread of ours (then only this process counts: the servers it started as child
    processes are not that server).
    """
    inodes = listener_inodes(port)
    if not inodes:  # the common case while a server starts: skip the walk through /proc
        return PortOwnership(port=port, ours=frozenset(), foreign=())
    members = {owner} if owner == os.getpid() else family(owner)
    ours: set[int] = set()
    foreign: list[str] = []
    for inode, pids in sorted(socket_holders(inodes).items()):
        if pids & members:
            ours |= pids & members
        elif pids:
            foreign.extend(f"pid {pid} ({_cmdline(pid)})" for pid in sorted(pids))
        else:
            foreign.append(f"socket inode {inode} of a process this user cannot see")
    return PortOwnership(port=port, ours=frozenset(ours), foreign=tuple(foreign))


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        return argv.decode(errors="replace")[:120].strip()
    return "exited"
