"""A real PostgreSQL server for the team-store tests: a cluster of its own in a temporary
directory, on a free loopback port, trusted local connections, stopped and removed afterwards.

Debian's ``postgresql`` package (tools/system-packages installs it) provides the binaries;
without it the tests that need a server skip. PostgreSQL refuses to run as root, so under root
(CI, containers) the server runs as the package's ``postgres`` user.
"""
from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tests.browser_harness import _free_port


def bindir() -> Path | None:
    """The newest installed PostgreSQL's binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@contextmanager
def postgres(timeout_s: float = 60) -> Iterator[Callable[[], str]]:
    """Start a server; yield a function that makes a new database on it and returns its DuckLake
    catalog connection ``postgres:dbname=... host=127.0.0.1 port=... user=postgres`` (a database
    holds one team store's catalog)."""
    bins = bindir()
    if bins is None:
        raise FileNotFoundError("no PostgreSQL server binaries (Debian's postgresql package)")
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise FileNotFoundError("running as root and no 'postgres' user to run the server "
                                    "as") from exc
    root = Path(tempfile.mkdtemp(prefix="agentrl-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chown(sock, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    run = dict(check=True, capture_output=True, timeout=timeout_s)
    try:
        subprocess.run(_as_server_user([str(bins / "initdb"), "-D", str(data), "-U", "postgres",
                                        "--auth=trust", "-E", "UTF8", "--no-sync"]), **run)
        subprocess.run(_as_server_user([
            str(bins / "pg_ctl"), "-D", str(data), "-w", "-t", str(int(timeout_s)),
            "-l", str(root / "log"), "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200", "start"]), **run)
        made = itertools.count()

        def new_catalog() -> str:
            dbname = f"agentrl{next(made)}"
            subprocess.run([str(bins / "createdb") if (bins / "createdb").exists()
                            else "createdb", "-h", "127.0.0.1", "-p", str(port), "-U",
                            "postgres", dbname], **run)
            return f"postgres:dbname={dbname} host=127.0.0.1 port={port} user=postgres"
        try:
            yield new_catalog
        finally:
            subprocess.run(_as_server_user([str(bins / "pg_ctl"), "-D", str(data), "-m", "fast",
                                            "-w", "stop"]), capture_output=True,
                           timeout=timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
