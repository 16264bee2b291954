"""The alert rules `specwatch up` runs its demo with: the shipped rules, remediation pointed at this
engine, and the machine-dependent rules set for this machine, each change said in one line.

- Latency: the shipped TTFT SLO (300 ms) is a GPU serving figure; a laptop's CPU misses it in either
  mode, and TTFTP99High's remediation (plain decoding) would then stop all drafting, the early-exit
  phase's included. `up` measures this machine's prefill and decode with a few plain requests of the
  phases' longest prompt at start (`calibrate`) and sets the threshold to `HEADROOM` x what
  `concurrency` clients queued behind one another see (a prefill and a decode step each), never below
  the shipped one: the rule fires when serving degrades, not because the machine is slow.
- Memory: MemoryFragmentationHigh watches reserved / allocated memory, a CUDA caching allocator's
  figure that `defragment` can act on. On a CPU the sampler's figure is the glibc heap's ratio, which
  has no such remedy: not applicable on a CPU, so the rule is left out there.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from specwatch.common.errors import UsageError

HEADROOM = 3.0
CALIBRATION_REQUESTS = 3
CALIBRATION_TOKENS = 24
CPU_ONLY_RULES = ("MemoryFragmentationHigh",)


@dataclass(frozen=True)
class Calibration:
    """This machine's serving speed, from lone plain requests: medians of time to first token (prefill,
    client-side) and of the seconds per output token after it (decode)."""

    prefill_s: float
    decode_s: float
    requests: int

    def ttft_slo_s(self, shipped_s: float, concurrency: int) -> float:
        """The TTFT P99 threshold for `concurrency` clients, two significant digits."""
        return max(shipped_s, float(f"{HEADROOM * concurrency * (self.prefill_s + self.decode_s):.2g}"))


async def calibrate(engine_url: str, scenarios: tuple[str, ...]) -> Calibration:
    """`CALIBRATION_REQUESTS` plain requests, one at a time, of the longest prompt among `scenarios` (the
    phases' traffic: prefill grows with the prompt), stored under the scenario "calibration"."""
    from specwatch.traffic import TrafficConfig, one_request
    from specwatch.workload import PROMPTS

    longest = max(scenarios, key=lambda scenario: len(PROMPTS[scenario]))
    config = TrafficConfig(url=engine_url, scenarios=(longest,), max_tokens=CALIBRATION_TOKENS, drafter=None)
    async with httpx.AsyncClient(base_url=engine_url, timeout=httpx.Timeout(600, connect=10)) as http:
        outcomes = [await one_request(http, config, longest, tag="calibration") for _ in range(CALIBRATION_REQUESTS)]
    timed = [o for o in outcomes if o.ok and o.ttft_s is not None and o.tokens > 1]
    if not timed:
        errors = ", ".join(sorted({o.error or "no tokens" for o in outcomes}))
        raise UsageError(f"the engine answered no calibration request ({errors}); see its log")
    decode = [(o.e2e_s - o.ttft_s) / (o.tokens - 1) for o in timed]
    return Calibration(statistics.median(o.ttft_s for o in timed), statistics.median(decode), len(timed))


def write_rules(
    data_dir: Path, engine_url: str, on_cpu: bool, speed: Calibration, concurrency: int
) -> tuple[Path, list[str]]:
    """The demo's rules file under `data_dir`, and the lines that say what differs from the shipped rules."""
    from specwatch.alerts.rules import DEFAULT_RULES

    rules = yaml.safe_load(DEFAULT_RULES.read_text())
    rules["remediation"]["engines"] = {"*": engine_url}
    said = [_set_ttft(rules, speed, concurrency)]
    if on_cpu:
        rules["rules"] = [rule for rule in rules["rules"] if rule["name"] not in CPU_ONLY_RULES]
        said.append(
            "MemoryFragmentationHigh: not applicable on a CPU (reserved / allocated is a CUDA allocator's "
            "figure; the CPU heap ratio has no defragment remedy), left out"
        )
    path = data_dir / "alert-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path, [f"alerts     {line}" for line in said] + [f"alerts     rules: {path}"]


def _set_ttft(rules: dict, speed: Calibration, concurrency: int) -> str:
    ttft = next(rule for rule in rules["rules"] if rule["name"] == "TTFTP99High")
    shipped = float(ttft["threshold"])
    slo = speed.ttft_slo_s(shipped, concurrency)
    ttft["threshold"] = slo
    ttft["summary"] = ttft["summary"].replace(f"> {shipped:g} s", f"> {slo:g} s (this machine's demo SLO)")
    measured = (
        f"this machine: prefill {speed.prefill_s * 1000:,.0f} ms, decode {speed.decode_s * 1000:,.0f} ms/token "
        f"(median of {speed.requests} plain requests of the longest prompt the phases send)"
    )
    if slo == shipped:
        return f"{measured}; TTFTP99High stays at {shipped:g} s"
    return (
        f"{measured}; TTFTP99High set from {shipped:g} s to {slo:g} s "
        f"= {HEADROOM:g} x {concurrency} clients x (prefill + one decode step)"
    )
