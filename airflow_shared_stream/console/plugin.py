"""
The Streams page and its JSON API: a FastAPI app Airflow's api-server mounts, under Airflow's auth.

Registered through this distribution's ``airflow.plugins`` entry point as an Airflow 3.3 plugin:
``fastapi_apps`` mounts the app at :data:`URL_PREFIX`, ``external_views`` adds "Streams" to the
UI's Browse menu (the UI shows the page in its own frame, so the browser sends Airflow's session
cookie with every request of the page).

Authentication and authorisation are Airflow's: every route depends on
``airflow.api_fastapi.core_api.security``'s dependencies, which read the JWT from the
``Authorization`` header or Airflow's session cookie and ask the configured auth manager. A
stream is shown to whoever may read one of its Dags (with the Dag's team, as Airflow's REST API
asks); starting a redrive needs the right to create runs of the redrive Dag of the stream's team
(:func:`airflow_shared_stream.redrive_dag.redrive_dag_id`) and of every Dag of the stream, and
the run is created through Airflow's own REST API with the user's own token, carrying a grant the
task checks at run time (:mod:`airflow_shared_stream.redrive_grant`), so Airflow decides, audits
and logs it like any manual run.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/shared-stream"


class SharedStreamConsolePlugin(AirflowPlugin):
    """The Streams page (entry point ``airflow.plugins``); its app is built by the api-server only."""

    name = "shared_stream_console"

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from airflow_shared_stream.console.api import create_app  # FastAPI and Airflow's API: api-server only

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Shared streams"}]

    external_views = [
        {
            "name": "Streams",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "shared-streams",
        }
    ]
