"""A TCP port on 127.0.0.1 that no one holds now, for a test's ``MASTER_PORT``: the operating system's pick
(a socket bound to port 0), so two test runs on one machine (two checkouts, two CI jobs) do not meet on a
fixed port. ``tests/`` is on ``sys.path``: ``from free_port import free_port``."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
