"""Mergeable latency quantiles: DDSketch bins with a compact, numpy-friendly encoding.

The key mapping is the `ddsketch` package's `LogarithmicMapping` at a relative accuracy of
1%: a value v > 0 falls in bin k = ceil(log_gamma(v)), gamma = 1.01 / 0.99, and a quantile
read back is within 1% of the exact value at that rank (the sketch's guarantee). Zeros are
counted apart; latencies are never negative (the telemetry contract). Counts are integers, so
merging sketches (adding their bins) is exact: the merge of per-second sketches equals the
sketch of all their values.

Quantiles are read like numpy's default (linear interpolation between the values at the two
ranks either side of q * (count - 1)), each rank's value as DDSketch's `get_quantile_value`
gives it: so a sketch quantile is within 1% of the exact one the raw-row path computes, even on
a handful of values where the two ranks lie far apart.

Why an own encoding rather than the package's protobuf: a window merges thousands of stored
sketches, and the protobuf form (a map of bin -> float count) decodes in Python one entry at a
time and needs the protobuf runtime. Here a sketch is a fixed little-endian header (version,
count width, zero count, first bin) then one unsigned count per bin from the first occupied bin
to the last: `np.frombuffer` reads it in microseconds, the width (1, 2, 4 or 8 bytes) follows
the largest count, and the version byte lets the format change later.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from ddsketch.mapping import LogarithmicMapping

RELATIVE_ACCURACY = 0.01
MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
_VERSION = 1
_HEADER = struct.Struct("<BBqq")  # version, bytes per count, zero count, first bin's key
_WIDTHS = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_HEADER_DTYPE = np.dtype([("version", "u1"), ("width", "u1"), ("zeros", "<i8"), ("min_key", "<i8")])  # _HEADER


@dataclass(frozen=True)
class Bins:
    """A sketch: `counts[i]` values fell in bin `min_key + i`; `zeros` values were 0."""

    zeros: int = 0
    min_key: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def count(self) -> int:
        return self.zeros + int(self.counts.sum())


EMPTY = Bins()


def keys(values: np.ndarray) -> np.ndarray:
    """The mapping's bin key of each value > 0 (vectorised `MAPPING.key`)."""
    return np.ceil(np.log2(values) * MAPPING._multiplier + MAPPING._offset).astype(np.int64)


def from_values(values: np.ndarray) -> Bins:
    """The sketch of `values` (NaN ignored)."""
    values = values[~np.isnan(values)]
    positive = values[values > MAPPING.min_possible]
    zeros = int(values.size - positive.size)
    if not positive.size:
        return Bins(zeros) if zeros else EMPTY
    k = keys(positive)
    low = int(k.min())
    return Bins(zeros, low, np.bincount(k - low).astype(np.int64))


def merge(sketches: Iterable[Bins]) -> Bins:
    """The sketch of the union of the sketches' values."""
    present = [s for s in sketches if s.count]
    if not present:
        return EMPTY
    occupied = [s for s in present if s.counts.size]
    zeros = sum(s.zeros for s in present)
    if not occupied:
        return Bins(zeros)
    low = min(s.min_key for s in occupied)
    counts = np.zeros(max(s.min_key + s.counts.size for s in occupied) - low, dtype=np.int64)
    for s in occupied:
        counts[s.min_key - low : s.min_key - low + s.counts.size] += s.counts
    return Bins(zeros, low, counts)


def merge_encoded(blobs: Sequence[bytes | None], group: np.ndarray, n: int) -> list[Bins]:
    """The merged sketch of each of `n` groups' stored sketches (`blobs[i]` belongs to group
    `group[i]`): the same Bins as `merge` of the decoded pieces, decoded and added in numpy (the
    headers read as one structured array, each count width's bins as one array, added into one
    row of bins per group with `np.bincount`) rather than sketch by sketch."""
    present = [i for i, blob in enumerate(blobs) if blob is not None]
    pieces = [blobs[i] for i in present]
    group = np.asarray(group, dtype=np.int64)[present]
    headers = np.frombuffer(b"".join(blob[: _HEADER.size] for blob in pieces), dtype=_HEADER_DTYPE)
    if np.any(headers["version"] != _VERSION):
        raise ValueError(f"sketch encoding version {sorted(set(headers['version'].tolist()))} is not {_VERSION}")
    zeros = np.zeros(n, dtype=np.int64)
    np.add.at(zeros, group, headers["zeros"])
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    sizes = (lengths - _HEADER.size) // headers["width"]
    lows = headers["min_key"]
    occupied = sizes > 0
    if not occupied.any():
        return [Bins(int(z)) if z else EMPTY for z in zeros]
    low = int(lows[occupied].min())
    width = int((lows + sizes)[occupied].max()) - low
    first_slots = group * width + lows - low  # where each sketch's first bin goes in the flat rows
    flat = np.zeros(n * width)
    for byte_width, dtype in _WIDTHS.items():
        chosen = np.flatnonzero(occupied & (headers["width"] == byte_width))
        if chosen.size:
            counts = np.frombuffer(b"".join(pieces[i][_HEADER.size :] for i in chosen), dtype=dtype)
            slots = np.repeat(first_slots[chosen] - (np.cumsum(sizes[chosen]) - sizes[chosen]), sizes[chosen])
            # float weights add integer counts exactly below 2**53 values per bin
            flat += np.bincount(slots + np.arange(slots.size), weights=counts, minlength=n * width)
    return [_trimmed(int(zeros[g]), low, flat[g * width : (g + 1) * width]) for g in range(n)]


def _trimmed(zeros: int, low: int, counts: np.ndarray) -> Bins:
    """Bins from counts over keys low.., cut to the first and last occupied key."""
    occupied = np.flatnonzero(counts)
    if not occupied.size:
        return Bins(zeros) if zeros else EMPTY
    first, last = int(occupied[0]), int(occupied[-1])
    return Bins(zeros, low + first, np.rint(counts[first : last + 1]).astype(np.int64))


def value_at_rank(sketch: Bins, rank: int) -> float:
    """The representative value of the bin holding the value of 0-based `rank` in sorted order
    (DDSketch's `get_quantile_value` at an integer rank)."""
    if rank < sketch.zeros:
        return 0.0
    index = int(np.searchsorted(np.cumsum(sketch.counts), rank - sketch.zeros, side="right"))
    return float(MAPPING.value(sketch.min_key + min(index, sketch.counts.size - 1)))


def quantile(sketch: Bins, q: float) -> float | None:
    """The q-quantile with numpy's default (linear) interpolation between the values at the ranks
    either side of q * (count - 1); None when empty. Each is within 1% of the exact value at its
    rank, so their weighted mean is within 1% of numpy's exact quantile."""
    total = sketch.count
    if not total:
        return None
    position = q * (total - 1)
    below = math.floor(position)
    low = value_at_rank(sketch, below)
    if position == below:
        return low
    return low + (position - below) * (value_at_rank(sketch, below + 1) - low)


def encode(sketch: Bins) -> bytes | None:
    """The stored form (None for an empty sketch)."""
    if not sketch.count:
        return None
    largest = int(sketch.counts.max()) if sketch.counts.size else 0
    width = next(w for w in _WIDTHS if largest < 1 << (8 * w))
    header = _HEADER.pack(_VERSION, width, sketch.zeros, sketch.min_key)
    return header + sketch.counts.astype(_WIDTHS[width]).tobytes()


def decode(blob: bytes | None) -> Bins:
    if blob is None:
        return EMPTY
    version, width, zeros, min_key = _HEADER.unpack_from(blob)
    if version != _VERSION:
        raise ValueError(f"sketch encoding version {version} is not {_VERSION}")
    counts = np.frombuffer(blob, dtype=_WIDTHS[width], offset=_HEADER.size).astype(np.int64)
    return Bins(zeros, min_key, counts)
