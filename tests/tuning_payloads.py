"""Records for the tuner's tests: alone (level 1: a step drafting 4 costs 10% more than a plain one, high
acceptance) speculation pays; 8 at a time (level 8: a step drafting 4 costs 4 plain steps, low acceptance)
plain wins. Every decoding step of a speculative request drafted gamma tokens."""

from __future__ import annotations

from collector_payloads import T0, plain_request_dict, request_dict


def spec(i: int, start: float, per_position: list[int], drafts: int, step_s: float, **more) -> dict:
    """A speculative request whose every decoding step drafted gamma tokens and took step_s."""
    gamma, accepted = len(per_position), sum(per_position)
    output = 1 + drafts + accepted
    e2e = 0.05 + drafts * step_s
    counts = dict(num_drafts=drafts, num_draft_tokens=drafts * gamma, num_accepted_tokens=accepted)
    return request_dict(i, started_at=start, ttft_s=0.05, e2e_s=e2e, output_tokens=output, gamma=gamma,
                        accepted_per_position=per_position, **counts, **more)  # fmt: skip


def plain(i: int, start: float, steps: int, step_s: float) -> dict:
    return plain_request_dict(i, started_at=start, ttft_s=0.05, e2e_s=0.05 + steps * step_s, output_tokens=steps + 1)


def records(t0: float = T0) -> list[dict]:
    found = []
    for i in range(25):  # one at a time, 10 s apart: level 1; k = 4 costs 10% more than a plain step
        found.append(spec(i, t0 + 10 * i, [14 - i % 2, 12, 10, 8], 16, 0.044))
        found.append(plain(100 + i, t0 + 5 + 10 * i, 64, 0.040))
    for burst in range(6):  # 4 speculative + 4 plain together: level 8; k = 4 costs 4 plain steps
        at = t0 + 1000 + 20 * burst
        found += [spec(200 + 8 * burst + j, at, [4 + j % 2, 1, 0, 0], 16, 0.2) for j in range(4)]
        found += [plain(300 + 8 * burst + j, at, 64, 0.05) for j in range(4)]
    return found
