"""``bench/watchers.py``: which repeat a table row shows, what its note says, which run it is from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.machine import Settled
from bench.watchers import Cell, _merge, _note, median_cell, render, table_run

RUN = "2026-11-25 08:21 UTC"


def cell(rate: float) -> Cell:
    return Cell("kafka", "ours", 1, 1000, delivered=int(rate), seconds=1.0)


def test_the_median_repeat_is_kept_with_every_repeats_rate():
    chosen = median_cell([cell(300), cell(100), cell(200)])
    assert chosen.messages_per_second == 200
    assert chosen.repeats == [300.0, 100.0, 200.0]  # in the order they ran
    assert _note(chosen, RUN) == "repeats: 300 / 100 / 200"


def test_an_even_count_keeps_the_lower_middle_and_one_run_has_no_note():
    assert median_cell([cell(400), cell(100), cell(300), cell(200)]).messages_per_second == 200
    single = median_cell([cell(500)])
    assert single.repeats == []
    assert _note(single, RUN) == ""


def test_a_broker_slow_to_go_quiet_is_noted_and_one_still_busy_says_so():
    quick = cell(100)
    quick.settled = Settled(0.3, 0.01, idle=True)
    assert _note(quick, RUN) == ""
    slow = cell(100)
    slow.settled = Settled(12.4, 0.02, idle=True)
    assert _note(slow, RUN) == "the broker took 12 s to go quiet before it"
    busy = cell(100)
    busy.settled = Settled(60.1, 0.73, idle=False)
    assert _note(busy, RUN) == "the broker was still busy (73% of a core) after 60 s"


def table_rows(cells: list[Cell]) -> list[list[str]]:
    args = argparse.Namespace(repeats=1, sync=0.0, budget=60.0, pin_broker=None, pubsub_pull_cap=None)
    rendered = render("pubsub", cells, args, versions=[])
    return [
        [column.strip() for column in line.split("|")[1:-1]]
        for line in rendered.splitlines()
        if line.startswith("| ")
    ]


def test_the_brokers_cpu_gets_a_column_only_in_runs_that_measured_it():
    ours = Cell("pubsub", "ours", 1, 1000, delivered=1000, seconds=1.0, cpu_seconds=0.07)
    ceiling = Cell("pubsub", "ceiling", 1, 1000, delivered=1000, seconds=1.0, cpu_seconds=0.05)
    header, _, *rows = table_rows([ours, ceiling])
    assert "broker CPU s / 1,000 msgs" not in header  # a table of an earlier run keeps its columns
    assert all(len(row) == len(header) for row in rows)

    ours.broker_cpu_seconds = 0.045
    header, _, *rows = table_rows([ours, ceiling])
    column = header.index("broker CPU s / 1,000 msgs")
    assert header[column - 1] == "CPU s / 1,000 msgs"
    by_variant = {row[1]: row for row in rows}
    assert by_variant["ours"][column] == "0.045"
    assert by_variant["ceiling"][column] == ""  # a cell kept from an earlier run (--update)
    assert all(len(row) == len(header) for row in rows)


def write_table(stem: Path, cells: list[Cell], *, runs_in_cells: bool) -> None:
    """
    A results pair as ``main`` writes it: each cell with its run, or (tables written before runs
    were recorded per cell) the run only in the markdown, which then is the only place to find it.
    """
    for c in cells:
        c.run = RUN if runs_in_cells else None
    stem.with_suffix(".json").write_text(json.dumps({"cells": [c.as_row() for c in cells]}))
    markdown_run = "(not read)" if runs_in_cells else RUN
    stem.with_suffix(".md").write_text(f"# table\n\n- run: {markdown_run}\n- machine: test\n")


def test_an_update_keeps_the_first_run_and_names_the_later_one_in_the_rows_it_re_measured(tmp_path):
    later = "2026-11-25 10:09 UTC"
    for runs_in_cells in (False, True):
        stem = tmp_path / f"watchers_kafka-{runs_in_cells}"
        write_table(
            stem,
            [cell(100), Cell("kafka", "bare", 1, 1000, delivered=1000, seconds=0.1)],
            runs_in_cells=runs_in_cells,
        )
        fresh = Cell("kafka", "bare", 1, 1000, delivered=1000, seconds=0.2, run=later)

        cells = _merge(stem.with_suffix(".json"), [fresh])

        assert table_run(cells) == RUN
        assert [(c.variant, c.run) for c in cells] == [("ours", RUN), ("bare", later)]
        rows = {row[1]: row for row in table_rows(cells)[2:]}
        assert rows["ours"][-1] == ""
        assert rows["bare"][-1] == f"re-measured in the run of {later}"
        assert rows["bare"][3] == "5,000.0"  # the fresh cell replaced the earlier one


def test_only_tables_of_several_watcher_counts_are_plotted(tmp_path):
    from bench.plot import against_watcher_count

    def table(*cells: Cell) -> Path:
        path = tmp_path / f"watchers_{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps({"cells": [c.as_row() for c in cells]}))
        return path

    one_count = table(cell(100), Cell("kafka", "in-flight", 10, 500), Cell("kafka", "ceiling", 1, 1000))
    several = table(cell(100), Cell("kafka", "ours", 10, 1000))
    assert not against_watcher_count(one_count)  # the in-flight hold is not a watcher count
    assert against_watcher_count(several)


class RecordingBroker:
    """A broker that runs nothing: it records which cells the benchmark asks of it, in order."""

    name = "pubsub"
    pids: list[int] = []
    last: RecordingBroker
    """The instance the benchmark made last."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.asked: list[tuple[str, int, int]] = []
        RecordingBroker.last = self

    def __enter__(self) -> RecordingBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    async def run(self, variant: str, watchers: int, messages: int) -> Cell:
        self.asked.append((variant, watchers, messages))
        return Cell("pubsub", variant, watchers, messages, delivered=messages * watchers, seconds=1.0)


def test_every_variant_takes_an_unrecorded_turn_before_the_first_measured_cell(monkeypatch):
    """
    A process pays some costs once, and unwarmed they fell on the run's first cell (ours at one
    watcher, first repeat): the first metric our template emits reads Airflow's metrics registry,
    a YAML file (0.33 s of a 2 s Pub/Sub cell here), and each client's first use imports its
    modules and opens its channel.
    """
    import asyncio

    from bench import watchers

    monkeypatch.setitem(watchers.BROKER_CLASSES, "pubsub", RecordingBroker)
    args = watchers.parse_args(
        [
            "--broker", "pubsub", "--watchers", "1", "10", "--variants", "ours", "ceiling", "bare",
            "--messages", '{"pubsub": {"1": 500, "10": 300}}', "--warm-up-messages", "50",
            "--settle-limit", "0",
        ]
    )  # fmt: skip
    results = asyncio.run(watchers.bench(args))

    asked = RecordingBroker.last.asked
    assert asked[:3] == [("ours", 1, 50), ("ceiling", 1, 50), ("bare", 1, 50)]
    assert asked[3:] == [(v, n, m) for n, m in ((1, 500), (10, 300)) for v in ("ours", "ceiling", "bare")]
    assert [(c.variant, c.watchers, c.messages) for c in results["pubsub"]] == asked[3:]


def test_no_warm_up_turn_is_taken_when_it_is_switched_off(monkeypatch):
    import asyncio

    from bench import watchers

    monkeypatch.setitem(watchers.BROKER_CLASSES, "pubsub", RecordingBroker)
    args = watchers.parse_args(
        ["--broker", "pubsub", "--watchers", "1", "--variants", "ours", "--warm-up-messages", "0",
         "--messages", '{"pubsub": {"1": 500}}', "--settle-limit", "0"]
    )  # fmt: skip
    asyncio.run(watchers.bench(args))
    assert RecordingBroker.last.asked == [("ours", 1, 500)]


def test_the_anchors_hooks_are_quieted_as_ours_is(monkeypatch):
    """
    Airflow's structlog loggers obey ``[logging] namespace_levels``, not ``setLevel``, and its hooks
    log under ``airflow.task.hooks``: google's Pub/Sub hook wrote four INFO lines per pull of the
    per-watcher anchor, a cost ours did not pay.
    """
    import copy
    import importlib
    import logging

    from bench import watchers

    configs = []
    for name in ("airflow._shared.logging.structlog", "airflow.sdk._shared.logging.structlog"):
        config = importlib.import_module(name)
        monkeypatch.setattr(config, "PER_LOGGER_LEVELS", copy.deepcopy(config.PER_LOGGER_LEVELS))
        configs.append((config, config.PER_LOGGER_LEVELS[""]))
    levels = {name: logging.getLogger(name).level for name in watchers.QUIET_LOGGERS}
    try:
        watchers.quiet_loggers()

        hook = "airflow.task.hooks.airflow.providers.google.cloud.hooks.pubsub.PubSubAsyncHook"
        for config, root_level in configs:
            assert config.PER_LOGGER_LEVELS.longest_prefix(hook).get(None) == logging.WARNING
            assert config.PER_LOGGER_LEVELS[""] == root_level  # everything else as it was
        assert logging.getLogger("botocore").getEffectiveLevel() == logging.WARNING
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)  # setLevel, which also clears the level caches
