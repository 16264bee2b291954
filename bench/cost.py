"""Cost per 1M output tokens against concurrency, speculation on and off, on the bundled engine.

    python bench/cost.py [--levels 1 2 4 8 16] [--requests-per-client 12 | --seconds S] [--max-tokens 64]
                         [--gpu-type cpu-laptop] [--json out.json]

One engine (bundled model, batched verification, `--slots` >= the highest level) serves, at
each concurrency level, two arms one after the other: speculative (n-gram drafter, always on)
and plain (no drafter). Each arm is a closed loop of `level` clients sending the sample prompts
(grounded, code edit, chat). The engine's telemetry records go into a SQLite collector store in
a temporary directory, and `cost.concurrency.concurrency_costs` prices them: GPU-hours per 1M
tokens from the requests' device seconds, $ per 1M tokens, and the crossover concurrency.

Independently, the bench times each arm's run (first request sent -> last response): instance
hours per 1M tokens = span / tokens. The ratio device / instance is the share of the instance's
time that forwards ran; the rest is the idle line (HTTP, tokenising, scheduling, and the gap
between a client's response and its next request, when at low concurrency the instance has
nothing to run). At concurrency 8 the instance is saturated and the two must agree within 15%.

Then the model against the measurement (`cost.calibration`): the engine's step-cost curve, measured over
the sweep, goes into the store as its `step_costs` event, and at each level the per-request model
(cost.breakeven's units) predicts speculation's device-throughput ratio from the curve at that batch size
and the level's measured acceptance. Printed beside the measured ratio and latency speed-up, with the
error (goal: within 15% at every level) and the knee: the crossover, stated only where the 95% intervals
of the two arms' $ per 1M tokens clear.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # load: bench/load.py
sys.path.append(str(REPO / "tests"))  # engine_harness

from engine_harness import BackgroundServer  # noqa: E402
from load import MODES, SCENARIOS  # noqa: E402

from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.ingest.store import Store  # noqa: E402
from specwatch.collector.reads.queries import Filters, Window  # noqa: E402
from specwatch.cost.concurrency import ConcurrencyCosts, concurrency_costs_at  # noqa: E402
from specwatch.cost.inputs import load_prices  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig  # noqa: E402
from specwatch.engine.scheduler import SchedulerConfig  # noqa: E402
from specwatch.engine.step_cost_events import KIND as STEP_COSTS  # noqa: E402
from specwatch.engine.step_cost_events import curve_points, event_detail  # noqa: E402
from specwatch.telemetry.schema import EngineEvent, IngestBatch  # noqa: E402
from specwatch.traffic import Tally, TrafficConfig, run_traffic  # noqa: E402

INSTANCE = "bench-cost"
ARMS = {"speculative": "on", "autoregressive": "off"}  # record mode -> bench/load.py's mode
SATURATED_LEVEL = 8  # from here the instance is busy all the time: device and instance time must agree
TOLERANCE = 0.15
FILTERS = Filters(instance=INSTANCE)


@dataclass(frozen=True)
class ArmRun:
    """What the bench itself measured of one arm at one level, client-side; `window` (epoch s)
    holds just this run's requests."""

    level: int
    mode: str
    requests: int
    errors: int
    output_tokens: int
    span_s: float
    window: Window

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.span_s

    @property
    def instance_hours_per_mtok(self) -> float:
        return hours_per_mtok(self.span_s, self.output_tokens)


def hours_per_mtok(seconds: float, tokens: int) -> float:
    return seconds / max(tokens, 1) * 1e6 / 3600


async def timed_traffic(config: TrafficConfig) -> tuple[Tally, float]:
    """The closed loop, and its span: from just before the first request is sent to the last
    response (the clients gather, so run_traffic returns right after the last one ends)."""
    tally = Tally()
    await run_traffic(config, progress=io.StringIO(), tally=tally)
    return tally, time.monotonic() - tally.started


def serve_arm(engine: Engine, store: Store, level: int, mode: str, args) -> ArmRun:
    """One arm at one level on a fresh scheduler; its records go into `store` after the run (an
    insert per record on the scheduler's thread would slow the engine being measured)."""
    policy, drafter = MODES[ARMS[mode]]
    scheduler = SchedulerConfig(slots=args.slots, max_queue=2 * args.slots)
    started = time.time()
    with BackgroundServer(engine, scheduler, policy) as server:
        config = TrafficConfig(
            url=server.url,
            scenarios=SCENARIOS,
            duration_s=args.seconds or 1e9,
            max_requests=10**9 if args.seconds else level * args.requests_per_client,
            concurrency=level,
            max_tokens=args.max_tokens,
            drafter=drafter,
            seed=level,
        )
        tally, span_s = asyncio.run(timed_traffic(config))
        records = list(server.records)
    store.insert(IngestBatch(requests=records))
    ok = [o for o in tally.outcomes if o.ok]
    tokens = sum(o.tokens for o in ok)
    window = Window(started, time.time())
    return ArmRun(level, mode, len(tally.outcomes), len(tally.outcomes) - len(ok), tokens, span_s, window)


def sweep(engine: Engine, store: Store, args) -> tuple[list[ArmRun], Window]:
    """Every level, both arms, after one warm-up request per arm (stored, but before the window the
    model is asked about: torch's first forwards are slow)."""
    for mode in ARMS:
        serve_arm(
            engine, store, 1, mode, argparse.Namespace(**vars(args) | {"requests_per_client": 1, "seconds": None})
        )
    started = time.time()
    runs = []
    for level in args.levels:
        for mode in ARMS:
            runs.append(serve_arm(engine, store, level, mode, args))
            print(f"  level {level:>3} {mode:<14} {runs[-1].tokens_per_s:7.1f} tok/s", file=sys.stderr, flush=True)
    curve = event_detail(curve_points(engine.step_costs))  # as the engine's StepCostEvents would publish it
    store.insert(IngestBatch(events=[EngineEvent(instance=INSTANCE, at=time.time(), kind=STEP_COSTS, detail=curve)]))
    return runs, Window(started, time.time() + 1)


def run_row(db, run: ArmRun, prices, gpu_type: str) -> dict:
    """One run's span beside the device time the cost model prices for the same requests. The model
    is asked over the run's own window and its rows summed: it bins requests by their own mean
    in-flight count, so a run's tail (fewer left in flight) lands a level down, but it is this run's
    device time all the same."""
    costs = concurrency_costs_at(db, run.window, prices, gpu_type=gpu_type, filters=FILTERS)
    device_s = sum(row.device_s for row in costs.rows)
    tokens = sum(row.output_tokens for row in costs.rows)
    gpu_hours = hours_per_mtok(device_s, tokens)
    return asdict(run) | {
        "tokens_per_s": run.tokens_per_s,
        "instance_hours_per_mtok": run.instance_hours_per_mtok,
        "model_output_tokens": tokens,
        "device_s": device_s,
        "gpu_hours_per_mtok": gpu_hours,
        "usd_per_mtok": gpu_hours * costs.gpu_hour_usd,
        "device_over_instance": gpu_hours / run.instance_hours_per_mtok,
    }


def report(rows: list[dict], costs: ConcurrencyCosts, gpu_type: str) -> None:
    print(
        f"\n{'level':>5} {'arm':<14} {'requests':>8} {'tokens':>7} {'tok/s':>7} "
        f"{'GPU-h/1M (device)':>18} {'inst-h/1M (span)':>17} {'ratio':>6} {'idle':>5} {'$/1M':>8}"
    )
    for r in rows:
        print(
            f"{r['level']:>5} {r['mode']:<14} {r['requests']:>8} {r['output_tokens']:>7} {r['tokens_per_s']:>7.1f} "
            f"{r['gpu_hours_per_mtok']:>18.3f} {r['instance_hours_per_mtok']:>17.3f} "
            f"{r['device_over_instance']:>6.2f} {1 - r['device_over_instance']:>5.0%} {r['usd_per_mtok']:>8.4f}"
        )
    print(
        f"($ at the price table's {gpu_type} row. ratio = device / instance time; idle = 1 - ratio, the idle\n"
        " line: instance time in which no forward ran (HTTP, tokenising, scheduling, and each client's gap\n"
        " between a response and its next request, in which at low concurrency the instance has nothing to\n"
        f" run). From concurrency {SATURATED_LEVEL} it is saturated: the ratio must be within {TOLERANCE:.0%} of 1.)"
    )
    for r in rows:
        if r["model_output_tokens"] != r["output_tokens"]:
            print(
                f"note: level {r['level']} {r['mode']}: {r['model_output_tokens']} tokens stored, "
                f"{r['output_tokens']} received"
            )
        if r["level"] >= SATURATED_LEVEL:
            verdict = "within" if abs(r["device_over_instance"] - 1) <= TOLERANCE else "NOT within"
            print(f"level {r['level']} {r['mode']}: device / instance time {r['device_over_instance']:.2f} ({verdict})")
    print_model(costs)


def print_model(costs: ConcurrencyCosts) -> None:
    """The cost model over the whole sweep, each request at the level it ran at, and the crossover."""
    print(
        f"\ncost model, requests binned by their mean in-flight count:\n{'level':>5} {'arm':<14} {'requests':>8} "
        f"{'tokens':>7} {'GPU-h/1M':>9} {'$/1M':>8} {'accept':>6}"
    )
    for row in costs.rows:
        accept = "-" if row.acceptance_rate is None else f"{row.acceptance_rate:.2f}"
        print(
            f"{row.level:>5} {row.mode:<14} {row.requests:>8} {row.output_tokens:>7} "
            f"{row.gpu_hours_per_mtok:>9.3f} {row.usd_per_mtok:>8.4f} {accept:>6}"
        )
    crossover = "none within the levels run" if costs.crossover is None else f"concurrency {costs.crossover}"
    print(f"crossover (speculation costs more per 1M tokens from): {crossover}")
    for group in costs.groups:
        print_calibration(group)


def print_calibration(group) -> None:
    """The per-request model beside the measured ratios, per level, and the knee."""
    print(
        f"\n{group.drafter} on {group.gpu_type}: the per-request model against the measurement (cost.calibration;"
        f" step times from {_times_from(group)})\n"
        f"{'level':>5} {'gamma':>5} {'E':>5} {'t_plain ms':>10} {'t_round ms':>10} {'t_draft ms':>10} "
        f"{'measured device ratio':>21} {'model':>6} {'error':>6} {'latency speed-up':>16}"
    )
    for c in group.calibration:
        if c.model_ratio is None:
            print(f"{c.level:>5} model: {c.why}; measured device ratio {_x(c.measured_ratio)}")
            continue
        within = "" if abs(c.error) <= TOLERANCE else "  (outside 15%)"
        print(
            f"{c.level:>5} {c.gamma:>5.2f} {c.mean_acceptance_length:>5.2f} {1e3 * c.t_plain_s:>10.1f} "
            f"{1e3 * c.t_round_s:>10.1f} {1e3 * c.t_draft_s:>10.3f} {_x(c.measured_ratio):>21} "
            f"{_x(c.model_ratio):>6} {c.error:>+6.0%} {_x(c.latency_speedup):>16}"
            f"  on the curve alone {_x(c.curve_ratio)}, decode only {_x(c.decode_ratio)}{within}"
        )
    errors = [abs(c.error) for c in group.calibration if c.error is not None]
    if errors:
        print(f"largest model error: {max(errors):.0%} (goal: <= {TOLERANCE:.0%} at every level)")
    knee = group.crossover
    print(f"knee: {'concurrency ' + str(knee.level) if knee.level else 'none'} ({knee.reason})")


def _times_from(group) -> str:
    return ", ".join(sorted({c.times_from for c in group.calibration if c.times_from})) or "-"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def power_of_two(text: str) -> int:
    level = int(text)
    if level < 1 or level & (level - 1):
        raise argparse.ArgumentTypeError("levels are powers of two (the cost model bins concurrency that way)")
    return level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=power_of_two, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--slots", type=int, help="engine slots (default: the highest level)")
    parser.add_argument("--requests-per-client", type=int, default=12)
    parser.add_argument("--seconds", type=float, help="per level and arm, instead of --requests-per-client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gpu-type", default="cpu-laptop", help="the price table's row (cost/prices.toml)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--keep-db", type=Path, help="keep the SQLite store here (default: a temporary one)")
    args = parser.parse_args()
    args.slots = args.slots or max(args.levels)
    if args.slots < max(args.levels):
        parser.error("--slots must be >= the highest level (queued requests are not concurrency)")
    engine, prices = Engine(EngineConfig(instance=INSTANCE)), load_prices()
    with tempfile.TemporaryDirectory() as tmp:
        db = make_db(f"sqlite:///{args.keep_db or Path(tmp) / 'cost.db'}")
        upgrade(db)
        runs, window = sweep(engine, Store(db), args)
        rows = [run_row(db, run, prices, args.gpu_type) for run in runs]
        costs = concurrency_costs_at(db, window, prices, gpu_type=args.gpu_type, filters=FILTERS)
        db.dispose()
    report(rows, costs, args.gpu_type)
    if args.json:
        model = [asdict(row) for row in costs.rows]
        groups = [asdict(group) for group in costs.groups]
        out = {"runs": rows, "model": model, "crossover": costs.crossover, "groups": groups, "args": _args(args)}
        args.json.write_text(json.dumps(out, indent=2))
        print(f"rows: {args.json}")


def _args(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


if __name__ == "__main__":
    main()
