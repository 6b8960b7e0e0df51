"""
The short form of scripts/reliability.py, in the default test run: every fault scenario on every
broker, with few messages, against the real brokers (docs/reliability.rst).

One test per broker runs that broker's scenarios one after another in this process (one broker
start per broker). Scaled down from the long form so all four brokers take about three minutes on
two cores (Pub/Sub about 65 s, 15 of them its outage): 100 messages, one SIGKILL instead of
several, confirmations every 2.5 s instead of 5 s for the slow database, a 3 s ack timeout for
the hung watcher, and no ``slow_watcher`` (the credit window it exercises is in the contract
suite; the long form runs it). The scenarios and assertions are the long form's: nothing lost,
exactly the poison messages dead-lettered, something in flight at each kill and at the broker
outage, nothing left on the broker. The leased queues' streams carry a broker-side delivery limit
(``DELIVERY_LIMIT``, 5) with a dead-letter destination of its own: it must stay empty, since the
reject dead-letters poison itself and only a lease lost again and again, or a redelivery loop,
would spend five deliveries on one message.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.reliability.brokers import BROKERS, DELIVERY_LIMIT, broker_rig
from tests.reliability.scenarios import SCENARIOS, Result, run_scenario, table

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

COUNT = 100
LEASED_QUEUES = ("sqs", "pubsub", "servicebus")
SHORT_FORM = [
    replace(SCENARIOS["sigkill"], kills=1, max_in_flight=25),
    replace(SCENARIOS["hung_watcher"], ack_timeout=3.0),
    SCENARIOS["short_lease"],
    replace(SCENARIOS["slow_database"], sync_interval=2.5),
    SCENARIOS["broker_restart"],  # last: what an outage leaves behind cannot slow the others
]


def check_hung_watcher_surfaced(result: Result) -> list[str]:
    """Core limit 4: Airflow cannot cancel a hung filter; the provider must make it visible."""
    problems = []
    if not result.metrics.get("watcher_failures"):
        problems.append(f"hung_watcher: no watcher_failures metric was sent ({result.metrics})")
    if not any("not finished by every watcher" in w for w in result.warnings):
        problems.append("hung_watcher: the provider logged no warning about the unfinished watcher")
    return problems


@pytest.mark.parametrize("broker", BROKERS)
async def test_no_message_is_lost_under_faults(broker, tmp_path):
    results: list[Result] = []
    problems: list[str] = []
    with broker_rig(broker) as rig:
        for scenario in SHORT_FORM:
            result = await run_scenario(rig, scenario, count=COUNT, seed=7, workdir=tmp_path, timeout=120)
            results.append(result)
            problems += [f"{scenario.name}: {p}" for p in result.problems()]
            if scenario.extra_watcher == "hang":
                problems += check_hung_watcher_surfaced(result)
            if broker in LEASED_QUEUES and result.delivery_limit != DELIVERY_LIMIT:
                problems.append(f"{scenario.name}: the broker reports delivery limit {result.delivery_limit}")
            if result.over_limit:  # in problems() too; named: it is this check
                problems.append(
                    f"{scenario.name}: the broker dead-lettered {result.over_limit} past its limit"
                )
    print(table(results))  # shown with -s, and in the report of a failure
    for result in results:  # what the broker saw: received beyond produced were redelivered
        print(f"{result.scenario}: {result.metrics}")
    assert not problems, "\n".join(problems) + "\n" + table(results)
