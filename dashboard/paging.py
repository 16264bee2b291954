"""Keyset paging for a page (Streamlit glue): the cursors that led to the page shown, kept in the
session, forgotten when what is listed changes (another window, filter or sort)."""

from __future__ import annotations

import streamlit as st

KEY = "paging"


def cursor(listing: object) -> str | None:
    """The cursor of the page to show for `listing` (any hashable value naming what is listed)."""
    stack = st.session_state.get(KEY)
    if not stack or stack[0] != listing:
        st.session_state[KEY] = stack = [listing]
    return stack[-1] if len(stack) > 1 else None


def page_number() -> int:
    return len(st.session_state.get(KEY, [None]))


def forward(next_cursor: str) -> None:
    st.session_state[KEY].append(next_cursor)


def back() -> None:
    if len(st.session_state.get(KEY, [])) > 1:
        st.session_state[KEY].pop()


def buttons(next_cursor: str | None) -> None:
    """Previous / next page buttons under a listing."""
    left, middle, right = st.columns([1, 2, 1])
    left.button("← Previous", on_click=back, disabled=page_number() == 1, key="page_back")
    middle.caption(f"page {page_number()}")
    right.button("Next →", on_click=forward, args=(next_cursor,), disabled=next_cursor is None, key="page_next")
