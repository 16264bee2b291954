"""The Requests page's reads: a page of requests (GET /v1/requests) and one request in detail
(GET /v1/requests/{id}), as frames a page shows as they are. No Streamlit here.

The listing's filters are the sidebar's (`View`) plus what the page picks (`RequestFilter`); pages
move by the collector's keyset cursor (`next_cursor`), which a page keeps to go back.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import pandas as pd

from specwatch.dashboard.api import View, get, times

SORTS = {"newest first": ("time", "desc"), "oldest first": ("time", "asc")} | {
    f"{label} {way}": (key, order)
    for key, label in (("acceptance", "acceptance"), ("ttft", "TTFT"), ("e2e", "e2e"))
    for way, order in (("lowest first", "asc"), ("highest first", "desc"))
}
STATUSES = ("ok", "error", "cancelled")
FLAGS = ("any", "outlier", "repetition", "collapse")
# mode_reason: why the policy chose the mode (default, canary, load, long_prompt, low_acceptance, alert, ...)
COLUMNS = [
    "request_id", "time", "instance", "drafter", "mode", "mode_reason", "status", "acceptance", "ttft_s", "e2e_s",
    "flags",
]  # fmt: skip


@dataclass(frozen=True)
class RequestFilter:
    """The page's own choices: a SORTS label, status and flag (None: all), rows per page."""

    sort: str = "newest first"
    status: str | None = None
    flag: str | None = None
    limit: int = 50

    def params(self) -> dict:
        sort, order = SORTS[self.sort]
        picked = {"status": self.status, "flag": self.flag}
        return {"sort": sort, "order": order, "limit": self.limit} | {k: v for k, v in picked.items() if v}


@dataclass(frozen=True)
class RequestList:
    rows: pd.DataFrame  # COLUMNS, in the sort's order
    next_cursor: str | None  # None: the last page


def request_list(view: View, chosen: RequestFilter, cursor: str | None = None) -> RequestList:
    """One page of the requests the sidebar's view and the page's choices select."""
    params = view.params() | chosen.params() | ({"cursor": cursor} if cursor else {})
    body = get("/v1/requests", params)
    frame = times(pd.DataFrame(body["rows"]), "started_at")
    if frame.empty:
        return RequestList(pd.DataFrame(columns=COLUMNS), body["next_cursor"])
    frame["flags"] = frame["flags"].map(", ".join)
    return RequestList(frame[COLUMNS], body["next_cursor"])


@dataclass(frozen=True)
class RequestDetail:
    """One request: its headline figures, per-position acceptance, timings, tags and flags."""

    request_id: str
    summary: dict[str, object]  # label -> value, shown as metrics
    positions: pd.DataFrame  # position (1-based), acceptance: share of drafts accepted through it
    timings: pd.DataFrame  # stage, seconds
    tags: pd.DataFrame  # key, value
    flags: pd.DataFrame  # flag, acceptance, series median, detail


def request_detail(request_id: str) -> RequestDetail:
    body = get(f"/v1/requests/{quote(request_id, safe='')}")
    r = body["record"]
    summary = {
        "acceptance": body["acceptance"],
        "mean acceptance length": body["mean_acceptance_length"],
        "output tokens": r["output_tokens"],
        "device time (s)": r["device_s"],
    }
    per_position = body["position_acceptance"]
    positions = pd.DataFrame({"position": range(1, len(per_position) + 1), "acceptance": per_position})
    stages = {"queue": r["queue_s"], "TTFT": r["ttft_s"], "e2e": r["e2e_s"], "TPOT": body["tpot_s"]}
    stages |= {"draft": r["draft_s"], "verify": r["verify_s"], "device": r["device_s"]}
    timings = pd.DataFrame({"stage": list(stages), "seconds": list(stages.values())})
    tags = pd.DataFrame({"key": list(r["tags"]), "value": list(r["tags"].values())})
    flags = pd.DataFrame(
        [
            {"flag": f["flag"], "acceptance": f["value"], "series median": f["expected"], "detail": str(f["detail"])}
            for f in body["flags"]
        ],
        columns=["flag", "acceptance", "series median", "detail"],
    )
    return RequestDetail(r["request_id"], summary, positions, timings, tags, flags)
