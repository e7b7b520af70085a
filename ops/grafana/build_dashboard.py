#!/usr/bin/env python3
"""Build ops/grafana/spate.json, the Grafana dashboard over spate's series.

The panels are listed once, below (row, title, meaning, queries, unit);
this script lays them out and writes the dashboard JSON (Grafana schema 39,
Prometheus data source chosen by the `datasource` variable):

    python3 ops/grafana/build_dashboard.py            # rewrite spate.json
    python3 ops/grafana/build_dashboard.py --check    # exit 1 if spate.json is stale
    python3 ops/grafana/build_dashboard.py --markdown # the panel table of the README

Every query uses only series spate serves on /metrics (docs/METRICS.md);
engine/spate/tests/it/ops_prometheus.rs evaluates each one through a real
Prometheus scraping a running `spate run` and checks each series name
against a live scrape.

Variables: `pipeline` (the `pipeline` label where spate's series carry
one; every selector is `pipeline=~"$pipeline|"`, so series without the
label, process-wide ones or all of them on a spate without pipelines,
always match) and `shard` (multi-value, All). Queries use `$__rate_interval`.
"""

import argparse
import json
import os
import sys

# `|` also matches series without a pipeline label (process-wide ones, or
# every one on a spate without pipelines), whatever pipeline is chosen.
P = 'pipeline=~"$pipeline|"'
PS = P + ', shard=~"$shard"'
RI = "$__rate_interval"
# The lag without stale values (revoked here, or the leader down).
LAG = f"spate_consumer_lag{{{P}}} unless spate_consumer_lag_stale{{{P}}} == 1"
# The process_* series carry no spate-specific name: keep those of the
# processes that serve spate_build_info (one per spate process).
SPATE = "group by (job, instance) (spate_build_info)"

# (row title, [panel]); a panel is (title, meaning, [(expr, legend)], unit, kind)
# kind: "ts" time series, "stat", "state" state timeline, "bars" (time
# series drawn as bars: counts per interval).
ROWS = [
    ("Health", [
        ("Process ready",
         "1 while the process's /readyz answers 200 (spate_ready): started, every shard has a replica "
         "whose circuit breaker is closed, and the consumer has no transient error standing. 0 means "
         "the body of /readyz says why (which shard, which replica, the consumer's error).",
         [(f"spate_ready{{{P}}}", "{{instance}}")], "none", "state"),
        ("Shard ready",
         "Per shard, 1 while at least one of its replicas has a closed breaker (spate_sink_shard_ready). "
         "0: every replica of the shard is failing; its rows wait (retries, backoff) and the partitions "
         "feeding it stop committing (D1) until a replica answers.",
         [(f"spate_sink_shard_ready{{{PS}}}", "shard {{shard}} {{instance}}")], "none", "state"),
        ("Replica breakers open",
         "Per replica, 1 while its circuit breaker is open (failure threshold reached, no success since; "
         "cooldown and half-open trial included). One open replica of several: its shard still writes "
         "through the others.",
         [(f"spate_sink_replica_breaker_open{{{PS}}}", "shard {{shard}} replica {{replica}}")], "none", "state"),
        ("Build",
         "spate and librdkafka versions of each running process (spate_build_info).",
         [(f"count by (version, librdkafka) (spate_build_info)", "spate {{version}} librdkafka {{librdkafka}}")],
         "none", "stat"),
    ]),
    ("Throughput", [
        ("Rows written per shard",
         "Rows per second acknowledged by ClickHouse, per shard (spate_sink_rows_written_total). The sum "
         "over shards is the pipeline's delivery rate; a shard at 0 while others write is stuck or has "
         "no rows routed to it.",
         [(f"sum by (shard) (rate(spate_sink_rows_written_total{{{PS}}}[{RI}]))", "shard {{shard}}")],
         "rowsps", "ts"),
        ("Bytes written per shard",
         "Encoded payload bytes per second acknowledged, per shard (spate_sink_bytes_written_total): "
         "what the inserts carry before compression.",
         [(f"sum by (shard) (rate(spate_sink_bytes_written_total{{{PS}}}[{RI}]))", "shard {{shard}}")],
         "Bps", "ts"),
        ("Records polled and filtered",
         "Kafka records per second taken from the partitions (spate_records_polled_total), and rows "
         "dropped on purpose by reason (spate_records_filtered_total: mapping.filter, or an empty "
         "mapping.explode array; they commit). Polled above written for long means rows pile up in "
         "flight (see Backpressure).",
         [(f"sum(rate(spate_records_polled_total{{{P}}}[{RI}]))", "polled"),
          (f"sum by (reason) (rate(spate_records_filtered_total{{{P}}}[{RI}]))", "filtered {{reason}}")],
         "rowsps", "ts"),
        ("Batch flushes per shard",
         "Batches per second acknowledged, per shard (spate_sink_batches_flushed_total). Rows written "
         "divided by this is the batch size; many small batches cost ClickHouse parts and merges.",
         [(f"sum by (shard) (rate(spate_sink_batches_flushed_total{{{PS}}}[{RI}]))", "shard {{shard}}")],
         "ops", "ts"),
        ("Average batch size (rows)",
         "Rows per acknowledged batch, per shard (spate_sink_batch_rows histogram: sum / count). "
         "Limited by sink.clickhouse.batch (max_rows, max_bytes, linger).",
         [(f"sum by (shard) (rate(spate_sink_batch_rows_sum{{{PS}}}[{RI}])) / "
           f"sum by (shard) (rate(spate_sink_batch_rows_count{{{PS}}}[{RI}]))", "shard {{shard}}")],
         "short", "ts"),
    ]),
    ("Kafka: lag and commits", [
        ("Group lag per partition",
         "Messages between each partition's log end and the group's committed offset, read from the "
         "brokers (spate_group_lag, every source.kafka.lag_interval): every subscribed partition, "
         "assigned to a process or not, paused or not, before the group's first commit too (counted "
         "from where auto_offset_reset starts). Every process reports the same value: the max over "
         "them. Growing lag: spate reads or writes slower than producers write, or a shard is down and "
         "commits wait for it; it keeps growing during an outage.",
         [(f"max by (topic, partition) (spate_group_lag{{{P}}})", "{{topic}}/{{partition}}")],
         "short", "ts"),
        ("Total group lag",
         "The group's lag summed over every subscribed partition (spate_group_total_lag, max over "
         "processes): the backlog in messages. librdkafka's own view (spate_consumer_lag: this "
         "process's partitions only, frozen while they are paused, absent before a commit) for "
         "comparison.",
         [(f"max(spate_group_total_lag{{{P}}})", "group (brokers)"),
          (f"sum({LAG})", "librdkafka statistics")], "short", "ts"),
        ("Time without progress",
         "Seconds since any process last committed an advance "
         "(time() - spate_last_progress_timestamp_seconds, the youngest over processes; the run's start "
         "until the first). Growing while the group lag is above 0: nothing moves "
         "(SpateNoProgressWhileLagging; /readyz says why on its second line).",
         [(f"min(time() - spate_last_progress_timestamp_seconds{{{P}}})", "no progress")], "s", "ts"),
        ("Commit age per partition",
         "Seconds since the last successful commit that included the partition "
         "(time() - spate_last_commit_timestamp_seconds). A partition with no new data is not "
         "committed again, so age alone is normal when lag is 0; age growing while lag > 0 means "
         "the partition is stuck behind an unacknowledged batch (D1). The youngest over processes: one "
         "that lost the partition in a rebalance keeps its old time.",
         [(f"min by (topic, partition) (time() - spate_last_commit_timestamp_seconds{{{P}}})",
           "{{topic}}/{{partition}}")], "s", "ts"),
        ("Lag freshness",
         "Seconds since the lag of a partition was last refreshed from an up leader "
         "(time() - spate_consumer_lag_updated_timestamp_seconds), and whether its leader is down now "
         "(spate_consumer_lag_stale = 1: the lag shown is the last known value).",
         [(f"max by (topic, partition) (time() - spate_consumer_lag_updated_timestamp_seconds{{{P}}})",
           "age {{topic}}/{{partition}}"),
          (f"max by (topic, partition) (spate_consumer_lag_stale{{{P}}})", "stale {{topic}}/{{partition}}")],
         "s", "ts"),
        ("Commit latency",
         "p50 and p99 of one successful offset commit to the group coordinator "
         "(spate_commit_duration_seconds). Seconds here mean a slow or moving coordinator.",
         [(f"histogram_quantile(0.5, sum by (le) (rate(spate_commit_duration_seconds_bucket{{{P}}}[{RI}])))", "p50"),
          (f"histogram_quantile(0.99, sum by (le) (rate(spate_commit_duration_seconds_bucket{{{P}}}[{RI}])))", "p99")],
         "s", "ts"),
        ("Commit failures and consumer errors",
         "Commits refused or unanswered (spate_commit_failures_total) and consumer errors librdkafka "
         "retries (spate_source_errors_total), per second. Brokers down shows here first.",
         [(f"sum(rate(spate_commit_failures_total{{{P}}}[{RI}]))", "commit failures"),
          (f"sum by (kind) (rate(spate_source_errors_total{{{P}}}[{RI}]))", "source errors {{kind}}")],
         "ops", "ts"),
        ("Partitions and rebalances",
         "Partitions this process owns (spate_assigned_partitions) and rebalances that gave "
         "or took partitions (spate_consumer_rebalances_total). Frequent rebalances: members joining "
         "and leaving, or sessions timing out.",
         [(f"sum by (instance) (spate_assigned_partitions{{{P}}})", "assigned {{instance}}"),
          (f"sum by (kind) (increase(spate_consumer_rebalances_total{{{P}}}[{RI}]))", "rebalances {{kind}}")],
         "short", "ts"),
    ]),
    ("Sink health", [
        ("Retries per shard",
         "Write attempts after the first, per second and shard (spate_sink_retries_total): timeouts, "
         "refused connections, server errors. Retries go to the shard's next replica after backoff.",
         [(f"sum by (shard) (rate(spate_sink_retries_total{{{PS}}}[{RI}]))", "shard {{shard}}")], "ops", "ts"),
        ("Backoff per shard",
         "Seconds of retry backoff the shard's writes are sleeping right now, summed over its "
         "concurrent writes (spate_sink_backoff_seconds). Non-zero for long: the shard keeps failing.",
         [(f"sum by (shard) (spate_sink_backoff_seconds{{{PS}}})", "shard {{shard}}")], "s", "ts"),
        ("Abandoned batches",
         "Batches given up on per interval (spate_sink_batches_abandoned_total): attempts exhausted, a "
         "fatal error or the drain deadline. Their rows are not committed and are read again after a "
         "restart (exit code 2); any non-zero value needs a look.",
         [(f"sum by (shard) (increase(spate_sink_batches_abandoned_total{{{PS}}}[{RI}]))", "shard {{shard}}")],
         "short", "bars"),
        ("Possible duplicates",
         "Rows of write attempts whose outcome was unknown (timed out, connection lost after sending), "
         "per interval (spate_sink_possible_duplicate_rows_total): copies that may be stored twice "
         "where the table does not deduplicate the retry.",
         [(f"sum by (shard) (increase(spate_sink_possible_duplicate_rows_total{{{PS}}}[{RI}]))", "rows shard {{shard}}"),
          (f"sum by (shard) (increase(spate_sink_possible_duplicate_batches_total{{{PS}}}[{RI}]))", "batches shard {{shard}}")],
         "short", "bars"),
        ("Insert latency",
         "p50 and p99 per shard of an acknowledged batch from its first attempt to the acknowledgment, "
         "retries and backoff included (spate_sink_insert_duration_seconds).",
         [(f"histogram_quantile(0.5, sum by (shard, le) (rate(spate_sink_insert_duration_seconds_bucket{{{PS}}}[{RI}])))", "p50 shard {{shard}}"),
          (f"histogram_quantile(0.99, sum by (shard, le) (rate(spate_sink_insert_duration_seconds_bucket{{{PS}}}[{RI}])))", "p99 shard {{shard}}")],
         "s", "ts"),
        ("End-to-end latency",
         "p50 and p99 per shard from the Kafka message timestamp of a batch's oldest record to its "
         "acknowledged insert (spate_end_to_end_latency_seconds): how far behind real time the table is.",
         [(f"histogram_quantile(0.5, sum by (shard, le) (rate(spate_end_to_end_latency_seconds_bucket{{{PS}}}[{RI}])))", "p50 shard {{shard}}"),
          (f"histogram_quantile(0.99, sum by (shard, le) (rate(spate_end_to_end_latency_seconds_bucket{{{PS}}}[{RI}])))", "p99 shard {{shard}}")],
         "s", "ts"),
    ]),
    ("Backpressure", [
        ("In-flight budget use",
         "Fraction of the in-flight budget taken (spate_budget_*_in_use / spate_budget_*_max; "
         "sink.clickhouse.inflight.max_bytes and max_rows, D8). Near 1: intake is paused until "
         "ClickHouse acknowledges; the pipeline runs at the sink's speed.",
         [(f"sum(spate_budget_bytes_in_use{{{P}}}) / sum(spate_budget_bytes_max{{{P}}} > 0)", "bytes"),
          (f"sum(spate_budget_rows_in_use{{{P}}}) / sum(spate_budget_rows_max{{{P}}} > 0)", "rows")],
         "percentunit", "ts"),
        ("Queue depth and writes in flight",
         "Chunks waiting in each shard's queue (spate_sink_queue_depth) and inserts in flight "
         "(spate_sink_inflight_writes, at most sink.clickhouse.inflight.max_inflight).",
         [(f"sum by (shard) (spate_sink_queue_depth{{{PS}}})", "queued shard {{shard}}"),
          (f"sum by (shard) (spate_sink_inflight_writes{{{PS}}})", "in flight shard {{shard}}")],
         "short", "ts"),
        ("Lane pauses",
         "Times per second a pipeline thread paused its partitions because the budget was full "
         "(spate_lane_pauses_total).",
         [(f"sum(rate(spate_lane_pauses_total{{{P}}}[{RI}]))", "pauses")], "ops", "ts"),
    ]),
    ("Records not delivered", [
        ("Skipped records by reason",
         "Records skipped by on_error: skip, per second and reason (spate_records_skipped_total; "
         "decode, encode, operator). Each is logged and, with on_error.dead_letter.topic, produced there.",
         [(f"sum by (reason) (rate(spate_records_skipped_total{{{P}}}[{RI}]))", "{{reason}}")], "ops", "ts"),
        ("Dead letters dropped",
         "Skipped records whose dead letter did not reach the dead-letter topic, per interval "
         "(spate_dead_letter_dropped_total). Those records are only in the source topic now.",
         [(f"sum(increase(spate_dead_letter_dropped_total{{{P}}}[{RI}]))", "dropped")], "short", "bars"),
        ("Failed acknowledgements and offset resets",
         "Poll batches whose acknowledgement failed (spate_ack_failures_total: their partitions stop "
         "committing) and committed offsets found outside their partition's range "
         "(spate_committed_offset_out_of_range_total: retention deleted unread data, or a re-created topic; "
         "the log names the partition).",
         [(f"sum(increase(spate_ack_failures_total{{{P}}}[{RI}]))", "ack failures"),
          # Per partition, created at its first reset: 0 until one happens.
          (f"sum(increase(spate_committed_offset_out_of_range_total{{{P}}}[{RI}])) or vector(0)",
           "offset resets")],
         "short", "bars"),
    ]),
    ("Process", [
        ("CPU",
         "CPU seconds per second of each spate process (process_cpu_seconds_total): 1 = one core. "
         "The counter moves in whole seconds, hence the 2-minute window.",
         [(f"rate(process_cpu_seconds_total[2m]) and on (job, instance) {SPATE}", "{{instance}}")], "short", "ts"),
        ("Memory",
         "Resident memory of each process (process_resident_memory_bytes). The in-flight budget "
         "bounds the data part of it.",
         [(f"process_resident_memory_bytes and on (job, instance) {SPATE}", "{{instance}}")], "bytes", "ts"),
        ("Open file descriptors",
         "Open descriptors against the limit (process_open_fds / process_max_fds).",
         [(f"(process_open_fds / process_max_fds) and on (job, instance) {SPATE}", "{{instance}}")], "percentunit", "ts"),
    ]),
]

DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(pid, title, meaning, queries, unit, kind, x, y):
    targets = [
        {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
        for i, (expr, legend) in enumerate(queries)
    ]
    p = {
        "id": pid,
        "title": title,
        "description": meaning,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    if kind == "stat":
        p["type"] = "stat"
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "name"}
        p["targets"][0]["instant"] = True
    elif kind == "state":
        p["type"] = "state-timeline"
        p["fieldConfig"]["defaults"]["mappings"] = [
            {"type": "value", "options": {"0": {"text": "not ready", "color": "red"},
                                          "1": {"text": "ready", "color": "green"}}}
        ]
        if title == "Replica breakers open":
            p["fieldConfig"]["defaults"]["mappings"] = [
                {"type": "value", "options": {"0": {"text": "closed", "color": "green"},
                                              "1": {"text": "open", "color": "red"}}}
            ]
    else:
        p["type"] = "timeseries"
        custom = {"drawStyle": "bars" if kind == "bars" else "line", "fillOpacity": 10}
        p["fieldConfig"]["defaults"]["custom"] = custom
    return p


def variable(name, label, query, multi):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": multi,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 3,
    }


def dashboard():
    panels = []
    pid = 1
    y = 0
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid += 1
        y += 1
        for i, spec in enumerate(row_panels):
            panels.append(panel(pid, *spec, x=12 * (i % 2), y=y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "spate",
        "uid": "spate-overview",
        "description": "spate: Kafka to ClickHouse. Is it keeping up, is it losing anything, which shard "
                       "is sick. Built by ops/grafana/build_dashboard.py; docs/OPERATIONS.md.",
        "tags": ["spate", "kafka", "clickhouse"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("pipeline", "Pipeline", "label_values(spate_sink_rows_written_total, pipeline)", True),
            variable("shard", "Shard",
                     'label_values(spate_sink_rows_written_total{pipeline=~"$pipeline|"}, shard)', True),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def markdown():
    out = ["| row | panel | what it means |", "|---|---|---|"]
    for row_title, row_panels in ROWS:
        for title, meaning, *_ in row_panels:
            out.append(f"| {row_title} | {title} | {meaning} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spate.json")
    text = json.dumps(dashboard(), indent=2) + "\n"
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    if args.check:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{path} is not what {__file__} builds: run it and commit the result", file=sys.stderr)
                return 1
        print(f"{path}: up to date")
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
