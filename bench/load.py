"""Concurrency sweep: speculation on, off, and the `auto` policy, side by side in one run.

    python bench/load.py [--levels 1 2 4 8] [--rounds 3] [--slots 4] [--max-tokens 64] [--csv out.csv] [--plot out.png]

One engine (bundled model) serves all three modes through its OpenAI API; at each
concurrency level each mode gets the same scenario mix (grounded, code edit, chat), in
`--rounds` short turns per mode (order rotating), and the median turn is reported with
the range of all turns.
Prints throughput and P50/P99 TTFT and e2e per level and mode, the knee (the first
level after which throughput grows by less than 10% while P99 e2e keeps rising), and
whether `auto` stays within 10% of the better of on/off at every level. `--plot` draws
throughput and P99 e2e against concurrency per mode, knees marked.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # engine_harness

from engine_harness import BackgroundServer  # noqa: E402

from specwatch.engine.engine import Engine, EngineConfig  # noqa: E402
from specwatch.engine.policy import Policy, PolicyConfig  # noqa: E402
from specwatch.engine.scheduler import SchedulerConfig  # noqa: E402
from specwatch.traffic import TrafficConfig, run_traffic, summary  # noqa: E402

MODES = {
    "on": (PolicyConfig(load_off=1e9, load_on=1e9 - 1, min_acceptance=0.0, long_prompt_tokens=10**6), "ngram"),
    "off": (PolicyConfig(), None),
    "auto": (PolicyConfig(), "ngram"),
}
SCENARIOS = ("grounded", "code-edit", "chat")


def sweep(engine: Engine, args) -> list[dict]:
    """Per level, `--rounds` rounds of every mode, the mode order rotating each round; a mode's
    row is its median round by throughput (this machine's speed drifts by minutes, so modes
    measured side by side in short turns compare fairly where one long run each would not)."""
    rows = []
    auto_policy = Policy(MODES["auto"][0])  # one engine running through every level keeps what it learned
    for level in args.levels:
        rounds: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for turn in range(args.rounds):
            order = list(MODES)[turn % len(MODES) :] + list(MODES)[: turn % len(MODES)]
            for mode in order:
                rounds[mode].append(measure(engine, level, mode, auto_policy, args))
                print(
                    f"  level {level:>3} round {turn + 1} {mode:<4} "
                    f"{rounds[mode][-1]['output_tokens_per_s']:7.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
        for mode in MODES:
            by_speed = sorted(rounds[mode], key=lambda r: r["output_tokens_per_s"])
            spread = (by_speed[0]["output_tokens_per_s"], by_speed[-1]["output_tokens_per_s"])
            rows.append(
                {
                    "level": level,
                    "mode": mode,
                    **by_speed[len(by_speed) // 2],
                    "tok_s_min": spread[0],
                    "tok_s_max": spread[1],
                }
            )
    return rows


def measure(engine: Engine, level: int, mode: str, auto_policy: Policy, args) -> dict:
    policy, drafter = MODES[mode]
    policy = auto_policy if mode == "auto" else policy
    with BackgroundServer(engine, SchedulerConfig(slots=args.slots, max_queue=max(args.levels) * 2), policy) as server:
        config = TrafficConfig(
            url=server.url,
            scenarios=SCENARIOS,
            duration_s=args.max_seconds,
            max_requests=max(args.min_requests, level),
            concurrency=level,
            max_tokens=args.max_tokens,
            drafter=drafter,
            seed=level,
        )
        overall = summary(asyncio.run(run_traffic(config, progress=io.StringIO())))[0]
    return {k: v for k, v in overall.items() if k != "scenario"}


def knee(rows: list[dict], mode: str) -> int | None:
    points = [r for r in rows if r["mode"] == mode]
    for before, after in zip(points, points[1:]):
        gain = after["output_tokens_per_s"] / max(before["output_tokens_per_s"], 1e-9)
        if gain < 1.10 and (after["e2e_p99_s"] or 0) > (before["e2e_p99_s"] or 0):
            return before["level"]
    return None


def report(rows: list[dict]) -> None:
    def ms(value):
        return "-" if value is None else f"{1000 * value:.0f}"

    print(
        f"\n{'level':>5} {'mode':<5} {'tok/s':>7} {'range':>11} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'e2e p50':>8} {'e2e p99':>8} {'errors':>6}  (ms)"
    )
    for r in rows:
        spread = f"{r['tok_s_min']:.0f}-{r['tok_s_max']:.0f}"
        print(
            f"{r['level']:>5} {r['mode']:<5} {r['output_tokens_per_s']:>7.1f} {spread:>11} "
            f"{ms(r['ttft_p50_s']):>9} {ms(r['ttft_p99_s']):>9} "
            f"{ms(r['e2e_p50_s']):>8} {ms(r['e2e_p99_s']):>8} {r['errors']:>6}"
        )
    for mode in MODES:
        print(f"knee ({mode}): concurrency {knee(rows, mode) or 'not reached'}")
    worst = min(
        auto["output_tokens_per_s"] / max(on["output_tokens_per_s"], off["output_tokens_per_s"], 1e-9)
        for auto, on, off in _by_level(rows)
    )
    print(f"auto vs the better of on/off, worst level: {worst:.2f}x ({'within' if worst >= 0.9 else 'NOT within'} 10%)")


def plot(rows: list[dict], path: Path) -> None:
    """Throughput (left) and P99 end-to-end latency (right) against concurrency, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (tput, lat) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in MODES:
        points = [r for r in rows if r["mode"] == mode]
        levels = [r["level"] for r in points]
        (line,) = tput.plot(levels, [r["output_tokens_per_s"] for r in points], marker="o", label=mode)
        lat.plot(levels, [1000 * (r["e2e_p99_s"] or float("nan")) for r in points], marker="o", label=mode)
        if (at := knee(rows, mode)) is not None:
            tput.axvline(at, color=line.get_color(), linestyle=":", alpha=0.7)
    for ax, title in ((tput, "output tokens/s"), (lat, "P99 end-to-end latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("speculation on / off / auto by concurrency (dotted: knee)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _by_level(rows: list[dict]):
    for level in sorted({r["level"] for r in rows}):
        by_mode = {r["mode"]: r for r in rows if r["level"] == level}
        yield by_mode["auto"], by_mode["on"], by_mode["off"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--min-requests", type=int, default=6, help="per round (at least one per client)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="turns of every mode per level; the median round is reported"
    )
    parser.add_argument("--max-seconds", type=float, default=120.0, help="per level and mode")
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--plot", type=Path, help="PNG of throughput and P99 e2e against concurrency")
    args = parser.parse_args()
    engine = Engine(EngineConfig(instance="bench-load"))
    rows = sweep(engine, args)
    report(rows)
    if args.csv:
        with args.csv.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=[k for k in rows[0] if k != "errors_seen"], extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
