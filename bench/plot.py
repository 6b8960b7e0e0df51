"""
Draw the plots of docs/benchmarks.rst from the results ``bench/watchers.py`` wrote.

For each ``bench/results/watchers_<broker>.json`` (SQS, Kafka on one and on three partitions,
Pub/Sub, Service Bus): throughput (messages/s) and broker requests per message against the
watcher count, one line per variant, log-log. Writes
``docs/_static/bench_<broker>.png``.

Run: ``.venv/bin/python bench/plot.py`` (needs matplotlib, in the ``bench`` dependency group).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STATIC = ROOT / "docs" / "_static"
STYLE = {
    "ours": ("tab:blue", "o"),
    "ceiling": ("tab:green", "^"),
    "template": ("tab:olive", "v"),
    "bare": ("tab:gray", "s"),
    "per-watcher": ("tab:red", "x"),
    "official": ("tab:purple", "D"),
}
"""One line per variant; the ``in-flight`` memory hold is not a throughput and is not drawn."""


def plot(results: Path, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text())
    broker = results.stem.removeprefix("watchers_")
    fig, (rate_ax, requests_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for variant, (color, marker) in STYLE.items():
        cells = sorted((c for c in data["cells"] if c["variant"] == variant), key=lambda c: c["watchers"])
        if not cells:
            continue
        n = [c["watchers"] for c in cells]
        rate_ax.plot(n, [c["messages_per_second"] for c in cells], marker=marker, color=color, label=variant)
        with_requests = [c for c in cells if c["requests_per_message"] is not None]
        if with_requests:
            requests_ax.plot(
                [c["watchers"] for c in with_requests],
                [c["requests_per_message"] for c in with_requests],
                marker=marker,
                color=color,
                label=variant,
            )
    load = ", ".join(f"{x:.1f}" for x in data.get("load_at_end", ()))
    rate_ax.set(xscale="log", yscale="log", xlabel="watchers on one stream", ylabel="messages / s")
    rate_ax.set_title(f"{broker}: throughput (load {load})", fontsize=9)
    requests_ax.set(
        xscale="log", yscale="log", xlabel="watchers on one stream", ylabel="broker requests / message"
    )
    requests_ax.set_title(f"{broker}: broker requests per message", fontsize=9)
    for ax in (rate_ax, requests_ax):
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if not requests_ax.lines:
        requests_ax.text(
            0.5, 0.5, "not counted for this broker", ha="center", transform=requests_ax.transAxes
        )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)


def against_watcher_count(results: Path) -> bool:
    """
    Whether a table has a line to draw: two watcher counts or more.

    A table of one watcher count (a single cell repeated, ``--tag steady1``) is read as a
    table; a plot of it would be one point per variant.
    """
    cells = json.loads(results.read_text())["cells"]
    return len({c["watchers"] for c in cells if c["variant"] != "in-flight"}) > 1


def main(argv: list[str] | None = None) -> None:
    paths = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or [
        path for path in sorted(RESULTS.glob("watchers_*.json")) if against_watcher_count(path)
    ]
    for path in paths:
        output = STATIC / f"bench_{path.stem.removeprefix('watchers_')}.png"
        plot(path, output)
        print(f"wrote {output}")


if __name__ == "__main__":
    main()
