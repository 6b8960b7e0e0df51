"""What the built distributions carry: licence files, py.typed, provider metadata (about 2 s to build)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from airflow_shared_stream import __version__

ROOT = Path(__file__).resolve().parents[2]
DIST = f"airflow_shared_stream-{__version__}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built FROM it (what ``uv build`` and pip do), from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "uv", "build", "--quiet", "--out-dir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return sdist, wheel


def test_the_repository_has_the_apache_license_and_a_notice() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "airflow-shared-stream" in (ROOT / "NOTICE").read_text()


def test_the_wheel_carries_license_notice_and_declares_them(built: tuple[Path, Path]) -> None:
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = HeaderParser().parsestr(archive.read(f"{DIST}.dist-info/METADATA").decode())
        for name in ("LICENSE", "NOTICE"):
            assert archive.read(f"{DIST}.dist-info/licenses/{name}") == (ROOT / name).read_bytes()
    assert f"{DIST}.dist-info/entry_points.txt" in names
    # PEP 561: type checkers of users' Dags read the package's annotations.
    assert "airflow_shared_stream/py.typed" in names
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("License-File") or []) == ["LICENSE", "NOTICE"]


def test_the_sdist_carries_license_notice_and_provider_yaml(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(f"{DIST}/") for name in archive.getnames()}
    assert {"LICENSE", "NOTICE", "provider.yaml", "pyproject.toml"} <= names


def test_the_wheel_publishes_user_extras_only_and_no_spark_in_the_base(built: tuple[Path, Path]) -> None:
    """test/bench/docs/spark-cluster are dependency groups (PEP 735): not in the wheel's metadata."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        metadata = HeaderParser().parsestr(archive.read(f"{DIST}.dist-info/METADATA").decode())
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert extras == {"sqs", "kafka", "pubsub", "servicebus", "common-messaging", "spark", "all"}
    base = [req for req in metadata.get_all("Requires-Dist") or [] if "extra ==" not in req]
    assert not [req for req in base if "spark" in req], base
    assert "Framework :: Apache Airflow :: Provider" in (metadata.get_all("Classifier") or [])


def test_the_servicebus_extra_installs_no_sdk_below_the_floor(built: tuple[Path, Path]) -> None:
    """
    What pip reads from the wheel: ``[servicebus]`` never resolves to an azure-servicebus the
    stream refuses (below 7.15, a message given back unseen spends a delivery attempt).
    """
    from packaging.requirements import Requirement

    from airflow_shared_stream.servicebus.errors import MIN_SDK_VERSION

    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        metadata = HeaderParser().parsestr(archive.read(f"{DIST}.dist-info/METADATA").decode())
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    sdks = [r for r in requirements if r.name == "azure-servicebus"]  # [servicebus], and [all]
    assert any(r.marker is not None and r.marker.evaluate({"extra": "servicebus"}) for r in sdks), sdks
    for sdk in sdks:
        assert [v for v in ("7.12.0", "7.14.2") if sdk.specifier.contains(v)] == [], str(sdk)
        assert sdk.specifier.contains(MIN_SDK_VERSION)


def test_the_bootstrap_installs_every_extra_and_the_groups_it_names() -> None:
    """scripts/bootstrap.sh (what the README's two commands run) names groups that exist."""
    import re

    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    groups = set(re.findall(r"--group ([\w-]+)", bootstrap))
    assert groups == {"test", "spark-cluster", "docs"}
    assert groups <= project["dependency-groups"].keys()
    assert '-e ".[all]"' in bootstrap
    # The Spark test cluster's full pyspark owns pyspark/: the Spark provider's client is excluded.
    assert any(req.startswith("pyspark[connect]") for req in project["dependency-groups"]["spark-cluster"])
    excludes = (ROOT / "scripts" / "uv-excludes.txt").read_text().splitlines()
    assert [line for line in excludes if line and not line.startswith("#")] == ["pyspark-client"]


def test_the_wheel_names_documentation_source_changelog_and_issue_tracker(built: tuple[Path, Path]) -> None:
    """Project URLs: relative references into the repository until it has a public home; each resolves."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        metadata = HeaderParser().parsestr(archive.read(f"{DIST}.dist-info/METADATA").decode())
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL") or [])
    assert urls.keys() == {"Documentation", "Source", "Changelog", "Issue tracker"}
    for label, url in urls.items():
        if url.startswith("https://"):
            continue
        path, _, anchor = url.partition("#")
        assert (ROOT / path).exists(), f"{label}: {url} is not in the repository"
        if anchor:
            headings = [line.lstrip("#").strip() for line in (ROOT / path).read_text().splitlines()]
            slugs = {heading.lower().replace(" ", "-") for heading in headings if heading}
            assert anchor in slugs, f"{label}: {path} has no heading #{anchor}"


def test_the_wheel_ships_the_redrive_dag(built: tuple[Path, Path]) -> None:
    """The Streams page starts runs of this Dag: a deployment gets it from the wheel, not a clone."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        assert "airflow_shared_stream/redrive_dag.py" in archive.namelist()
