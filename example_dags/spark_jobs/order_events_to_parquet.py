"""
PySpark application: order events (JSON lines) -> validated, de-duplicated Parquet, plus daily totals.

Usage::

    spark-submit order_events_to_parquet.py --input <events.jsonl> --output <dir>

``--input`` holds one record per trigger event, written by the pipeline Dag's ``collect_events``
task from its ``triggering_asset_events``. The job writes two tables under ``--output``:

``orders/``
    one row per valid event, partitioned by ``event_date``. Delivery is at least once (a
    message a crashed triggerer had not settled comes back), so the job appends only events
    whose ``event_id`` is not already in the table: running it twice on the same input, or on
    a redelivered message, leaves the table unchanged.
``daily_totals/``
    per ``event_date`` and ``event_type``: event count and amount, recomputed from the whole
    ``orders`` table each run (overwrite), so it always agrees with it.

Invalid records (no ``order_id``, non-positive or missing ``amount``, unparsable timestamp)
are counted and dropped. The last line printed is a JSON summary that the Dag logs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

RECORD_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("asset", T.StringType()),
        T.StructField("event_type", T.StringType()),
        T.StructField("order_id", T.StringType()),
        T.StructField("customer_id", T.StringType()),
        T.StructField("amount", T.DoubleType()),
        T.StructField("currency", T.StringType()),
        T.StructField("occurred_at", T.StringType()),
        T.StructField("broker_position", T.StringType()),
        T.StructField("asset_event_at", T.StringType()),
    ]
)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--input", required=True, help="JSON-lines file of order event records")
    parser.add_argument("--output", required=True, help="directory of the orders/ and daily_totals/ tables")
    return parser.parse_args(argv)


def _valid(records: DataFrame) -> DataFrame:
    occurred = F.to_timestamp("occurred_at")
    return (
        records.withColumn("occurred_ts", occurred)
        .where(
            F.col("event_id").isNotNull()
            & F.col("order_id").isNotNull()
            & F.col("amount").isNotNull()
            & (F.col("amount") > 0)
            & F.col("occurred_ts").isNotNull()
        )
        .withColumn("event_date", F.to_date("occurred_ts"))
        .drop("occurred_at")
        .withColumnRenamed("occurred_ts", "occurred_at")
    )


def run(spark: SparkSession, input_path: str, output: str) -> dict[str, int]:
    orders_path = os.path.join(output, "orders")
    totals_path = os.path.join(output, "daily_totals")

    records = spark.read.schema(RECORD_SCHEMA).json(input_path).cache()
    valid = _valid(records)
    counts = records.agg(F.count("*").alias("records")).first()
    unique = valid.dropDuplicates(["event_id"])

    known: list[str] = []
    if os.path.isdir(orders_path):
        known = [
            row.event_id for row in spark.read.parquet(orders_path).select("event_id").distinct().collect()
        ]
    # Materialized before the write starts, so the append never reads its own output.
    fresh = (unique.where(~F.col("event_id").isin(known)) if known else unique).localCheckpoint()
    written = fresh.count()
    if written:
        fresh.write.mode("append").partitionBy("event_date").parquet(orders_path)

    rows_total = 0
    if os.path.isdir(orders_path):
        totals = (
            spark.read.parquet(orders_path)
            .groupBy("event_date", "event_type")
            .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
            .orderBy("event_date", "event_type")
            .coalesce(1)
            .localCheckpoint()
        )
        totals.write.mode("overwrite").parquet(totals_path)
        rows_total = int(totals.agg(F.sum("events")).first()[0] or 0)
    valid_count = valid.count()
    return {
        "records": counts["records"],
        "invalid": counts["records"] - valid_count,
        "duplicates_skipped": valid_count - written,
        "rows_written": written,
        "rows_total": rows_total,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    spark = SparkSession.builder.appName("order_events_to_parquet").getOrCreate()
    try:
        summary = run(spark, args.input, args.output)
    finally:
        spark.stop()
    print(json.dumps({"order_events_to_parquet": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
