"""Helpers every package shares; imports nothing of ours, so anything may import it.

`UsageError` and `tcp_port` for command lines (a usage error is one line and exit code 2);
`TokenTable`, the one bearer-token scheme of every service (roles `ingest`, `read`, `admin`,
several tokens per role, optionally bound to a tenant); `free_port`, `child_env`, `start_service`
and `start_collector` for starting services as child processes and waiting until they are ready
(`specwatch up`, the tests and the benchmarks), `stop_process` for stopping one."""

from __future__ import annotations

import argparse
import ctypes
import hmac
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

SOURCE_ROOT = Path(__file__).resolve().parents[1]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def tcp_port(value: str) -> int:
    """argparse type for --port options."""
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value!r}")
    return int(value)


def first_token(tokens: str | None) -> str | None:
    """The collector takes several comma-separated tokens (rotation); a producer sends the first."""
    return next((t.strip() for t in (tokens or "").split(",") if t.strip()), None)


class LoadSwitch:
    """Speculation on or off by load, with hysteresis: off above `load_off`, back on below `load_on`,
    at most one switch per `cooldown_s` (the engine's policy and the gateway's router share it;
    the caller holds its own lock)."""

    def __init__(self, load_off: float, load_on: float, cooldown_s: float) -> None:
        self.load_off, self.load_on, self.cooldown_s = load_off, load_on, cooldown_s
        self.allows = True
        self._last_switch = float("-inf")

    def update(self, load: float, now: float) -> bool | None:
        """The new state when `load` switches it now, else None."""
        want = self.allows
        if self.allows and load > self.load_off:
            want = False
        elif not self.allows and load < self.load_on:
            want = True
        if want != self.allows and now - self._last_switch >= self.cooldown_s:
            self.allows, self._last_switch = want, now
            return want
        return None


def add_producer_arguments(parser: argparse.ArgumentParser, spool_dir: Path) -> None:
    """--collector, --collector-token, --spool-dir and --control-token of a server that produces
    telemetry and takes remediation (the engine, the gateway)."""
    parser.add_argument(
        "--collector",
        default=os.environ.get("SPECWATCH_COLLECTOR_URL"),
        help="collector URL for telemetry (default: SPECWATCH_COLLECTOR_URL; none: no telemetry)",
    )
    parser.add_argument(
        "--collector-token",
        default=first_token(os.environ.get("SPECWATCH_INGEST_TOKEN")),
        help="bearer token for the collector's ingest (default: SPECWATCH_INGEST_TOKEN; refused: spooled, not lost)",
    )
    parser.add_argument(
        "--spool-dir", type=Path, default=spool_dir, help=f"telemetry spool while the collector is down ({spool_dir})"
    )
    parser.add_argument(
        "--control-token",
        default=os.environ.get("SPECWATCH_CONTROL_TOKEN"),
        help="bearer token for /v1/control (default: SPECWATCH_CONTROL_TOKEN; unset: the control API is off)",
    )


class TooLarge(Exception):
    """A body past its byte limit (reading stopped there)."""


async def read_capped(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """The chunks joined; TooLarge as soon as they pass `limit` bytes (a request or response body)."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise TooLarge
        parts.append(chunk)
    return b"".join(parts)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StartError(RuntimeError):
    """A child service exited or did not become ready; the message names its log."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment, with the source tree importable and `extra` on top."""
    path = os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def start_service(
    name: str, cmd: list[str], env: dict[str, str], log: Path, ready_url: str, timeout_s: float
) -> subprocess.Popen:
    """Start `cmd` with output appended to `log`; return once `ready_url` answers 200.
    Raises StartError (and kills the child) if it exits first or is not ready in time.
    The child runs in its own session, so a terminal's Ctrl-C reaches only its parent, which stops
    its children in order; and it gets SIGTERM when its parent dies (see `_exit_with_parent`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_exit_with_parent()
        )
    try:
        return _wait_ready(name, process, log, ready_url, timeout_s)
    except BaseException:  # not ready, or Ctrl-C while waiting: no half-started child left behind
        stop_process(process, timeout_s=10)
        raise


def _wait_ready(name: str, process: subprocess.Popen, log: Path, ready_url: str, timeout_s: float) -> subprocess.Popen:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"the {name} exited with code {process.returncode}; see {log} (is its port free?)")
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise StartError(f"the {name} did not answer {ready_url} within {timeout_s:.0f} s; see {log}")


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout_s`."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _exit_with_parent():
    """A preexec_fn asking Linux to send the child SIGTERM when its parent dies, even by SIGKILL
    (prctl PR_SET_PDEATHSIG; strictly, when the parent's thread that started it ends: start services
    from a thread that outlives them). None where there is no prctl: there a killed parent leaves them."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def specwatch_command(*args: str) -> list[str]:
    """`python -m specwatch ARGS...` on this interpreter, so a child runs the same code and environment."""
    return [sys.executable, "-m", "specwatch", *args]


def start_collector(
    port: int, log: Path, db_url: str | None = None, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.Popen:
    """`specwatch collector serve` on 127.0.0.1:`port`, output appended to `log`; returns once /readyz answers 200."""
    cmd = specwatch_command("collector", "serve", "--port", str(port), *(["--db", db_url] if db_url else []))
    return start_service("collector", cmd, child_env(env), log, f"http://127.0.0.1:{port}/readyz", timeout_s)


ROLES = ("ingest", "read", "admin")
ROLE_ENV = {role: f"SPECWATCH_{role.upper()}_TOKEN" for role in ROLES}


@dataclass(frozen=True)
class Grant:
    """What a token allows: its role (`admin` includes `read`), and the tenant it is bound to, if any."""

    role: str
    tenant: str | None = None

    def allows(self, role: str) -> bool:
        return self.role == role or (self.role == "admin" and role == "read")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class TokenTable:
    """Bearer tokens by role. Several per role (rotation: add the new one, move clients, drop the old).

    From the environment, `SPECWATCH_INGEST_TOKEN`, `SPECWATCH_READ_TOKEN`, `SPECWATCH_ADMIN_TOKEN`
    (comma-separated), and from a file of lines `ROLE TOKEN [tenant=NAME]` (`#` starts a comment).
    Tokens are compared in constant time, each against every known token.
    """

    def __init__(self, grants: Mapping[str, Grant] | None = None) -> None:
        self._grants = dict(grants or {})

    @classmethod
    def from_sources(cls, env: Mapping[str, str] | None = None, path: Path | str | None = None) -> TokenTable:
        env = os.environ if env is None else env
        grants = {
            token.strip(): Grant(role)
            for role, name in ROLE_ENV.items()
            for token in env.get(name, "").split(",")
            if token.strip()
        }
        return cls(grants | (_read_token_file(Path(path)) if path else {}))

    @property
    def enabled(self) -> bool:
        """True when any token is configured: then every guarded endpoint needs one."""
        return bool(self._grants)

    def tokens(self, role: str) -> list[str]:
        """The tokens that hold `role` (for a producer started alongside, e.g. by `specwatch up`)."""
        return [token for token, grant in self._grants.items() if grant.role == role]

    def grant(self, authorization: str | None) -> Grant | None:
        """The grant of the header's bearer token, or None when it names no known token."""
        given = (bearer_token(authorization) or "").encode()
        found = None
        for token, grant in self._grants.items():
            if hmac.compare_digest(given, token.encode()):
                found = grant
        return found if given else None


def _read_token_file(path: Path) -> dict[str, Grant]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None
    grants = {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        tenant = fields[2].removeprefix("tenant=") if len(fields) == 3 and fields[2].startswith("tenant=") else None
        if len(fields) not in (2, 3) or fields[0] not in ROLES or (len(fields) == 3 and not tenant):
            raise UsageError(
                f"{path}:{number}: expected 'ROLE TOKEN [tenant=NAME]' with ROLE one of {', '.join(ROLES)}"
            )
        grants[fields[1]] = Grant(fields[0], tenant)
    return grants
