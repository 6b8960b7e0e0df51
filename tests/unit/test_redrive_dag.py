"""The redrive Dag ships in the package and a one-line Dag file builds it (docs/redrive.rst)."""

from __future__ import annotations

from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

from airflow_shared_stream.redrive_dag import REDRIVE_DAG_ID

IMPORT = "from airflow_shared_stream.redrive_dag import redrive_dead_letters_dag\n"
ONE_LINE = IMPORT + "dag = redrive_dead_letters_dag()\n"


def test_a_dag_file_of_one_line_gives_the_dag_the_streams_page_runs(tmp_path: Path) -> None:
    dag_file = tmp_path / "redrive.py"
    dag_file.write_text(ONE_LINE)
    bag = DagBag(dag_folder=str(dag_file))
    assert bag.import_errors == {}
    dag = bag.dags[REDRIVE_DAG_ID]
    assert set(dag.params) == {
        "broker", "conn_id", "source", "dead_letter", "filter", "max_messages", "dry_run",
        "keep_origin_attributes", "grant",
    }  # fmt: skip
    [task] = dag.tasks
    assert task.require_grant is True
    assert dag.max_active_runs == 1
    assert dag.schedule is None or str(dag.timetable.summary) == "None"


def test_the_example_dag_file_is_that_line() -> None:
    example = Path(__file__).resolve().parents[2] / "example_dags" / "shared_stream_redrive_dead_letters.py"
    assert example.read_text().endswith("\n\n" + ONE_LINE.replace("\ndag", "\n\ndag"))


def test_a_teams_redrive_dag_has_the_id_the_page_runs_for_that_teams_streams(tmp_path: Path) -> None:
    dag_file = tmp_path / "redrive.py"
    dag_file.write_text(IMPORT + 'dag = redrive_dead_letters_dag(team="team_a")\n')
    bag = DagBag(dag_folder=str(dag_file))
    assert bag.import_errors == {}
    dag = bag.dags["shared_stream_redrive_dead_letters__team_a"]
    [task] = dag.tasks
    assert task.require_grant is True
    assert dag.max_active_runs == 1
