"""
The Streams page (airflow_shared_stream/console/) against a running Airflow: api-server, triggerer,
scheduler and dag-processor on PostgreSQL, with a live SQS stream on moto and Airflow's simple
auth manager holding two users, ``admin`` (role ADMIN) and ``viewer`` (role VIEWER).

Over HTTP: an anonymous request is refused, the viewer reads the page and its API but may not
start a redrive, the admin can (a run of the redrive Dag is created through Airflow's REST API),
and no secret of any connection (sentinels in the AWS, Kafka and Service Bus connections) reaches
the page or its API. In Chromium (Playwright on Debian's /usr/bin/chromium): the stream, its
watchers and figures that move as messages are published, a redrive started from the page, and
the screenshots docs/console.rst shows, at desktop and phone widths (written to docs/_static with
``RECORD_CONSOLE_SCREENSHOTS=1``, to the test's temporary directory otherwise).

One deployment for the whole module; the redrive Dag is the provider's own example Dag
(example_dags/shared_stream_redrive_dead_letters.py), paused (as new Dags are), so a run is
created, its conf checked against the Dag's params by Airflow, and never runs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.airflow import AirflowDeployment, airflow_deployment
from tests.support.brokers import SqsServer
from tests.support.postgres import PostgresServer
from tests.support.processes import tail, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
DAGS = Path(__file__).resolve().parent / "console_dags"
REDRIVE_DAG_FILE = REPO / "example_dags" / "shared_stream_redrive_dead_letters.py"
DOCS_STATIC = REPO / "docs" / "_static"
RECORD_SCREENSHOTS = os.environ.get("RECORD_CONSOLE_SCREENSHOTS") == "1"
"""Write the screenshots to docs/_static (what docs/console.rst shows), as RECORD_E2E_LATENCY does."""
PAGE = "/shared-stream/"
API = "/shared-stream/api/streams"
REDRIVE_DAG_ID = "shared_stream_redrive_dead_letters"
WATCHERS = {"console_every_order_watcher", "console_cancelled_watcher"}
PASSWORDS = {"admin": "admin-password-e2e", "viewer": "viewer-password-e2e"}
SENTINELS = (
    "SENTINEL-aws-secret-7f3a",
    "SENTINEL-kafka-password-91c2",
    "SENTINEL-sas-key-0d4e",
    "SENTINEL-session-token-55aa",
)
CHROMIUM = "/usr/bin/chromium"
NOT_YET = "\N{EN DASH}"
"""What the page shows for a figure no triggerer has published yet."""


@dataclass
class Console:
    airflow: AirflowDeployment
    sqs: SqsServer
    queue_url: str
    dead_letter_queue_url: str
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return self.airflow.api_url

    def get(self, path: str, user: str | None = None) -> httpx.Response:
        with self._answer_expected("GET", path):
            return httpx.get(self.url + path, headers=self._auth(user), timeout=30)

    def post(self, path: str, body: dict[str, Any], user: str | None = None) -> httpx.Response:
        with self._answer_expected("POST", path):
            return httpx.post(self.url + path, json=body, headers=self._auth(user), timeout=60)

    @contextlib.contextmanager
    def _answer_expected(self, method: str, path: str) -> Iterator[None]:
        """
        The timeouts detect a failure, they do not tune a wait: the failure names what the
        api-server finished meanwhile (its access log), so a server that answered nothing at all
        (every request held, the Execution API's too) is told from a slow page.
        """
        try:
            yield
        except httpx.TimeoutException as exc:
            raise AssertionError(
                f"{method} {path} got no answer in time; the api-server's log:\n"
                f"{tail(self.airflow.log_path('api-server'), lines=25)}"
            ) from exc

    def _auth(self, user: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}

    def stream(self, user: str = "viewer") -> dict[str, Any]:
        """Our stream as the API shows it (found by its queue URL)."""
        answer = self.get(API, user)
        answer.raise_for_status()
        found = [s for s in answer.json()["streams"] if s["upstream"].get("queue_url") == self.queue_url]
        assert len(found) == 1, answer.json()
        return found[0]

    def redrive_runs(self) -> list[Any]:
        return self.airflow.dag_runs(REDRIVE_DAG_ID)


def _plugins_folder(home: Path) -> dict[str, str]:
    """
    Until the environment is reinstalled from this checkout, its metadata lacks the console's entry
    point: load the same plugin class from a plugins folder instead (one line, no other code).
    """
    if any(ep.name == "shared_stream_console" for ep in entry_points(group="airflow.plugins")):
        return {}
    folder = home / "plugins"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shared_stream_console.py").write_text(
        "from airflow_shared_stream.console.plugin import SharedStreamConsolePlugin  # noqa: F401\n"
    )
    return {"AIRFLOW__CORE__PLUGINS_FOLDER": str(folder)}


def _connections(sqs: SqsServer) -> dict[str, str]:
    """The stream's AWS connection with sentinel keys (moto takes any), and two more with secrets."""
    aws = {**sqs.connection(), "login": "AKIASENTINELKEYID", "password": SENTINELS[0]}
    aws["extra"] = {**aws["extra"], "aws_session_token": SENTINELS[3]}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws),
        "AIRFLOW_CONN_KAFKA_SENTINEL": json.dumps(
            {"conn_type": "kafka", "password": SENTINELS[1], "extra": {"bootstrap.servers": "127.0.0.1:1"}}
        ),
        "AIRFLOW_CONN_SERVICEBUS_SENTINEL": json.dumps(
            {
                "conn_type": "azure_service_bus",
                "extra": {
                    "connection_string": "Endpoint=sb://sentinel.servicebus.windows.net/;"
                    f"SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={SENTINELS[2]}"
                },
            }
        ),
    }


@pytest.fixture(scope="module")
def console(e2e_dir: Path, sqs: SqsServer, postgres: PostgresServer) -> Iterator[Console]:
    dead_letter_queue_url = sqs.create_queue("console-orders-dlq")
    queue_url = sqs.create_queue("console-orders", dead_letter_queue_url=dead_letter_queue_url)
    home = e2e_dir / "airflow-console"
    dags = home / "dags"
    dags.mkdir(parents=True)
    for dag_file in [*DAGS.glob("*.py"), REDRIVE_DAG_FILE]:
        (dags / dag_file.name).symlink_to(dag_file)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    env = {
        **_connections(sqs),
        **_plugins_folder(home),
        "CONSOLE_SQS_QUEUE_URL": queue_url,
        "CONSOLE_SQS_DEAD_LETTER_QUEUE_URL": dead_letter_queue_url,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    database_url = postgres.create_database("airflow_console")
    with airflow_deployment(home, dags, env, database_url=database_url) as airflow:
        airflow.wait_for_dags({"console_orders", "console_cancellations", REDRIVE_DAG_ID})
        airflow.wait_for_watchers(WATCHERS)
        tokens = {}
        for user, password in PASSWORDS.items():
            answer = httpx.post(
                f"{airflow.api_url}/auth/token", json={"username": user, "password": password}, timeout=30
            )
            assert answer.status_code == 201, answer.text
            tokens[user] = answer.json()["access_token"]
        yield Console(airflow, sqs, queue_url, dead_letter_queue_url, tokens)


def _publish(console: Console, count: int, *, tag: str, poison: int = 0) -> None:
    bodies: list[dict[str, Any]] = [
        {"event_id": f"{tag}-{i}", "kind": "cancelled" if i % 2 else "created"} for i in range(count)
    ]
    bodies += [{"event_id": f"{tag}-poison-{i}", "poison": True} for i in range(poison)]
    console.sqs.send(console.queue_url, bodies)


def _received(stream: dict[str, Any]) -> int:
    return int((stream.get("figures") or {}).get("totals", {}).get("received", 0))


def test_anonymous_requests_are_refused(console: Console) -> None:
    for answer in (
        console.get(PAGE),
        console.get(API),
        console.post(f"{API}/any/redrive", {"dry_run": True}),
    ):
        assert answer.status_code in (401, 403), (answer.request.url, answer.status_code, answer.text)
    forged = httpx.get(console.url + API, headers={"Authorization": "Bearer not-a-token"}, timeout=30)
    assert forged.status_code in (401, 403)


def test_the_viewer_sees_the_stream_but_cannot_start_a_redrive(console: Console) -> None:
    page = console.get(PAGE, "viewer")
    assert page.status_code == 200
    assert "Shared streams" in page.text
    answer = console.get(API, "viewer")
    assert answer.status_code == 200
    assert answer.json()["redrive"] == {
        "dag_id": REDRIVE_DAG_ID,
        "deployed": True,
        "paused": False,
        "allowed": False,
    }
    stream = console.stream("viewer")
    assert stream["redrive_refused"] == f"You may not trigger {REDRIVE_DAG_ID}."
    assert stream["broker"] == "sqs"
    assert {name for w in stream["watchers"] for name in w["names"]} == WATCHERS
    assert {d for w in stream["watchers"] for d in w["dags"]} == {"console_orders", "console_cancellations"}
    assert stream["redrive_available"] is True
    refused = console.post(f"{API}/{stream['id']}/redrive", {"dry_run": True}, "viewer")
    assert refused.status_code == 403, refused.text
    assert console.redrive_runs() == []


def test_figures_move_as_messages_are_published_and_show_no_secret(console: Console) -> None:
    before = _received(console.stream())
    _publish(console, 6, tag="http", poison=2)

    def moved() -> bool:
        stream = console.stream()
        dead_letters = ((stream.get("backlog") or {}).get("dead_letter") or {}).get("depth", 0)
        # The dead-letter depth is read from the queue when the page is asked; the figures come
        # from the triggerer, a write later: wait for both to have seen the two poison messages.
        dead_lettered = ((stream.get("figures") or {}).get("totals") or {}).get("dead_lettered", 0)
        return _received(stream) >= before + 8 and dead_letters >= 2 and dead_lettered >= 2

    wait_until(moved, 120, "the stream's figures to count the published messages", interval=1.0)
    stream = console.stream()
    assert stream["state"] in ("ok", "idle"), stream["warnings"]
    assert [t["watchers"] for t in stream["triggerers"]] == [2]
    fired = {name: w["events_fired"] for w in stream["watchers"] for name in w["names"]}
    assert fired["console_every_order_watcher"] >= 6
    assert fired["console_cancelled_watcher"] >= 3
    for user in ("viewer", "admin"):
        for path in (PAGE, API):
            text = console.get(path, user).text
            leaked = [s for s in SENTINELS if s in text]
            assert not leaked, f"{path} shows {leaked} to {user}"


def test_the_admin_starts_a_redrive_as_a_run_of_the_redrive_dag(console: Console) -> None:
    stream = console.stream("admin")
    answer = console.post(
        f"{API}/{stream['id']}/redrive",
        {"dry_run": True, "max_messages": 10, "filter": "body.poison"},
        "admin",
    )
    assert answer.status_code == 201, answer.text
    runs = console.redrive_runs()
    assert [r.run_id for r in runs] == [answer.json()["dag_run_id"]]
    with console.airflow.db() as conn:
        row = conn.execute("SELECT conf FROM dag_run WHERE run_id = ?", (runs[0].run_id,)).fetchone()
    conf = row["conf"] if isinstance(row["conf"], dict) else json.loads(row["conf"])
    assert isinstance(conf.pop("grant"), str)  # signed for this run and user (redrive_grant.py)
    assert conf == {
        "broker": "sqs",
        "conn_id": "aws_default",
        "source": console.queue_url,
        "dead_letter": console.dead_letter_queue_url,
        "filter": "body.poison",
        "max_messages": 10,
        "dry_run": True,
        "keep_origin_attributes": False,
    }
    missing = console.post(f"{API}/no-such-stream/redrive", {"dry_run": True}, "admin")
    assert missing.status_code == 404


def _browser(playwright: Any) -> Any:
    """Debian's Chromium; a browser that cannot start fails the test (never a skip)."""
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError(f"{CHROMIUM} is missing: the UI test needs Debian's chromium package")
    try:
        return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    except Exception as exc:
        raise RuntimeError(f"Chromium ({CHROMIUM}) could not start: {exc}") from exc


def _open_page(browser: Any, console: Console, width: int, height: int, path: str = PAGE) -> Any:
    context = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
    context.add_cookies([{"name": "_token", "value": console.tokens["admin"], "url": console.url}])
    page = context.new_page()
    page.goto(console.url + path)
    return page


def test_the_page_in_a_browser_shows_moving_figures_and_starts_a_redrive(
    console: Console, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    screenshots = DOCS_STATIC if RECORD_SCREENSHOTS else tmp_path

    stream_id = console.stream()["id"]
    row = f'[data-stream-id="{stream_id}"]'
    runs_before = len(console.redrive_runs())
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        try:
            ui = _open_page(browser, console, 1280, 800, path="/")
            ui.get_by_role("button", name="Browse").click()
            ui.get_by_role("menuitem", name="Streams").click()
            expect(ui.frame_locator("iframe").locator(row)).to_be_visible(timeout=30_000)
            ui.close()

            page = _open_page(browser, console, 1280, 800)
            expect(page.locator(row)).to_be_visible(timeout=30_000)
            page.locator(row).click()
            details = page.locator(f'[data-details="{stream_id}"]')
            expect(details).to_be_visible()
            for watcher in WATCHERS:
                expect(details).to_contain_text(watcher)
            expect(details).to_contain_text("body.kind == 'cancelled'")
            received = details.locator('[data-figure="received"] b')
            shown = int(received.inner_text().replace(",", "").replace(NOT_YET, "0"))
            _publish(console, 10, tag="browser")
            page.wait_for_function(
                "([selector, before]) => "
                "Number(document.querySelector(selector).textContent.replace(/[^0-9]/g, '')) >= before + 10",
                arg=[f'[data-details="{stream_id}"] [data-figure="received"] b', shown],
                timeout=90_000,
                polling=1000,
            )
            form = details.locator(f'form[data-redrive="{stream_id}"]')
            form.locator('input[name="max_messages"]').fill("5")
            form.locator('button[type="submit"]').click()
            result = details.locator(f'[data-redrive-result="{stream_id}"]')
            expect(result).to_contain_text("Started Dag run", timeout=30_000)
            wait_until(lambda: len(console.redrive_runs()) == runs_before + 1, 30, "the redrive Dag run")
            # Settled once their asset events are persisted: in flight comes back to 0.
            expect(details.locator('[data-figure="in_flight"] b')).to_have_text("0", timeout=60_000)
            page.mouse.move(0, 0)
            page.screenshot(path=str(screenshots / "console-desktop.png"), full_page=True)

            phone = _open_page(browser, console, 390, 844)
            expect(phone.locator(row)).to_be_visible(timeout=30_000)
            phone.locator(row).click()
            expect(phone.locator(f'[data-details="{stream_id}"]')).to_be_visible()
            overflow = phone.evaluate("document.scrollingElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"the page is {overflow}px wider than a 390px phone"
            phone.screenshot(path=str(screenshots / "console-phone.png"), full_page=True)
        finally:
            browser.close()
