"""Records every attempt of a process to reach a host that is not this machine, for tests that assert nothing phones
home (tests/test_nothing_phones_home.py).

`install(path)` (from sitecustomize.py, so in every Python process started with this folder on PYTHONPATH) adds a
`sys.addaudithook` hook on the events CPython raises before a name look-up or a connection: `socket.getaddrinfo`,
`socket.gethostbyname`, `socket.connect`, `socket.sendto` and `urllib.Request`. Forked children inherit the hook
(OpenVINO's telemetry sends from a fork). One JSON line per event is appended to the file: a `start` line for each
process (and each fork), an `outside` line for each attempt at a non-loopback host, with the caller's frames.
Audit hooks cannot be removed and see C-level calls of the interpreter's socket module, not a library's own C
sockets (none of the product's libraries sends that way).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import traceback

LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_EVENTS = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.connect",
           "socket.connect_ex", "socket.sendto", "urllib.Request"}


def is_local(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").lower()
    if host in LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _host(event: str, args: tuple) -> object:
    if event == "urllib.Request":
        from urllib.parse import urlsplit

        return urlsplit(args[0]).hostname
    if event in ("socket.connect", "socket.connect_ex", "socket.sendto"):
        address = args[1] if event != "socket.sendto" else args[-1]
        return address[0] if isinstance(address, tuple) else None  # AF_UNIX paths are local
    return args[0]


def install(path: str) -> None:
    busy = False

    def write(record: dict) -> None:
        record.update(pid=os.getpid(), argv=sys.argv[:4])
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record, default=str) + "\n").encode())  # one write: lines never interleave
        finally:
            os.close(fd)

    def hook(event: str, args: tuple) -> None:
        nonlocal busy
        if event not in _EVENTS or busy:
            return
        busy = True
        try:
            host = _host(event, args)
            if not is_local(host):
                write({"kind": "outside", "event": event, "host": str(host),
                       "stack": traceback.format_stack(limit=8)[:-2]})
        finally:
            busy = False

    write({"kind": "start"})
    os.register_at_fork(after_in_child=lambda: write({"kind": "start", "forked": True}))
    sys.addaudithook(hook)


def read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
