"""An ephemeral PostgreSQL for one test session, from the server binaries installed on this machine.

tests/conftest.py starts one when the session starts (before collection), unless
SPECWATCH_TEST_POSTGRES_URL already names a server: the newest /usr/lib/postgresql/*/bin (else the
directory of `pg_ctl` on the PATH), as the `postgres` user when run as root (the server refuses root),
on a free loopback port (two suites at once do not collide), its data in a temporary directory, fsync off.
It is stopped and removed when the session ends, Ctrl-C included; a server left behind by a killed session
(its owner's pid is gone) is stopped and removed by the next one.

Why the system binaries and not `pgserver` (PyPI: PostgreSQL in a wheel): measured here, pgserver 0.1.4
installs in 3 s (62 MB) and starts in 0.5 s; these binaries start in 0.5 s (initdb included) and stop
in 0.13 s, so speed does not decide. The binaries are the PostgreSQL a Debian deployment runs (15 here,
where pgserver bundles 16.2), `make test` installs them as root (scripts/test-deps), and they add nothing
to the dev extra, whereas pgserver is a one-author package last released in 2024 that serves a Unix
socket only, takes a machine-wide lock in the user's home and, as root, creates a system user of its own.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from specwatch.common.procs import free_port

ENV = "SPECWATCH_TEST_POSTGRES_URL"
MISSING = f"PostgreSQL server binaries not found: apt-get install postgresql (or set {ENV})"
PREFIX = "specwatch-pg-"
DATABASE = "specwatch_test"


class PostgresError(RuntimeError):
    pass


def find_bin_dir() -> Path | None:
    """The newest Debian server directory, else wherever `pg_ctl` is on the PATH (Fedora, Homebrew)."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    if found:
        return max(found, key=lambda d: [int(x) for x in d.parent.name.split(".") if x.isdigit()])
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl and (Path(pg_ctl).parent / "initdb").is_file():
        return Path(pg_ctl).parent
    return None


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser") is None:
        raise PostgresError("running as root, PostgreSQL must run as `postgres`: runuser not found (util-linux)")
    return ["runuser", "-u", "postgres", "--", *cmd]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EphemeralPostgres:
    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root: Path | None = None
        self.url = ""
        self.start_s = self.stop_s = 0.0

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(_as_server_user(list(args)), capture_output=True, text=True, timeout=120)

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess:
        return self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args)

    def start(self) -> str:
        """Start the server and create the test database; the URL for SQLAlchemy (psycopg 3)."""
        reap_stale()
        started = time.monotonic()
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / "owner").write_text(str(os.getpid()))
        if os.geteuid() == 0:
            try:
                shutil.chown(self.root, "postgres", "postgres")
            except LookupError as exc:
                raise PostgresError(f"running as root, PostgreSQL must run as `postgres`: {exc}") from exc
        init = self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
        )
        if init.returncode != 0:
            raise PostgresError(f"initdb failed ({self.bin_dir}): {init.stderr.strip()[-1000:]}")
        for _ in range(3):  # a port taken between free_port() and the bind: try another
            port = free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.root}"
            options += " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
            log = self.root / "log"
            ctl = self._pg_ctl("-l", str(log), "-w", "-t", "60", "-o", options, "start")
            if ctl.returncode == 0:
                break
            tail = log.read_text(errors="replace")[-1000:] if log.exists() else ctl.stderr
            if "could not bind" not in tail and "in use" not in tail:
                raise PostgresError(f"PostgreSQL did not start ({self.bin_dir}); its log: {tail.strip()}")
        else:
            raise PostgresError(f"PostgreSQL found no free port in 3 tries; its log: {tail.strip()}")
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as c:
                c.execute(f"CREATE DATABASE {DATABASE}")
        except psycopg.Error as exc:
            raise PostgresError(f"PostgreSQL started but CREATE DATABASE failed: {exc}") from exc
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DATABASE}"
        self.start_s = time.monotonic() - started
        return self.url

    def stop(self) -> None:
        """Stop the server (immediate: its data is thrown away) and remove its directory."""
        if self.root is None:
            return
        started = time.monotonic()
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        self.stop_s = time.monotonic() - started

    def describe(self) -> str:
        version = self.bin_dir.parent.name if self.bin_dir.parent.name[:1].isdigit() else str(self.bin_dir)
        return (
            f"PostgreSQL {version} started for this session ({self.bin_dir}): "
            f"start {self.start_s:.2f} s, stop {self.stop_s:.2f} s"
        )


def reap_stale() -> None:
    """Stop and remove the servers of sessions that were killed before their teardown ran."""
    for root in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        try:
            owner = int(Path(root, "owner").read_text())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        bin_dir = find_bin_dir()
        if bin_dir and Path(root, "data", "postmaster.pid").exists():
            server = EphemeralPostgres(bin_dir)
            server.root = Path(root)
            server.stop()
        else:
            shutil.rmtree(root, ignore_errors=True)
