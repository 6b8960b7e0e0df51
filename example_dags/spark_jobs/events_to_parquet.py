"""
PySpark application: JSON event records -> validated, de-duplicated daily aggregates in Parquet.

Input is either a file/directory of JSON (``--input``; JSON Lines, or one JSON array with
``--multiline``) or the records themselves embedded as one argument (``--records '[{...}]'``),
which is how a Dag passes a few records taken from ``triggering_asset_events`` payloads
without a shared filesystem.

A record is ``{"id": str, "ts": ISO-8601 timestamp, "type": str, "amount": number >= 0,
"customer": str (optional)}``. Records that fail validation are counted (and written to
``--rejects`` as JSON with a ``reason`` when given). Valid records are de-duplicated on ``id``
because the event sources deliver at least once, then aggregated per UTC day and type:
``events``, ``amount``, ``customers`` (distinct), ``first_ts``, ``last_ts``.

Output: Parquet under ``--output`` partitioned by ``event_date`` and ``batch_id``. Writing uses
dynamic partition overwrite, so re-running the same batch (a task retry) replaces its own
partitions instead of adding rows twice; other batches are untouched.

The last stdout line is a JSON summary (``records``, ``valid``, ``invalid``, ``duplicates``,
``rows_written``, ``batch_id``). With ``--max-invalid N`` the job fails (exit 1, the error on
stderr) when more than N records are invalid.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

RAW_SCHEMA = T.StructType(
    [
        T.StructField("id", T.StringType()),
        T.StructField("ts", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("amount", T.StringType()),
        T.StructField("customer", T.StringType()),
        T.StructField("_corrupt_record", T.StringType()),
    ]
)
"""Every field is read as text, so a wrong type is a validation failure, not a lost column."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="file or directory of JSON records")
    source.add_argument("--records", help="the records themselves: a JSON array (or one object)")
    parser.add_argument("--output", required=True, help="Parquet dataset directory")
    parser.add_argument("--rejects", help="directory for invalid records (JSON)")
    parser.add_argument("--multiline", action="store_true", help="--input holds JSON arrays, not lines")
    parser.add_argument("--batch-id", help="partition value identifying this run (default: input hash)")
    parser.add_argument("--max-invalid", type=int, default=None, help="fail when more records are invalid")
    return parser.parse_args(argv)


def read_records(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    reader = spark.read.schema(RAW_SCHEMA).option("mode", "PERMISSIVE")
    reader = reader.option("columnNameOfCorruptRecord", "_corrupt_record")
    if args.input:
        return reader.option("multiLine", bool(args.multiline)).json(args.input)
    records = json.loads(args.records)
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list):
        raise ValueError("--records must be a JSON array or object")
    lines = [json.dumps(r) if isinstance(r, dict) else json.dumps({"_not_an_object": r}) for r in records]
    return reader.json(spark.sparkContext.parallelize(lines, 1))


def validate(raw: DataFrame) -> DataFrame:
    """Add typed columns and a ``reason`` (null when the record is valid)."""
    typed = (
        raw.withColumn("id", F.trim("id"))
        .withColumn("type", F.trim("type"))
        # try_cast: under ANSI mode (Spark 4's default) a plain cast of bad text raises.
        .withColumn("event_ts", F.col("ts").try_cast(T.TimestampType()))
        .withColumn("amount_value", F.col("amount").try_cast(T.DoubleType()))
    )
    reason = (
        F.when(F.col("_corrupt_record").isNotNull(), F.lit("malformed JSON"))
        .when(F.col("id").isNull() | (F.col("id") == ""), F.lit("missing id"))
        .when(F.col("event_ts").isNull(), F.lit("missing or invalid ts"))
        .when(F.col("type").isNull() | (F.col("type") == ""), F.lit("missing type"))
        .when(F.col("amount_value").isNull(), F.lit("missing or non-numeric amount"))
        .when(F.isnan("amount_value") | (F.col("amount_value") < 0), F.lit("negative or NaN amount"))
    )
    return typed.withColumn("reason", reason)


def aggregate(valid: DataFrame, batch_id: str) -> DataFrame:
    return (
        valid.withColumn("event_date", F.date_format("event_ts", "yyyy-MM-dd"))
        .groupBy("event_date", "type")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.round(F.sum("amount_value"), 6).alias("amount"),
            F.countDistinct("customer").alias("customers"),
            F.min("event_ts").alias("first_ts"),
            F.max("event_ts").alias("last_ts"),
        )
        .withColumn("batch_id", F.lit(batch_id))
    )


def default_batch_id(args: argparse.Namespace) -> str:
    source = args.records if args.records is not None else str(Path(args.input).resolve())
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spark = (
        SparkSession.builder.appName("events_to_parquet")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .getOrCreate()
    )
    try:
        checked = validate(read_records(spark, args)).cache()
        total = checked.count()
        invalid = checked.where(F.col("reason").isNotNull())
        invalid_count = invalid.count()
        if args.rejects and invalid_count:
            invalid.select("id", "ts", "type", "amount", "customer", "_corrupt_record", "reason").write.mode(
                "append"
            ).json(args.rejects)
        if args.max_invalid is not None and invalid_count > args.max_invalid:
            raise ValueError(f"{invalid_count} invalid records exceed --max-invalid {args.max_invalid}")
        valid = checked.where(F.col("reason").isNull())
        valid_count = valid.count()
        unique = valid.dropDuplicates(["id"])
        unique_count = unique.count()
        batch_id = args.batch_id or default_batch_id(args)
        daily = aggregate(unique, batch_id).cache()
        rows = daily.count()
        if rows:
            daily.write.mode("overwrite").partitionBy("event_date", "batch_id").parquet(args.output)
        summary = {
            "records": total,
            "valid": valid_count,
            "invalid": invalid_count,
            "duplicates": valid_count - unique_count,
            "rows_written": rows,
            "batch_id": batch_id,
        }
        print(json.dumps(summary), flush=True)
        return summary
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
