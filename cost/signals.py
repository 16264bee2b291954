"""Cost formulas other packages call instead of holding their own (issue 25 item 9).

excess_ratio(spec_device_s, spec_tokens, plain_device_s, plain_tokens)
    speculation's device seconds per output token over plain decoding's, minus 1: the
    `spec_cost_excess` alert signal (0.1 = 10% dearer). Under the one allocation rule both modes
    on an instance pay the same $ per device-second, so this is the ratio of compute cost per token.
"""

from __future__ import annotations


def excess_ratio(spec_device_s: float, spec_tokens: float, plain_device_s: float, plain_tokens: float) -> float | None:
    """(spec_device_s / spec_tokens) / (plain_device_s / plain_tokens) - 1; None without both modes' work."""
    if spec_tokens <= 0 or plain_tokens <= 0 or plain_device_s <= 0:
        return None
    return (spec_device_s / spec_tokens) / (plain_device_s / plain_tokens) - 1.0
