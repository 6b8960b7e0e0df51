"""
One status poller per Spark master in the triggerer, shared by every trigger waiting on it.

Why: a ``SparkApplicationTrigger`` polling ``/v1/submissions/status/<id>`` for its own driver
makes, with N deferred Spark tasks, N requests per poll interval to the master and N HTTP round
trips of client CPU in the triggerer, whose one event loop also runs every other deferred task
and every shared stream. The master already has the answer for all of them in one place: its
web UI's JSON state lists the active and the retained completed drivers with their states.

So a :class:`SparkMasterPoller` asks for that listing once per interval and settles every
watched driver it finds in a final state. A driver the listing does not settle *as absent*
(dropped by ``spark.deploy.retainedDrivers``, an unknown id, a master whose listing cannot be
read) is asked about over the REST status call, the per-driver path, so the unknown-driver
error and the REST semantics stay exactly what a lone trigger had.

Orphans: after a round with a listing, the poller also kills the master's other active drivers
whose task instance has ended while no triggerer ran their trigger (:mod:`.orphans`), in a task
of its own (one at a time): its worker web UI reads never hold up the rounds.

What stays with each trigger (the poller only reports): its deadline and the kill, ``on_kill``,
its own ``max_transient_errors`` (the poller counts consecutive failures per watch and fails a
watch once its own limit is passed) and its own poll interval (the poller runs at the shortest
interval among its watches).

Lifecycle: :func:`watch` finds or starts the poller for a master in the running event loop and
registers a :class:`DriverWatch`; :meth:`DriverWatch.close` (a trigger's ``finally``, including
when it is cancelled) removes it; a poller with no watch left stops and closes its clients.

Credentials: the listing is on the master's web UI, which the JWS filter does not protect, so
it is requested without the token (:func:`~airflow_shared_stream.spark.master_ui.async_ui_client`);
only REST status calls carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import httpx

from airflow_shared_stream.spark.clients import AsyncSparkRestClient
from airflow_shared_stream.spark.config import SparkRestConfig
from airflow_shared_stream.spark.errors import SparkRestError, TransientSparkRestError
from airflow_shared_stream.spark.master_ui import MasterState, amaster_state, async_ui_client
from airflow_shared_stream.spark.orphans import OrphanReaper
from airflow_shared_stream.spark.rest import DriverStatus

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0
REST_CONCURRENCY = 16
"""Status calls in flight at once for drivers the listing does not settle."""


@dataclass(eq=False)
class DriverWatch:
    """One trigger's wait for one driver; :attr:`outcome` resolves once, with a final status or an error."""

    submission_id: str
    poll_interval: float
    max_transient_errors: int
    poller: SparkMasterPoller
    outcome: asyncio.Future[DriverStatus] = field(init=False)
    state: str | None = None
    """Last state seen (for the trigger's deadline event and log lines)."""
    errors: int = 0
    """Consecutive transient failures seen for this watch."""

    def __post_init__(self) -> None:
        self.outcome = asyncio.get_running_loop().create_future()

    @property
    def settled(self) -> bool:
        return self.outcome.done()

    def _observe(self, status: DriverStatus) -> None:
        self.errors = 0
        if status.state != self.state:
            log.info("Spark driver %s is %s", self.submission_id, status.state)
            self.state = status.state
        if not status.active and not self.settled:
            self.outcome.set_result(status)

    def _fail(self, exc: SparkRestError) -> None:
        if not self.settled:
            self.outcome.set_exception(exc)

    def _transient(self, exc: TransientSparkRestError) -> None:
        self.errors += 1
        if self.errors > self.max_transient_errors:
            self._fail(
                TransientSparkRestError(f"{self.errors} transient errors in a row polling Spark; last: {exc}")
            )
        else:
            log.warning(
                "Transient error %d/%d polling %s: %s",
                self.errors,
                self.max_transient_errors,
                self.submission_id,
                exc,
            )

    def close(self) -> None:
        """Leave the poller (the trigger ended, timed out or was cancelled)."""
        self.poller._remove(self)
        if not self.outcome.done():
            self.outcome.cancel()


class SparkMasterPoller:
    """Polls one master's driver listing for every watch registered on it (one event loop)."""

    def __init__(self, cfg: SparkRestConfig, registry_key: object) -> None:
        if not cfg.master_ui_url:
            raise ValueError("a shared poller needs the master's web UI (connection extra master-ui-url)")
        self.cfg = cfg
        self._key = registry_key
        self._watches: dict[str, list[DriverWatch]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._interval = float("inf")
        self._listing_usable = True
        self.listings = 0
        """Listing requests sent (for tests and the benchmark)."""
        self.status_requests = 0
        """REST status requests sent for drivers the listing did not settle."""
        self.orphans = OrphanReaper()
        """Kills other drivers of this master whose task ended with no trigger left (:mod:`.orphans`)."""
        self._orphan_check: asyncio.Task[None] | None = None
        """The orphan check in flight: a task of its own, so a slow worker web UI or task-state
        answer never holds up the rounds that report the watches' drivers (one check at a time)."""

    # -- registration ------------------------------------------------------------------------

    def _add(self, watch: DriverWatch) -> None:
        self._watches.setdefault(watch.submission_id, []).append(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"spark-master-poller {self.cfg.master_ui_url}"
            )
        if watch.poll_interval < self._interval:
            self._wake.set()  # sleep no longer than the new watch wants (joins otherwise wait a round)

    def _remove(self, watch: DriverWatch) -> None:
        same = self._watches.get(watch.submission_id)
        if same and watch in same:
            same.remove(watch)
            if not same:
                del self._watches[watch.submission_id]
        if not self._watches:
            _POLLERS.pop(self._key, None)
            if self._task is not None and not self._task.done():
                self._task.cancel()

    @property
    def watching(self) -> int:
        return sum(len(w) for w in self._watches.values())

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        try:
            async with async_ui_client(self.cfg) as ui, AsyncSparkRestClient(self.cfg) as rest:
                try:
                    while self._watches:
                        ok = await self._round(ui, rest)
                        failures = 0 if ok else failures + 1
                        if not self._watches:
                            break
                        interval = self._interval = min(
                            w.poll_interval for ws in self._watches.values() for w in ws
                        )
                        if failures:
                            interval = min(interval * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
                        self._wake.clear()
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), interval)
                finally:  # the check uses the clients: it ends before they close
                    check = self._orphan_check
                    if check is not None and not check.done():
                        check.cancel()
                        await asyncio.gather(check, return_exceptions=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave triggers waiting forever
            log.exception("Spark master poller for %s failed", self.cfg.master_ui_url)
            for watches in list(self._watches.values()):
                for watch in watches:
                    watch._fail(SparkRestError(f"Spark status poller failed: {type(exc).__name__}: {exc}"))
        finally:
            if _POLLERS.get(self._key) is self:
                _POLLERS.pop(self._key, None)

    async def _round(self, ui: httpx.AsyncClient, rest: AsyncSparkRestClient) -> bool:
        """One listing, then REST status for what it did not settle. False if the listing failed."""
        listing: MasterState | None = None
        try:
            self.listings += 1
            listing = await amaster_state(ui, self.cfg)
            if not listing.alive:
                raise TransientSparkRestError(f"Spark master is {listing.status}, not ALIVE")
        except TransientSparkRestError as exc:
            for watches in list(self._watches.values()):
                for watch in watches:
                    watch._transient(exc)
            return False
        except SparkRestError as exc:
            # The listing is unreadable (HTTP 4xx, a proxy page): ask each driver over REST.
            if self._listing_usable:
                log.warning("Spark master listing unusable (%s): asking each driver's status instead", exc)
            self._listing_usable = False
            listing = None
        else:
            self._listing_usable = True
        unlisted: list[str] = []
        for submission_id, watches in list(self._watches.items()):
            driver = listing.drivers.get(submission_id) if listing is not None else None
            if driver is None:
                unlisted.append(submission_id)
                continue
            status = DriverStatus(submission_id=submission_id, state=driver.state, worker_id=driver.worker_id)
            for watch in list(watches):
                watch._observe(status)
        if unlisted:
            await self._ask_each(rest, unlisted)
        check = self._orphan_check  # one at a time
        if listing is not None and (check is None or check.done()):
            self._orphan_check = asyncio.get_running_loop().create_task(
                self._check_orphans(listing, ui, rest), name=f"spark-orphan-check {self.cfg.master_ui_url}"
            )
        return True

    async def _check_orphans(
        self, listing: MasterState, ui: httpx.AsyncClient, rest: AsyncSparkRestClient
    ) -> None:
        try:
            await self.orphans.check(listing, self._watches.keys(), ui, rest)
        except Exception:  # never the watches' failure: they wait on their own drivers
            log.exception("Looking for orphaned Spark drivers on %s failed", self.cfg.master_ui_url)

    async def _ask_each(self, rest: AsyncSparkRestClient, submission_ids: list[str]) -> None:
        gate = asyncio.Semaphore(REST_CONCURRENCY)

        async def ask(submission_id: str) -> None:
            async with gate:
                if submission_id not in self._watches:
                    return
                self.status_requests += 1
                try:
                    status = await rest.status(submission_id)
                except TransientSparkRestError as exc:
                    for watch in list(self._watches.get(submission_id, ())):
                        watch._transient(exc)
                    return
                except SparkRestError as exc:  # unknown driver, auth refused: final for the watch
                    for watch in list(self._watches.get(submission_id, ())):
                        watch._fail(exc)
                    return
                for watch in list(self._watches.get(submission_id, ())):
                    watch._observe(status)

        await asyncio.gather(*(ask(s) for s in submission_ids))


_POLLERS: dict[object, SparkMasterPoller] = {}
"""Pollers of this process, by (event loop, connection settings)."""


def watch(
    cfg: SparkRestConfig, submission_id: str, *, poll_interval: float, max_transient_errors: int
) -> DriverWatch:
    """Register a wait for ``submission_id`` with the poller of ``cfg``'s master (started if needed)."""
    # The whole config is the key: two connections to one master with different tokens or TLS
    # settings do not share a client. One poller per event loop: httpx clients are loop-bound.
    key = (id(asyncio.get_running_loop()), cfg)
    poller = _POLLERS.get(key)
    if poller is None:
        poller = _POLLERS[key] = SparkMasterPoller(cfg, key)
    w = DriverWatch(
        submission_id=submission_id,
        poll_interval=poll_interval,
        max_transient_errors=max_transient_errors,
        poller=poller,
    )
    poller._add(w)
    return w
