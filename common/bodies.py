"""Bodies read up to a byte limit, so no client or upstream can make a server buffer without bound."""

from __future__ import annotations

from collections.abc import AsyncIterable


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
