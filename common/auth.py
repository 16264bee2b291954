"""The one bearer-token scheme of every service: roles `ingest`, `read`, `admin`, several tokens
per role (rotation), optionally bound to a tenant."""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from specwatch.common.errors import UsageError


def listed_tokens(tokens: str | None) -> list[str]:
    """The tokens of a comma-separated list (several at once: rotation), blanks dropped."""
    return [t.strip() for t in (tokens or "").split(",") if t.strip()]


def first_token(tokens: str | None) -> str | None:
    """The collector takes several comma-separated tokens (rotation); a producer sends the first."""
    return next(iter(listed_tokens(tokens)), None)


ROLES = ("ingest", "read", "admin")
ROLE_ENV = {role: f"SPECWATCH_{role.upper()}_TOKEN" for role in ROLES}


@dataclass(frozen=True)
class Grant:
    """What a token allows: its role (`admin` includes `read`), the tenant it is bound to, if any, and
    for a tenant-bound ingest token the instances it may write (docs/security.md: nothing else)."""

    role: str
    tenant: str | None = None
    instances: frozenset[str] = frozenset()

    def allows(self, role: str) -> bool:
        return self.role == role or (self.role == "admin" and role == "read")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class TokenTable:
    """Bearer tokens by role. Several per role (rotation: add the new one, move clients, drop the old).

    From the environment, `SPECWATCH_INGEST_TOKEN`, `SPECWATCH_READ_TOKEN`, `SPECWATCH_ADMIN_TOKEN`
    (comma-separated), and from a file of lines `ROLE TOKEN [tenant=NAME [instances=A,B]]` (`#` starts a
    comment). An ingest token bound to a tenant must name its instances, and an instance belongs to one
    tenant only: a tenant's data can then fire alerts (and remediation) on its own instances only.
    Tokens are compared in constant time, each against every known token.
    """

    def __init__(self, grants: Mapping[str, Grant] | None = None) -> None:
        self._grants = dict(grants or {})

    @classmethod
    def from_sources(cls, env: Mapping[str, str] | None = None, path: Path | str | None = None) -> TokenTable:
        env = os.environ if env is None else env
        grants = {token: Grant(role) for role, name in ROLE_ENV.items() for token in listed_tokens(env.get(name))}
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
        if fields := line.split("#", 1)[0].split():
            grants[fields[1] if len(fields) > 1 else ""] = _grant(fields, f"{path}:{number}")
    _check_instance_owners(grants.values(), path)
    return grants


def _grant(fields: list[str], where: str) -> Grant:
    """One line's grant: `ROLE TOKEN [tenant=NAME [instances=A,B]]`; UsageError saying what is wrong."""
    options = dict(field.partition("=")[::2] for field in fields[2:])
    tenant, instances = options.get("tenant"), frozenset(filter(None, options.get("instances", "").split(",")))
    if (
        len(fields) < 2
        or fields[0] not in ROLES
        or len(options) != len(fields) - 2
        or not set(options) <= {"tenant", "instances"}
        or not all(options.values())
    ):
        roles = ", ".join(ROLES)
        raise UsageError(f"{where}: expected 'ROLE TOKEN [tenant=NAME [instances=A,B]]' with ROLE one of {roles}")
    if fields[0] == "ingest" and tenant and not instances:
        raise UsageError(f"{where}: an ingest token bound to a tenant must name its instances=A,B (docs/security.md)")
    if instances and (fields[0] != "ingest" or not tenant):
        raise UsageError(f"{where}: instances= binds a tenant's ingest token (give tenant= too)")
    return Grant(fields[0], tenant, instances)


def _check_instance_owners(grants, path: Path) -> None:
    """An instance bound to two tenants would let each fire remediation on the other's engine."""
    owner: dict[str, str] = {}
    for grant in grants:
        for instance in grant.instances:
            if owner.setdefault(instance, grant.tenant) != grant.tenant:
                raise UsageError(
                    f"{path}: instance {instance!r} is bound to tenants {owner[instance]!r} and {grant.tenant!r}"
                )
