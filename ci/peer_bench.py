"""The side-by-side benchmark (issue 22, ported from bash in issue 29) and its
Kafka helpers. `bash ci/peer-bench.sh ARGS` runs `python3 ci/peer_bench.py
bench ARGS`; BENCH_HELP below is the whole description of what it runs,
measures and gates.

  peer_bench.py bench [--kafka real|mock] [--workload flights|sensor|all] [--reps N] [ROWS]
      The benchmark (BENCH_HELP). Needs only the standard library to start:
      it makes its venv (confluent-kafka from PyPI) and re-runs itself there.

  peer_bench.py watermarks BROKERS TOPIC
      Prints the sum of the partitions' high watermarks. Exits 1 naming the
      partition when any low watermark is not 0: the embedded broker (the
      librdkafka mock cluster) deleted data past its 5 MiB-per-partition
      retention, and a count in ClickHouse would then be short for a reason
      that is not the consumer's.

  peer_bench.py create-topic BROKERS TOPIC PARTITIONS REPLICATION
      Creates TOPIC (the real cluster creates no topic by itself). Exits 1
      with the broker's error.

  peer_bench.py consume BROKERS TOPIC GROUP CLICKHOUSE_URL TABLE BATCH_ROWS FIRST_ROW_FILE
      The do-it-yourself baseline: a plain confluent-kafka consumer loop that
      joins message values into JSONEachRow batches of BATCH_ROWS rows (or
      whatever arrived within LINGER_S of a batch's first row), POSTs each
      to ClickHouse's HTTP interface, and commits the offsets synchronously
      only after ClickHouse answered 200 (at least once). The wall-clock time
      of the first message goes to FIRST_ROW_FILE (seconds since the epoch).
      SIGTERM: flush what is buffered, commit, exit.

  peer_bench.py sensor-expect MESSAGES
      The sensor workload's kept row count in closed form.

  peer_bench.py sensor-check MESSAGES VALUE...
      Compares the checks SENSOR_CHECK_SQL computed over a sensor table
      with the closed form: prints "pass" (exit 0) or what differs.

  peer_bench.py summarize RUNS_TSV REPS
      The Markdown table from a runs.tsv: per arm the median [min-max] of
      each measurement over the runs that passed the gates, how many passed,
      and every failed run's reason.

Tests of the pure parts: `python3 -m unittest ci/test_peer_bench.py`.
"""

import dataclasses
import datetime
import functools
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import venv as venv_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINGER_S = 1.0
POLL_MESSAGES = 10_000
CONFLUENT_KAFKA = "confluent-kafka==2.16.1"


class BenchError(Exception):
    """The benchmark cannot go on (the bash script's `die`)."""


# ------------------------------------------------------------ Kafka helpers


def watermarks(brokers: str, topic: str) -> int:
    """The sum of TOPIC's high watermarks; BenchError when a partition is
    missing data (a low watermark other than 0)."""
    from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

    c = Consumer({"bootstrap.servers": brokers, "group.id": "peer-bench-watermarks"})
    try:
        md = c.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            raise BenchError(f"topic {topic} missing on {brokers}")
        total = 0
        for p in sorted(t.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if low != 0:
                raise BenchError(
                    f"{topic}/{p}: low watermark {low}, not 0: the broker "
                    "deleted data (mock cluster retention); use more partitions"
                )
            total += high
        return total
    finally:
        c.close()


def create_topic(brokers: str, topic: str, partitions: int, rf: int) -> None:
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

    a = AdminClient({"bootstrap.servers": brokers})
    futures = a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf)])
    for name, f in futures.items():
        try:
            f.result(30)
        except KafkaException as e:
            raise BenchError(f"create topic {name} on {brokers}: {e}") from e


def consume(brokers, topic, group, url, table, batch_rows, first_file):
    from confluent_kafka import Consumer, KafkaException  # noqa: PLC0415

    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port or 8123, timeout=60)
    query = urllib.parse.urlencode(
        {
            "query": f"INSERT INTO {table} FORMAT JSONEachRow",
            # The flight rows carry "2001/01/01 00:47" dates.
            "date_time_input_format": "best_effort",
        }
    )
    path = f"/?{query}"
    c = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    stop = False

    def on_term(_sig, _frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    c.subscribe([topic])
    buf = []
    rows = 0
    batch_started = None
    first_seen = False

    def flush():
        nonlocal buf, rows, batch_started
        if not buf:
            return
        body = b"\n".join(buf)
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        text = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"ClickHouse {resp.status}: {text[:500]!r}")
        # Commit only behind rows ClickHouse acknowledged.
        c.commit(asynchronous=False)
        buf = []
        rows = 0
        batch_started = None

    try:
        while not stop:
            msgs = c.consume(num_messages=POLL_MESSAGES, timeout=0.2)
            for m in msgs:
                if m.error():
                    raise KafkaException(m.error())
                buf.append(m.value())
            if msgs:
                if not first_seen:
                    first_seen = True
                    with open(first_file, "w") as f:
                        f.write(f"{time.time():.6f}\n")
                rows += len(msgs)
                if batch_started is None:
                    batch_started = time.monotonic()
            if rows >= batch_rows or (
                batch_started is not None and time.monotonic() - batch_started >= LINGER_S
            ):
                flush()
        flush()
    finally:
        c.close()


# ------------------------------------------------------------ summary table

RUN_COLUMNS = (
    "arm", "rep", "gate", "landed", "dups", "wall", "rate",
    "cpu_arm", "rss_arm", "cpu_server", "rss_server", "note",
)


def summarize(runs_tsv: str, reps: int, out=None) -> None:
    """Prints one Markdown table: per arm (in first-run order), the median
    and [min-max] of every measurement over the runs that passed the gates,
    how many of the repetitions passed, and each failed run's reason (a
    failed run is never a number)."""
    with open(runs_tsv) as f:
        print(summary_table(f.read().splitlines(), reps), file=out or sys.stdout)


def summary_table(lines, reps: int) -> str:
    arms = {}
    for line in lines:
        cols = line.rstrip("\n").split("\t")
        if len(cols) != len(RUN_COLUMNS):
            continue
        arms.setdefault(cols[0], []).append(cols)

    def stat(runs, i, fmt):
        vals = []
        for r in runs:
            try:
                vals.append(float(r[i]))
            except ValueError:
                pass  # "-", "(in server)": not measured for this arm
        if not vals:
            return runs[0][i] if runs[0][i] != "" else "-"
        med = statistics.median(vals)
        if len(vals) == 1:
            return fmt.format(med)
        return f"{fmt.format(med)} [{fmt.format(min(vals))}-{fmt.format(max(vals))}]"

    out = [
        "| arm | runs passed | rows/s | CPU s / M rows: arm | CPU s / M rows: server "
        "| peak RSS MiB: arm | peak RSS MiB: server | loss, dups | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in arms.items():
        ok = [r for r in runs if r[2] == "pass"]
        failed = [r for r in runs if r[2] != "pass"]
        notes = [f"rep {r[1]} **{r[2]}**" for r in failed]
        if ok:
            notes.append(ok[-1][11])
        elif failed and failed[-1][2].startswith("not run"):
            notes = [f"**{failed[-1][2]}**"]
        if ok:
            # A run into the discarding endpoint lands nothing: its dups
            # column is "-", and loss is its gate on rows acknowledged.
            lossdups = "0, 0" if all(r[4] != "-" for r in ok) else "not measured"
            cells = [
                stat(ok, 6, "{:,.0f}"),
                stat(ok, 7, "{:.2f}"),
                stat(ok, 9, "{:.2f}"),
                stat(ok, 8, "{:.0f}"),
                stat(ok, 10, "{:.0f}"),
            ]
        else:
            lossdups = "-"
            not_run = failed and all(r[2].startswith("not run") for r in failed)
            cells = ["not run" if not_run else "failed"] + ["-"] * 4
        passed = f"{len(ok)} of {reps}"
        note = "; ".join(n.replace("|", "/") for n in notes)
        out.append(f"| {arm} | {passed} | " + " | ".join(cells) + f" | {lossdups} | {note} |")
    return "\n".join(out)


# ------------------------------------------------------------ the sensor closed form

SENSOR_DDL = (
    "batch_id UInt64, source String, region String, produced_at UInt64, event_seq UInt32, "
    "sensor_id UInt32, name String, value Float64, quality Nullable(Int32), unit String, "
    "ts UInt64, name_upper String MATERIALIZED upper(name), "
    "value_scaled Float64 MATERIALIZED value * 10"
)
SENSOR_COLUMNS = (
    "batch_id, source, region, produced_at, event_seq, sensor_id, name, value, quality, unit, ts"
)
SENSOR_CHECK_SQL = (
    "count(), uniqExact(batch_id, event_seq), sum(value), sum(value_scaled), "
    "countIf(isNull(quality)), sum(ifNull(quality, 0)), countIf(region = 'unknown'), "
    "sum(toUInt64(substring(name_upper, 8))), countIf(substring(name_upper, 1, 7) = 'SENSOR-')"
)


@functools.lru_cache(maxsize=4)
def _sensor_expect(messages: int) -> tuple:
    e = dict(rows=0, distinct=0, sum_value=0.0, sum_scaled=0.0, null_quality=0,
             sum_quality=0, unknown_region=0, sum_name_suffix=0, name_prefix=0)
    for i in range(messages):
        for j in range(100):
            k = i * 100 + j
            value = (k % 4000) * 0.25 - 100.0
            if k % 8 == 0 or value < 0:
                continue
            e["rows"] += 1
            e["distinct"] += 1
            e["sum_value"] += value
            e["sum_scaled"] += value * 10
            if j % 5 == 0:
                e["null_quality"] += 1
            else:
                e["sum_quality"] += j % 3
            if i % 10 == 0:
                e["unknown_region"] += 1
            e["sum_name_suffix"] += k % 1024
            e["name_prefix"] += 1
    return tuple(e.items())


def sensor_expect(messages: int) -> dict:
    """The closed form of the sensor workload (docs: spate-testkit's
    sensor::avro generator): message i holds events j = 0..99, k = i*100+j;
    a row is kept when unit != "drop" (k % 8 != 0) and value >= 0 (value =
    (k % 4000) * 0.25 - 100); region is null (coalesced to 'unknown') when
    i % 10 == 0; quality is null when j % 5 == 0, else j % 3; name_upper is
    SENSOR-{k % 1024}. Returns the checks SENSOR_CHECK_SQL computes, in its
    order."""
    return dict(_sensor_expect(messages))


def sensor_check(messages: int, got: list) -> str:
    """"pass", or which check differs (got: the SQL's values as text)."""
    want = sensor_expect(messages)
    bad = []
    for (name, w), g in zip(want.items(), got):
        if float(g) != float(w):
            bad.append(f"{name} {g} (expected {w})")
    if len(got) != len(want):
        bad.append(f"{len(got)} values, expected {len(want)}")
    return "; ".join(bad) if bad else "pass"


# ------------------------------------------------------------ /proc

TICKS = os.sysconf("SC_CLK_TCK")


def parse_stat_cpu(stat_text: str, ticks: int = TICKS) -> float:
    """User + system CPU seconds from a /proc/PID/stat (or task stat) line:
    utime and stime are the 12th and 13th fields after "pid (comm) ". The
    process's own stat sums all its threads, dead ones included."""
    rest = stat_text[stat_text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / ticks


def parse_stat_comm(stat_text: str) -> str:
    return stat_text[stat_text.index("(") + 1: stat_text.rindex(")")]


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return round(parse_stat_cpu(f.read()), 3)


def hwm_of(pid: int) -> str:
    """Peak resident set in MiB (VmHWM), "-" when the process has none left
    (exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return f"{int(line.split()[1]) / 1024:.0f}"
    except OSError:
        pass
    return "-"


def thread_cpu_summary(stats, ticks: int = TICKS) -> str:
    """CPU seconds per thread name with trailing digits and dashes dropped
    (spate-pipe-0 and -1 -> spate-pipe), largest first, those >= 0.005 s:
    "spate-pipe 0.19, rdk:broker 0.19"."""
    by = {}
    for text in stats:
        name = re.sub(r"[-0-9]+$", "", parse_stat_comm(text))
        by[name] = by.get(name, 0.0) + parse_stat_cpu(text, ticks)
    items = sorted(((n, c) for n, c in by.items() if c >= 0.005), key=lambda x: -x[1])
    return ", ".join(f"{n} {c:.2f}" for n, c in items)


def thread_cpu_of(pid: int) -> str:
    stats = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stats.append(f.read())
            except OSError:
                pass
    except OSError:
        return ""
    return thread_cpu_summary(stats)


def exited(pid: int) -> bool:
    """Whether the child PID has exited, without reaping it (its /proc
    entry, CPU included, stays readable until it is waited for)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample whose line starts with NAME (labels included)
    in a Prometheus text page; comments skipped."""
    s = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            try:
                s += float(line.split()[-1])
            except (ValueError, IndexError):
                pass
    return s


# ------------------------------------------------------------ settings

USAGE = "usage: ci/peer-bench.sh [--kafka real|mock] [--workload flights|sensor|all] [--reps N] [ROWS]"
FLIGHT_ARMS = ("spate", "spate-eo", "kafka", "python", "sinker")
SENSOR_ARMS = ("spate", "spate-chdb", "upstream", "upstream-native", "spate-discard", "upstream-discard")

BENCH_HELP = """\
Side-by-side benchmark (second edition, issue 22): spate (at_least_once and
effectively_once), ClickHouse's own Kafka table engine, a plain Python
consumer loop and clickhouse_sinker, each moving the same ROWS flight rows
from one pre-filled topic into the same ClickHouse, one arm at a time, arms
interleaved over PEER_BENCH_REPS repetitions (rotated: rep 1 runs A B C,
rep 2 B C A, ...), reported as medians with ranges; then the sensor
workload (Avro SensorBatch: spate and upstream spate 0.2.0).

  bash ci/peer-bench.sh [--kafka real|mock] [--workload flights|sensor|all] [--reps N] [ROWS]
      --kafka real (default): a real Apache Kafka 4.4 cluster, ci/kafka.sh
                    start 3 (KRaft, RF 3, min.insync.replicas 2), topics of
                    PEER_BENCH_PARTITIONS (default 12) partitions, stopped
                    at the end
      --kafka mock: the embedded broker (librdkafka's mock cluster, `spate
                    broker`), one per topic, with enough partitions that each
                    stays under 3 of its 5 MiB retention
      --workload:   flights, sensor or all (default)
      --reps N:     repetitions (default 3)
      ROWS:         flight rows (default 1,000,000)

Every arm is one entry of an arm table (FLIGHT_ARMS, SENSOR_ARMS in
ci/peer_bench.py: how it starts, what it counts, how it is gated) run by one
runner: check the topic's retention, make a fresh table, reset the server's
peak RSS, start the arm, poll its count every 100 ms until the target landed,
it stalls (PEER_BENCH_STALL s without a new row), times out or exits, read
CPU (/proc/PID/stat, every thread) and peak RSS (VmHWM) of the arm and the
server, SIGTERM the arm, then count and gate.

Gates: a run passes when every row landed exactly once (count() = ROWS and
uniqExact(id) = ROWS; sensor: the kept rows' count, uniqExact(batch_id,
event_seq) and column checksums equal to the closed form; into the
discarding endpoint: the arm's own count of rows acknowledged equals the
kept rows and the endpoint refused no insert) and the arm did not stall,
time out or exit. Every partition's low watermark is checked 0 before each
flights run and at the end (else the broker deleted data: the benchmark
stops). A run that fails a gate is reported as failed with its reason,
never as a number: medians and ranges are over the passing runs only, and
the table says how many of the repetitions passed.

Flights: every arm writes into the same ReplicatedMergeTree (one replica,
replicated_deduplication_window = 10000, on ClickHouse 18.16 with a local
ZooKeeper; PEER_BENCH_REPLICATED=0: MergeTree, and spate-eo then fails
spate's own refusal). ClickHouse gets a config.d file with
<kafka><auto_offset_reset>smallest</auto_offset_reset><debug>cgrp</debug>
</kafka> and trace logging (the Kafka engine's only account of itself).
clickhouse_sinker: `go install github.com/housepower/clickhouse_sinker/
cmd/clickhouse_sinker@$PEER_BENCH_SINKER_VERSION`; where the Go module
proxy does not serve it (measured 2026-12-01 here: HTTP 403), the arm is
reported as not run with the go command's message.

Sensor: PEER_BENCH_SENSOR_MESSAGES Confluent-framed Avro messages (100
events each) through ci/registry.sh's fixture, fanned out, filtered
(unit != "drop", value >= 0) and coalesced (region 'unknown'), into a fresh
MergeTree table on 18.16 or on ci/chdb_server.py (chdb-core; upstream
spate 0.2.0 always sends insert_deduplication_token, which 18.16 refuses),
and into a second ci/chdb_server.py --discard-inserts (the arms' own CPU
per row without the server's cost per insert).

Measures, per run:
  rows/s          rows landed / (all landed - first row consumed); first
                  row: spate's spate_records_polled_total (upstream:
                  spate_deser_records_total) turning non-zero on /metrics;
                  the Python loop's own timestamp; the Kafka engine: the
                  later of its first partition assignment in this run
                  (librdkafka's debug log) and the start of its first stream
                  that committed rows (server log), else the first count() > 0.
  CPU s / M rows  user+system CPU of the arm's process (all threads) from
                  its start to "all landed", and the server's delta over the
                  same interval, per million rows.
  peak RSS        VmHWM of the arm; the server's VmHWM after it was reset
                  (/proc/PID/clear_refs) at the start of the run.

Environment (defaults keep clear of ci/test.sh's ports):
  CARGO_TARGET_DIR=<repo>/target
  SPATE_CH_DIR=/tmp/spate-ch-peer-bench  SPATE_CH_BASE_PORT=17123
  SPATE_ZK_PORT                 ci/clickhouse.sh's ZooKeeper port (default 2181;
                                set it when another ZooKeeper holds 2181)
  PEER_BENCH_ADMIN_PORT=17190   the arm's /metrics during its run
  PEER_BENCH_TIMEOUT=300        seconds each run gets
  PEER_BENCH_STALL=60           seconds without a new row = stalled
  PEER_BENCH_KAFKA_CONSUMERS=2  kafka_num_consumers of the Kafka engine
  PEER_BENCH_KAFKA_BLOCK=1048576 kafka_max_block_size of the Kafka engine
  PEER_BENCH_PY_BATCH=100000    rows per Python insert
  PEER_BENCH_SYSTEMS="spate spate-eo kafka python sinker"  flights arms
  PEER_BENCH_SENSOR_SYSTEMS="spate spate-chdb upstream upstream-native spate-discard upstream-discard"
  PEER_BENCH_SENSOR_MESSAGES=20000
  PEER_BENCH_REGISTRY_PORT=17181
  SPATE_CHDB_VENV=<target>/chdb/venv
  PEER_BENCH_REPS=3             repetitions (or --reps)
  PEER_BENCH_SINKER_VERSION=v3.1.9
  PEER_BENCH_SPATE_THREADS=2    pipeline.threads of spate and upstream
  PEER_BENCH_PROFILE=0          1: after the measured runs, one more spate
                                run per workload (and one upstream) under
                                `perf record -F 999` (not in the tables):
                                <target>/peer-bench/profile-*.txt
  PEER_BENCH_REPLICATED=1       0: plain ClickHouse and MergeTree tables
  --kafka real: SPATE_KAFKA_DIR=/tmp/spate-kafka-peer-bench
                SPATE_KAFKA_BASE_PORT=17292, PEER_BENCH_PARTITIONS=12

Output: Markdown tables on stdout and in <target>/peer-bench.md, every run's
measurements in <target>/peer-bench/runs.tsv (runs-sensor.tsv,
runs-discard.tsv), logs of every process under <target>/peer-bench/.
"""


def _posint(s):
    return bool(re.fullmatch(r"[1-9][0-9]*", s or ""))


@dataclasses.dataclass
class Settings:
    kafka: str = "real"
    workload: str = "all"
    rows: int = 1_000_000
    reps: int = 3
    target: str = ""
    ch_dir: str = "/tmp/spate-ch-peer-bench"
    ch_base_port: str = "17123"
    kafka_dir: str = "/tmp/spate-kafka-peer-bench"
    kafka_base_port: str = "17292"
    admin_port: int = 17190
    timeout: float = 300
    stall: float = 60
    kafka_consumers: int = 2
    kafka_block: int = 1048576
    py_batch: int = 100000
    systems: tuple = FLIGHT_ARMS
    sensor_systems: tuple = SENSOR_ARMS
    sensor_messages: int = 20000
    registry_port: int = 17181
    spate_threads: int = 2
    replicated: bool = True
    sinker_version: str = "v3.1.9"
    profile: bool = False
    partitions: int = 12

    def want(self, workload):
        return self.workload in ("all", workload)


class UsageError(Exception):
    pass


def parse_settings(argv, env) -> Settings:
    """The command line and environment as the bash script read them;
    UsageError for anything it refused."""
    s = Settings()
    reps = env.get("PEER_BENCH_REPS", "3")
    rows = "1000000"
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("--kafka", "--workload", "--reps"):
            if not args:
                raise UsageError(USAGE)
            v = args.pop(0)
            if a == "--kafka":
                s.kafka = v
            elif a == "--workload":
                s.workload = v
            else:
                reps = v
        elif a in ("-h", "--help"):
            raise UsageError(USAGE + "\n\n" + BENCH_HELP)
        else:
            rows = a
    if s.kafka not in ("real", "mock") or s.workload not in ("flights", "sensor", "all"):
        raise UsageError(USAGE)
    if not _posint(rows) or not _posint(reps):
        raise UsageError(USAGE)
    s.rows, s.reps = int(rows), int(reps)
    s.target = env.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    s.ch_dir = env.get("SPATE_CH_DIR", s.ch_dir)
    s.ch_base_port = env.get("SPATE_CH_BASE_PORT", s.ch_base_port)
    s.kafka_dir = env.get("SPATE_KAFKA_DIR", s.kafka_dir)
    s.kafka_base_port = env.get("SPATE_KAFKA_BASE_PORT", s.kafka_base_port)
    num = {
        "admin_port": "PEER_BENCH_ADMIN_PORT", "timeout": "PEER_BENCH_TIMEOUT",
        "stall": "PEER_BENCH_STALL", "kafka_consumers": "PEER_BENCH_KAFKA_CONSUMERS",
        "kafka_block": "PEER_BENCH_KAFKA_BLOCK", "py_batch": "PEER_BENCH_PY_BATCH",
        "sensor_messages": "PEER_BENCH_SENSOR_MESSAGES",
        "registry_port": "PEER_BENCH_REGISTRY_PORT",
        "spate_threads": "PEER_BENCH_SPATE_THREADS", "partitions": "PEER_BENCH_PARTITIONS",
    }
    for field, var in num.items():
        if var in env:
            if not _posint(env[var]):
                raise UsageError(f"{var}: not a positive integer: {env[var]!r}")
            setattr(s, field, int(env[var]))
    s.systems = tuple(env.get("PEER_BENCH_SYSTEMS", " ".join(FLIGHT_ARMS)).split())
    s.sensor_systems = tuple(env.get("PEER_BENCH_SENSOR_SYSTEMS", " ".join(SENSOR_ARMS)).split())
    for a in s.systems:
        if a not in FLIGHT_ARMS:
            raise UsageError(f"PEER_BENCH_SYSTEMS: unknown arm {a} (known: {' '.join(FLIGHT_ARMS)})")
    for a in s.sensor_systems:
        if a not in SENSOR_ARMS:
            raise UsageError(
                f"PEER_BENCH_SENSOR_SYSTEMS: unknown arm {a} (known: {' '.join(SENSOR_ARMS)})"
            )
    s.replicated = env.get("PEER_BENCH_REPLICATED", "1") == "1"
    s.sinker_version = env.get("PEER_BENCH_SINKER_VERSION", s.sinker_version)
    s.profile = env.get("PEER_BENCH_PROFILE", "0") == "1"
    return s


def rotation(arms, rep):
    """The arms in repetition REP's order (1-based): rep 1 runs A B C, rep 2
    B C A, ..."""
    n = len(arms)
    return [arms[(k + rep - 1) % n] for k in range(n)]


def mock_partitions(payload_bytes: int, messages: int, per_message_overhead: int = 32) -> int:
    """Partitions for a mock-cluster topic so each holds under 3 MiB of its
    5 MiB retention (the mock stores each message with its key and ~20 bytes
    of record overhead); at least 8."""
    return max(8, int((payload_bytes + messages * per_message_overhead) / (3 * 1048576)) + 1)


# The sensor messages are about 4 KB of Avro each (100 events); 5 KB is the
# estimate the mock topic's partitions are sized by (the retention check
# then proves the estimate held).
SENSOR_MESSAGE_BYTES_ESTIMATE = 5000


def rate_cells(m, landed_first_fallback=True):
    """(wall, rate) of a measurement: rows landed when the watch ended over
    the time from the first row consumed to then; "-" when unknown."""
    first = m.first if m.first is not None else (m.first_landed if landed_first_fallback else None)
    if first is None or m.done <= first or m.landed == 0:
        return "-", "-"
    return f"{m.done - first:.2f}", str(int(m.landed / (m.done - first)))


def per_million(cpu, rows):
    if cpu == "-" or rows == 0:
        return "-"
    return f"{float(cpu) * 1_000_000 / rows:.2f}"


def flights_gate(m, rows, landed, distinct):
    dups = landed - distinct
    if m.status != "complete":
        return m.status
    if distinct != rows:
        return f"lost {rows - distinct} rows"
    if dups != 0:
        return f"{dups} duplicate rows"
    if rate_cells(m)[1] == "-":
        return "no first-row time"
    return "pass"


def sensor_gate(m, messages, expect_kept, values):
    landed, distinct = int(values[0]), int(values[1])
    if m.status != "complete":
        return m.status
    if distinct != expect_kept:
        return f"kept {distinct} distinct rows, expected {expect_kept}"
    if landed - distinct != 0:
        return f"{landed - distinct} duplicate rows"
    check = sensor_check(messages, values)
    if check != "pass":
        return check
    if rate_cells(m)[1] == "-":
        return "no first-row time"
    return "pass"


def discard_gate(m, expect_kept, refused):
    if m.status != "complete":
        return m.status
    if m.landed != expect_kept:
        return f"acknowledged {m.landed} rows, expected {expect_kept}"
    if refused != 0:
        return f"{refused} inserts refused by the endpoint"
    if rate_cells(m, landed_first_fallback=False)[1] == "-":
        return "no first-row time"
    return "pass"


@dataclasses.dataclass
class Measurement:
    status: str = "complete"
    first: float = None
    first_landed: float = None
    done: float = 0.0
    landed: int = 0


def watch(count, target, first=None, alive=None, timeout=300, stall=60, clock=time.time,
          mono=time.monotonic, sleep=time.sleep, interval=0.1):
    """Polls COUNT() every INTERVAL until TARGET rows landed, ALIVE() turns
    false, TIMEOUT seconds pass or no new row came for STALL seconds. FIRST()
    (until it answers) gives the first row consumed, else None."""
    m = Measurement()
    last_n = -1
    start = mono()
    deadline, stall_at = start + timeout, start + stall
    while True:
        t = clock()
        if m.first is None and first is not None:
            m.first = first()
        n = count()
        if m.first_landed is None and n > 0:
            m.first_landed = t
        m.landed = n
        if n >= target:
            m.done = t
            return m
        if n != last_n:
            last_n, stall_at = n, mono() + stall
        if alive is not None and not alive():
            m.status, m.done = f"consumer exited after {n} rows", t
            return m
        if mono() > deadline:
            m.status, m.done = f"timed out after {timeout:g}s with {n} rows", t
            return m
        if mono() > stall_at:
            m.status, m.done = f"stalled at {n} rows (no new row for {stall:g}s)", t
            return m
        sleep(interval)


# ------------------------------------------------------------ the arm table


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: `key` is its name in PEER_BENCH_SYSTEMS (flights) or
    PEER_BENCH_SENSOR_SYSTEMS (sensor), `name` its row in the table, `kind`
    how it starts (spate, upstream, upstream-native: a process with a YAML
    config; python: ci/peer_bench.py consume; kafka-engine: a materialized
    view inside the server; sinker: go install), `endpoint` where it writes
    (ch18: ClickHouse 18.16; chdb; discard: chdb --discard-inserts), which
    also says how its rows are counted and gated."""

    key: str
    name: str
    workload: str
    kind: str
    table: str
    endpoint: str = "ch18"
    delivery: str = "at_least_once"

    def table_for(self, rep):
        return self.table if self.workload == "flights" else f"{self.table}_{rep}"

    @property
    def gate(self):
        """flights: count and uniqExact(id) = ROWS; sensor: count,
        uniqExact and checksums = the closed form; discard: the arm's count of
        rows acknowledged = the kept rows, no insert refused."""
        if self.workload == "flights":
            return "flights"
        return "discard" if self.endpoint == "discard" else "sensor"

    @property
    def first_metric(self):
        """The /metrics counter whose first non-zero value is the first row
        consumed (None: the arm says otherwise)."""
        return {"spate": "spate_records_polled_total", "upstream": "spate_deser_records_total",
                "upstream-native": "spate_deser_records_total"}.get(self.kind)

    @property
    def ack_metric(self):
        """Into the discarding endpoint nothing lands: the arm's own count of
        rows acknowledged is what is counted."""
        if self.endpoint != "discard":
            return None
        return "spate_sink_rows_written_total" if self.kind == "spate" else "spate_sink_records_total"


ARMS = (
    Arm("spate", "spate", "flights", "spate", "peer_spate"),
    Arm("spate-eo", "spate (effectively_once)", "flights", "spate", "peer_spate_eo",
        delivery="effectively_once"),
    Arm("kafka", "ClickHouse Kafka engine + MV", "flights", "kafka-engine", "peer_kafka"),
    Arm("python", "Python loop (confluent-kafka)", "flights", "python", "peer_python"),
    Arm("sinker", "clickhouse_sinker", "flights", "sinker", ""),
    Arm("spate", "spate -> ClickHouse 18.16", "sensor", "spate", "sensor_spate"),
    Arm("spate-chdb", "spate -> chdb endpoint", "sensor", "spate", "sensor_spate_chdb", "chdb"),
    Arm("upstream", "upstream spate 0.2.0 (RowBinary) -> chdb endpoint", "sensor", "upstream",
        "sensor_upstream", "chdb"),
    Arm("upstream-native", "upstream spate 0.2.0 (Native) -> chdb endpoint", "sensor",
        "upstream-native", "sensor_upstream_native", "chdb"),
    Arm("spate-discard", "spate -> discarding endpoint", "sensor", "spate",
        "sensor_spate_discard", "discard"),
    Arm("upstream-discard", "upstream spate 0.2.0 (RowBinary) -> discarding endpoint", "sensor",
        "upstream", "sensor_upstream_discard", "discard"),
)


def arm(workload, key):
    for a in ARMS:
        if a.workload == workload and a.key == key:
            return a
    raise KeyError(f"{workload}/{key}")


assert tuple(a.key for a in ARMS if a.workload == "flights") == FLIGHT_ARMS
assert tuple(a.key for a in ARMS if a.workload == "sensor") == SENSOR_ARMS


def spate_flights_yaml(arm_, table, rep, run_id, brokers, topic, ch_url, threads, admin_port):
    delivery = "" if arm_.delivery == "at_least_once" else f", delivery: {arm_.delivery}"
    return f"""\
pipeline: {{ name: "peer-bench-{run_id}", threads: {threads}, io_threads: 2{delivery} }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "peer-{table}-{run_id}-{rep}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500" }}
format: {{ json: {{ time_formats: ["%Y/%m/%d %H:%M"] }} }}
on_error: {{ policy: fail }}
sink:
  clickhouse:
    shards: [["{ch_url}"]]
    table: {table}
    batch: {{ max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }}
    inflight: {{ max_inflight: 2, max_bytes: 256MiB }}
shutdown: {{ drain_timeout: 30s }}
admin: {{ listen: "127.0.0.1:{admin_port}" }}
"""


def spate_sensor_yaml(table, run_id, brokers, topic, url, registry, threads, admin_port):
    return f"""\
pipeline: {{ name: "peer-sensor-{run_id}", threads: {threads}, io_threads: 2 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "peer-{table}-{run_id}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500" }}
format: {{ avro: {{ framing: confluent, registry: {{ url: "{registry}" }} }} }}
mapping:
  explode: /events
  filter: ['unit != "drop"', 'value >= 0']
  defaults: {{ region: unknown }}
on_error: {{ policy: fail }}
sink:
  clickhouse:
    shards: [["{url}"]]
    table: {table}
    batch: {{ max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }}
    inflight: {{ max_inflight: 2, max_bytes: 256MiB }}
shutdown: {{ drain_timeout: 30s }}
admin: {{ listen: "127.0.0.1:{admin_port}" }}
"""


def upstream_sensor_yaml(table, run_id, brokers, topic, url, registry, threads, admin_port, fmt):
    return f"""\
pipeline: {{ name: "peer-upstream-{run_id}", threads: {threads}, io_threads: 2 }}
checkpoint: {{ interval: 1s, drain_timeout: 30s }}
admin: {{ listen: "127.0.0.1:{admin_port}" }}
metrics: {{ exporter: prometheus }}
source:
  kafka:
    brokers: "{brokers}"
    topic: {topic}
    group_id: "peer-{table}-{run_id}"
    commit_interval: 1s
    rdkafka: {{ auto.offset.reset: earliest }}
deserializer:
  avro:
    mode: confluent
    registry: {{ url: "{registry}" }}
sink:
  clickhouse:
    table: {table}
    columns: [{SENSOR_COLUMNS}]
    format: {fmt}
    compression: none
    shards:
      - replicas: ["{url}"]
    batch: {{ max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }}
    inflight: {{ max_per_shard: 2 }}
"""


def kafka_stream_start(lines):
    """The Kafka engine's first background stream that committed rows, from
    the server log's lines of this run: the "Started streaming" time (its
    first two fields) of the stream whose "Committing N messages" (N > 0)
    comes first; None when there is none yet."""
    last = None
    for line in lines:
        if "StorageKafka (peer_kafka_queue)" not in line:
            continue
        if "Started streaming" in line:
            f = line.split()
            last = f"{f[0]} {f[1]}" if len(f) > 1 else None
        if re.search(r"Committing [1-9][0-9]* messages", line):
            return last
    return None


def server_log_time(stamp):
    """"2026.11.29 18:40:01.123456" (the server's local time) in seconds
    since the epoch."""
    return datetime.datetime.strptime(stamp, "%Y.%m.%d %H:%M:%S.%f").timestamp()


def one_line(text, width=None):
    lines = text.splitlines()
    if width:
        lines = [ln[:width] for ln in lines]
    return " ".join(ln.replace("|", " ") for ln in lines)


def num_text(v):
    return str(int(v)) if float(v).is_integer() else str(v)


# ------------------------------------------------------------ the driver


def log(msg):
    print(f"peer-bench: {msg}", file=sys.stderr, flush=True)


def http_call(url, body=None, timeout=60):
    """(status, text) of a GET (body None) or POST; status 0 when it did not
    connect."""
    req = urllib.request.Request(url, data=body.encode() if isinstance(body, str) else body)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return 0, ""


class Bench:
    def __init__(self, s: Settings):
        self.s = s
        self.work = os.path.join(s.target, "peer-bench")
        self.out = os.path.join(s.target, "peer-bench.md")
        self.spate = os.path.join(s.target, "release", "spate")
        self.upstream = os.path.join(s.target, "upstream-spate", "release", "upstream-spate-arm")
        self.run_id = str(int(time.time()))
        self.topic = "flights"
        self.sensor_topic = "sensors"
        self.cleanups = []  # run in reverse at the end, whatever happened
        self.procs = []  # every child process started here
        self.servers = {}  # endpoint -> (url, pid)
        self.sinker = None  # (binary or None, why)
        self.brokers = {}  # topic -> bootstrap servers

    # -------------------------------------------------------- processes

    def path(self, name):
        return os.path.join(self.work, name)

    def popen(self, cmd, name, env=None, group=False):
        """Starts CMD with stdout in NAME.out and stderr in NAME.log (under
        the work directory); every process started here is stopped at the
        end."""
        with open(self.path(f"{name}.out"), "wb") as out, open(self.path(f"{name}.log"), "wb") as err:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, start_new_session=group)
        self.procs.append(p)
        return p

    def stop(self, p, grace=120, children_only=False):
        """SIGTERM (to the children of P when CHILDREN_ONLY: perf's arm), a
        wait of GRACE seconds, then SIGKILL; the exit status as a shell
        gives it (128 + signal)."""
        if p.poll() is None:
            targets = children(p.pid) if children_only else [p.pid]
            for pid in targets:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                log(f"pid {p.pid} ({os.path.basename(p.args[0])}) ignored SIGTERM for {grace}s: SIGKILL")
                p.kill()
                p.wait()
        if p in self.procs:
            self.procs.remove(p)
        return 128 - p.returncode if p.returncode < 0 else p.returncode

    def script(self, *cmd, env=None, check=True):
        """Runs one of ci/*.sh and returns its stdout (stderr passes through)."""
        r = subprocess.run(["bash", *cmd], stdout=subprocess.PIPE, env={**os.environ, **(env or {})},
                           text=True, cwd=ROOT)
        if check and r.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} failed (exit {r.returncode})")
        return r.stdout

    def wait_file(self, p, path, seconds, what, log_path):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if os.path.exists(path) and os.path.getsize(path) > 0:
                with open(path) as f:
                    line = f.readline().strip()
                if line:
                    return line
            if p.poll() is not None:
                raise BenchError(f"{what} exited: {tail(log_path, 5)}")
            time.sleep(0.1)
        raise BenchError(f"{what} did not answer in {seconds} s")

    def cleanup(self):
        for p in list(reversed(self.procs)):
            try:
                self.stop(p, grace=30)
            except Exception as e:  # noqa: BLE001
                log(f"stopping pid {p.pid}: {e}")
        for f in reversed(self.cleanups):
            try:
                f()
            except Exception as e:  # noqa: BLE001
                log(f"cleanup: {e}")

    # -------------------------------------------------------- ClickHouse

    def ch(self, sql, url=None):
        status, text = http_call((url or self.servers["ch18"][0]) + "/", sql)
        if status != 200:
            raise BenchError(f"ClickHouse {status}: {sql[:120]}: {text.strip()[:500]}")
        return text

    def count(self, url, table):
        status, text = http_call(url + "/", f"SELECT count() FROM {table}")
        return int(text) if status == 200 and text.strip().isdigit() else 0

    def metric(self, name):
        status, text = http_call(f"http://127.0.0.1:{self.s.admin_port}/metrics", timeout=5)
        return metric_sum(text, name) if status == 200 else 0.0

    def fresh_table(self, table, rep):
        self.ch(f"DROP TABLE IF EXISTS {table}")
        cols = "id UInt64, date DateTime, delay Int32, distance UInt32, origin String, destination String"
        if self.s.replicated:
            self.ch(f"CREATE TABLE {table} ({cols}) ENGINE = ReplicatedMergeTree('/clickhouse/tables/"
                    f"{{shard}}/{table}_{self.run_id}_{rep}', '{{replica}}') ORDER BY id "
                    "SETTINGS replicated_deduplication_window = 10000")
        else:
            self.ch(f"CREATE TABLE {table} ({cols}) ENGINE = MergeTree ORDER BY id")

    def sensor_table(self, url, table):
        self.ch(f"DROP TABLE IF EXISTS {table}", url)
        self.ch(f"CREATE TABLE {table} ({SENSOR_DDL}) ENGINE = MergeTree ORDER BY (batch_id, event_seq)", url)

    def inserts(self, url, table):
        """The endpoint's account of the inserts into TABLE (ci/chdb_server.py)."""
        _, text = http_call(url + "/_chdb/inserts")
        out = []
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("table") == f"default.{table}":
                out.append(rec)
        return out

    def reset_hwm(self, pid):
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            log("cannot reset the server's VmHWM; its peak RSS includes earlier runs")

    # -------------------------------------------------------- Kafka

    def check_retention(self, topic, expect, before):
        try:
            n = watermarks(self.brokers[topic], topic)
        except BenchError as e:
            raise BenchError(f"broker retention deleted data before {before}: {e}") from e
        if n != expect:
            raise BenchError(f"the topic {topic} holds {n} messages before {before}, not {expect}")

    def start_mock(self, topic, partitions):
        name = f"broker-{topic}" if topic != self.topic else "broker"
        p = self.popen([self.spate, "broker", "--topic", topic, "--partitions", str(partitions)], name,
                       group=True)
        return self.wait_file(p, self.path(f"{name}.out"), 10, "spate broker", self.path(f"{name}.log"))

    # -------------------------------------------------------- the arm runner

    def run_arm(self, a: Arm, rep, profile_to=None):
        """Runs arm A once (repetition REP): prepare, start, watch, measure,
        stop, count, gate, one line of its runs file. PROFILE_TO: the run is
        under perf and is not reported."""
        s = self.s
        if a.kind == "sinker":
            return self.sinker_not_run(a, rep)
        table = a.table_for(rep)
        url, spid = self.servers[a.endpoint]
        target = s.rows if a.workload == "flights" else self.expect_kept
        topic = self.topic if a.workload == "flights" else self.sensor_topic
        self.check_retention(topic, s.rows if a.workload == "flights" else s.sensor_messages,
                             "the Kafka engine" if a.kind == "kafka-engine"
                             else "the Python loop" if a.kind == "python" else a.name)
        if a.workload == "flights":
            self.fresh_table(table, rep)
        else:
            self.sensor_table(url, table)
        start = getattr(self, f"start_{a.kind.replace('-', '_')}")
        ctx = {"table": table, "url": url, "topic": topic, "rep": rep}
        log(f"{a.name} rep {rep}: running")
        self.reset_hwm(spid)
        s_cpu0 = cpu_of(spid)
        prefix = ["perf", "record", "-F", "999", "-o", f"{profile_to}.data", "--"] if profile_to else []
        proc = start(a, ctx, prefix)

        def first_by_metric():
            return time.time() if self.metric(a.first_metric) > 0 else None

        def first_by_file():
            try:
                with open(ctx["first_file"]) as f:
                    return float(f.read().strip())
            except (OSError, ValueError):
                return None

        first = first_by_metric if a.first_metric else first_by_file if a.kind == "python" else None
        if a.ack_metric:
            def count():
                return int(self.metric(a.ack_metric))
        else:
            def count():
                return self.count(url, table)
        m = watch(count, target, first, None if proc is None else (lambda: not exited(proc.pid)),
                  timeout=s.timeout, stall=s.stall)
        log(f"{a.name}: {m.status}")
        if proc is None:
            c_cpu, c_rss = "-", "(in server)"
        else:
            try:
                c_cpu = f"{cpu_of(proc.pid):.3f}"
            except OSError:
                c_cpu = "-"
            c_rss = hwm_of(proc.pid)
            ctx["threads"] = thread_cpu_of(proc.pid)
        s_cpu = f"{cpu_of(spid) - s_cpu0:.3f}"
        s_rss = hwm_of(spid)
        note = getattr(self, f"note_{a.kind.replace('-', '_')}")(a, ctx, m)
        if proc is not None:
            rc = self.stop(proc, children_only=bool(profile_to))
            note += f"; exit {rc}" + ("" if a.kind == "python" else " after SIGTERM")
        if profile_to:
            self.profile_stop(profile_to, f"{a.name}, {a.workload}, {target} "
                              f"{'rows' if a.workload == 'flights' else 'kept rows'}")
            return None
        return self.report(a, ctx, m, (c_cpu, c_rss, s_cpu, s_rss), note)

    def report(self, a, ctx, m, cpu_rss, note):
        """Counts and gates one run and appends its line to the workload's
        runs file; returns the line's fields."""
        c_cpu, c_rss, s_cpu, s_rss = cpu_rss
        url, table = ctx["url"], ctx["table"]
        if a.gate == "flights":
            landed = self.count(url, table)
            distinct = int(self.ch(f"SELECT uniqExact(id) FROM {table}").strip())
            gate = flights_gate(m, self.s.rows, landed, distinct)
            dups, divisor, runs = str(landed - distinct), distinct, self.runs
        elif a.gate == "sensor":
            values = self.ch(f"SELECT {SENSOR_CHECK_SQL} FROM {table} FORMAT TSV", url).split()
            landed, distinct = int(values[0]), int(values[1])
            gate = sensor_gate(m, self.s.sensor_messages, self.expect_kept, values)
            dups, divisor, runs = str(landed - distinct), distinct, self.runs_sensor
        else:
            ins = self.inserts(url, table)
            refused = sum(1 for r in ins if r.get("outcome") != "discarded")
            landed = m.landed
            gate = discard_gate(m, self.expect_kept, refused)
            dups, divisor, runs = "-", self.expect_kept, self.runs_discard
            note += f"; {len(ins)} inserts discarded"
        wall, rate = rate_cells(m, landed_first_fallback=a.gate != "discard")
        if gate != "pass":
            log(f"{a.name} rep {ctx['rep']}: FAILED a gate: {gate}")
        fields = [a.name, str(ctx["rep"]), gate, str(landed), dups, wall, rate,
                  per_million(c_cpu, divisor), c_rss, per_million(s_cpu, divisor), s_rss, note]
        with open(runs, "a") as f:
            f.write("\t".join(fields) + "\n")
        return fields

    # -------------------------------------------------------- per kind: start and note

    def start_spate(self, a, ctx, prefix):
        s, table = self.s, ctx["table"]
        if a.workload == "flights":
            name = f"{table}-{ctx['rep']}"
            text = spate_flights_yaml(a, table, ctx["rep"], self.run_id, self.brokers[self.topic],
                                      self.topic, ctx["url"], s.spate_threads, s.admin_port)
        else:
            name = table
            text = spate_sensor_yaml(table, self.run_id, self.brokers[self.sensor_topic],
                                     self.sensor_topic, ctx["url"], self.registry_url,
                                     s.spate_threads, s.admin_port)
        with open(self.path(f"{name}.yaml"), "w") as f:
            f.write(text)
        ctx["log"] = self.path(f"{name}.log")
        return self.popen([*prefix, self.spate, "run", "-c", self.path(f"{name}.yaml")], name)

    def start_upstream(self, a, ctx, prefix):
        s, table = self.s, ctx["table"]
        fmt = "native" if a.kind == "upstream-native" else "rowbinary"
        with open(self.path(f"{table}.yaml"), "w") as f:
            f.write(upstream_sensor_yaml(table, self.run_id, self.brokers[self.sensor_topic],
                                         self.sensor_topic, ctx["url"], self.registry_url,
                                         s.spate_threads, s.admin_port, fmt))
        ctx["log"] = self.path(f"{table}.log")
        return self.popen([*prefix, self.upstream], table,
                          env={"SPATE_CONFIG": self.path(f"{table}.yaml"), "UPSTREAM_FORMAT": fmt})

    start_upstream_native = start_upstream

    def start_python(self, a, ctx, prefix):
        rep = ctx["rep"]
        ctx["first_file"] = self.path(f"python-{rep}.first")
        return self.popen([*prefix, sys.executable, os.path.abspath(__file__), "consume",
                           self.brokers[self.topic], self.topic, f"peer-python-{self.run_id}-{rep}",
                           ctx["url"], ctx["table"], str(self.s.py_batch), ctx["first_file"]],
                          f"python-{rep}")

    def start_kafka_engine(self, a, ctx, prefix):
        s, rep = self.s, ctx["rep"]
        self.ch("DROP TABLE IF EXISTS peer_kafka_mv")
        self.ch("DROP TABLE IF EXISTS peer_kafka_queue")
        # The queue reads the date as String (JSONEachRow in 18.16 parses
        # DateTime only as YYYY-MM-DD hh:mm:ss); the view converts it.
        settings = (f"kafka_broker_list = '{self.brokers[self.topic]}', kafka_topic_list = '{self.topic}', "
                    f"kafka_group_name = 'peer-ch-kafka-{self.run_id}-{rep}', kafka_format = 'JSONEachRow', "
                    f"kafka_num_consumers = {s.kafka_consumers}, kafka_max_block_size = {s.kafka_block}")
        self.ch("CREATE TABLE peer_kafka_queue (id UInt64, date String, delay Int32, distance UInt32, "
                f"origin String, destination String) ENGINE = Kafka SETTINGS {settings}")
        ctx["log_from"] = line_count(self.ch_log)
        ctx["stdout_from"] = line_count(self.ch_stdout)
        log(f"Kafka engine rep {rep}: {settings}")
        self.ch("CREATE MATERIALIZED VIEW peer_kafka_mv TO peer_kafka AS SELECT id, "
                "parseDateTimeBestEffort(date) AS date, delay, distance, origin, destination "
                "FROM peer_kafka_queue")
        return None

    def note_spate(self, a, ctx, m):
        s = self.s
        if a.workload == "sensor":
            note = (f"spate, format native (its default: typed blocks transcoded from the RowBinary rows), "
                    f"threads {s.spate_threads}, batch max_rows 1M / 64 MiB / linger 200ms")
            return self.sensor_note(a, ctx, m, note)
        inserts = self.metric("spate_sink_batches_flushed_total")
        ins_rate = "-"
        if m.first is not None and m.done > m.first:
            ins_rate = f"{inserts / (m.done - m.first):.1f}"
        return (f"delivery {a.delivery}; format native (default); {num_text(inserts)} inserts ({ins_rate}/s); "
                f"threads {s.spate_threads}, io_threads 2, batch max_rows 1M / 64 MiB / linger 200ms, "
                f"max_inflight 2; CPU s by thread (whole run): {ctx.get('threads', '')}")

    def note_upstream(self, a, ctx, m):
        fmt = "Native" if a.kind == "upstream-native" else "RowBinary"
        note = (f"upstream spate 0.2.0 ({fmt}), build_datum into borrowed records, flat_map, filter, "
                f"threads {self.s.spate_threads}, batch max_rows 1M / 64 MiB / linger 200ms, 2 inserts in flight")
        return self.sensor_note(a, ctx, m, note)

    note_upstream_native = note_upstream

    def sensor_note(self, a, ctx, m, note):
        if a.endpoint == "chdb":
            # The endpoint pays per insert (one lock, a temp file, a query
            # each): how many inserts an arm made says what its rows/s there
            # is bound by.
            note += f"; {len(self.inserts(ctx['url'], ctx['table']))} inserts"
        if a.endpoint != "discard" and m.status != "complete":
            note += f"; last log lines: {one_line(tail(ctx['log'], 2), 240)}"
        return note

    def note_python(self, a, ctx, m):
        import importlib.metadata  # noqa: PLC0415

        import confluent_kafka  # noqa: PLC0415

        return (f"confluent-kafka {importlib.metadata.version('confluent-kafka')} (librdkafka "
                f"{confluent_kafka.libversion()[0]}), {self.s.py_batch}-row JSONEachRow HTTP inserts, "
                "sync commit after each")

    def note_kafka_engine(self, a, ctx, m):
        s = self.s
        # The engine logs no line per poll. Two lower bounds on its first
        # consumed row, the later of which is taken (it errs early, against
        # the engine): the start of its first background stream that
        # committed rows (server log; the commit comes at the end of the
        # stream, so wait for it before dropping the view), and its
        # consumers' first partition assignment in this run (librdkafka's
        # debug=cgrp log on the server's stdout, epoch seconds in the second
        # |-field): a stream that starts before the group join blocks
        # through it.
        stream_start = None
        for _ in range(150):
            stream_start = kafka_stream_start(read_lines(self.ch_log, ctx["log_from"]))
            if stream_start:
                break
            time.sleep(0.1)
        out_lines = read_lines(self.ch_stdout, ctx["stdout_from"], binary_safe=True)
        assigned = next((ln.split("|")[1] for ln in out_lines
                         if f"assigned topic {self.topic} partitions" in ln and "|" in ln), None)
        if stream_start:
            m.first = server_log_time(stream_start)
            try:
                if assigned and float(assigned) > m.first:
                    m.first = float(assigned)
            except ValueError:
                pass
        self.ch("DROP TABLE peer_kafka_mv")
        self.ch("DROP TABLE peer_kafka_queue")
        reason = ""
        if m.status != "complete":
            bad = [ln[:300] for ln in read_lines(self.ch_log, ctx["log_from"])
                   if re.search(r"<(Error|Warning)>|Exception", ln) and re.search(r"kafka|rdk", ln, re.I)]
            reason = "\n".join(bad[-3:])
            with open(self.path("kafka-engine-errors.log"), "w") as f:
                f.write(reason + "\n")
        # Rebalances of the engine's group in this run: a partition left
        # unassigned after one is a way for the engine to stall short of ROWS.
        rebalances = sum(1 for ln in out_lines if "initiating rebalance" in ln)
        if m.first is not None:
            first_note = ("first row: the later of its first partition assignment (librdkafka debug log) "
                          "and the start of its first stream that committed rows (server log)")
        else:
            first_note = "first row: first count() > 0 (no committed stream in the server log)"
        note = (f"kafka_num_consumers {s.kafka_consumers}, kafka_max_block_size {s.kafka_block}, "
                f"stream_flush_interval_ms 7500 (default); server librdkafka {self.server_librdkafka}; "
                f"{first_note}; CPU and RSS are the server's; librdkafka log: {rebalances} rebalance starts "
                f"over its {s.kafka_consumers} consumer(s) (the first join counts one each)")
        if reason:
            note += f"; server log: {one_line(reason)}"
        return note

    def sinker_not_run(self, a, rep):
        """clickhouse_sinker (Go), built once with the ordinary Go tooling."""
        if self.sinker is None:
            gobin = os.path.join(self.s.target, "peer-bench-go", "bin")
            os.makedirs(gobin, exist_ok=True)
            mod = f"github.com/housepower/clickhouse_sinker/cmd/clickhouse_sinker@{self.s.sinker_version}"
            with open(self.path("sinker-install.log"), "wb") as f:
                r = subprocess.run(["go", "install", mod], stdout=f, stderr=subprocess.STDOUT,
                                   env={**os.environ, "GOBIN": gobin}) if shutil.which("go") else None
            if r is not None and r.returncode == 0:
                self.sinker = (os.path.join(gobin, "clickhouse_sinker"), "")
            else:
                lines = [ln for ln in open(self.path("sinker-install.log")).read().splitlines() if ln.strip()]
                why = (f"go install ...clickhouse_sinker@{self.s.sinker_version} failed: "
                       + " ".join(ln.replace("\t", " ").replace("|", " ") for ln in lines[:2])
                       if r is not None else "go is not installed")
                self.sinker = (None, why)
                log(f"clickhouse_sinker: {why}")
        binary, why = self.sinker
        if binary:
            why = f"built at {binary}, but this script has no configuration for it yet"
        fields = [a.name, str(rep), f"not run: {why}"] + ["-"] * 8 + [why]
        with open(self.runs, "a") as f:
            f.write("\t".join(fields) + "\n")
        return fields

    # -------------------------------------------------------- profiling

    def profile_stop(self, to, title):
        """perf's account of a profiled run: self time by library and by
        function, in TO.txt."""
        data = f"{to}.data"

        def report(*args):
            r = subprocess.run(["perf", "report", "-i", data, "--stdio", *args],
                               capture_output=True, text=True)
            return r.stdout.splitlines()

        body = [f"# {title}: perf record -F 999, the arm's whole run (start-up and the group join included)",
                "## self time by library"]
        body += [ln for ln in report("--no-children", "--sort", "dso", "--percent-limit", "0.5")
                 if ln.strip() and not ln.startswith("#")]
        body.append("## self time by function (top 40)")
        body += [ln for ln in report("--no-children", "--sort", "dso,sym")
                 if ln.strip() and not ln.startswith("#")][:40]
        samples = next((ln.split()[2] for ln in report() if ln.startswith("# Samples:")), "?")
        body.append(f"## samples: {samples} at 999 Hz")
        with open(f"{to}.txt", "w") as f:
            f.write("\n".join(body) + "\n")
        if os.path.exists(data):
            os.remove(data)
        log(f"profile written to {to}.txt")

    # -------------------------------------------------------- the whole run

    def run(self):
        s = self.s
        if not shutil.which("curl"):
            apt_install("curl")  # ci/clickhouse.sh and ci/registry.sh use it
        if s.profile and not shutil.which("perf"):
            apt_install("linux-perf")
        log("building spate (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "spate"], stdout=sys.stderr, check=True, cwd=ROOT)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        open(self.out, "w").close()
        tee = Tee(self.out)
        self.runs = self.path("runs.tsv")
        self.runs_sensor = self.path("runs-sensor.tsv")
        self.runs_discard = self.path("runs-discard.tsv")

        # --- rows: the fixture repeated with distinct ids 0..ROWS-1 (as `spate demo`)
        data = self.path("flights.ndjson")
        if s.want("flights"):
            with open(os.path.join(ROOT, "engine/spate/fixtures/flights-20k.ndjson")) as f:
                lines = [ln.rstrip("\n")[1:] for ln in f if ln.startswith("{")]
            with open(data, "w") as f:
                for i in range(s.rows):
                    f.write(f'{{"id":{i},{lines[i % len(lines)]}\n')
            nbytes = os.path.getsize(data)
        else:
            nbytes = 0
        partitions = mock_partitions(nbytes, s.rows) if s.kafka == "mock" else s.partitions
        if s.want("flights"):
            log(f"{s.rows} rows, {nbytes} bytes of NDJSON, {partitions} partitions")

        # --- brokers, each topic loaded once
        if s.kafka == "real":
            self.cleanups.append(lambda: self.script("ci/kafka.sh", "stop", check=False))
            brokers = self.script("ci/kafka.sh", "start", "3").strip().splitlines()[-1]
            self.brokers = {self.topic: brokers, self.sensor_topic: brokers}
            if s.want("flights"):
                create_topic(brokers, self.topic, partitions, 3)
            self.broker_desc = (f"a real Apache Kafka 4.4.0 cluster (ci/kafka.sh: 3 KRaft nodes, {partitions} "
                                "partitions, replication factor 3, min.insync.replicas 2)")
            sensor_partitions = partitions
            self.sensor_broker_desc = self.broker_desc
        else:
            if s.want("flights"):
                self.brokers[self.topic] = self.start_mock(self.topic, partitions)
            self.broker_desc = f"the embedded broker (librdkafka mock cluster, {partitions} partitions)"
            sensor_partitions = mock_partitions(s.sensor_messages * SENSOR_MESSAGE_BYTES_ESTIMATE, s.sensor_messages)
            self.sensor_broker_desc = f"the embedded broker (librdkafka mock cluster, {sensor_partitions} partitions)"
        if s.want("flights"):
            log(f"broker {self.brokers[self.topic]}; producing")
            self.produce(["--topic", self.topic, data], "produce", self.topic)
            n = watermarks(self.brokers[self.topic], self.topic)
            if n != s.rows:
                raise BenchError(f"the topic holds {n} messages, not {s.rows}")
            log(f"{n} messages in {self.topic}, every low watermark 0")

        # --- ClickHouse 18.16, trace logging and librdkafka's consumer-group
        # debug log: the Kafka engine's only account of when it was assigned
        # partitions, streamed and committed (and why not) is the server's log.
        with open(self.path("kafka.xml"), "w") as f:
            f.write(KAFKA_XML)
        ch0 = os.path.join(s.ch_dir, "ch0")

        def stop_ch():
            # Keep the server's log (the Kafka engine's only account of itself).
            for src, dst in (("clickhouse-server.log", "clickhouse-server.log"),
                             ("clickhouse-server.err.log", "clickhouse-server.err.log"),
                             ("stdout.log", "clickhouse-server.stdout.log")):
                try:
                    shutil.copy(os.path.join(ch0, "log", src), self.path(dst))
                except OSError:
                    pass
            self.script("ci/clickhouse.sh", "stop", check=False)

        self.cleanups.append(stop_ch)
        extra = {"SPATE_CH_EXTRA_CONFIG": self.path("kafka.xml")}
        if s.replicated:
            ch_url = self.script("ci/clickhouse.sh", "start-replicated", "1", "1", env=extra).splitlines()[0]
        else:
            ch_url = self.script("ci/clickhouse.sh", "start", "1", env=extra).splitlines()[0]
        with open(os.path.join(ch0, "pid")) as f:
            ch_pid = int(f.read().strip())
        self.servers["ch18"] = (ch_url, ch_pid)
        self.ch_log = os.path.join(ch0, "log", "clickhouse-server.log")
        self.ch_stdout = os.path.join(ch0, "log", "stdout.log")
        self.ch_version = self.ch("SELECT version()").strip()
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "librdkafka1"], capture_output=True, text=True)
        self.server_librdkafka = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
        log(f"ClickHouse {self.ch_version} at {ch_url} (pid {ch_pid})")

        if s.want("flights"):
            self.flights(tee, nbytes)
        if s.want("sensor"):
            self.sensor(tee, sensor_partitions)


    def produce(self, args, name, topic):
        r = subprocess.run([self.spate, "produce", "--brokers", self.brokers[topic], *args],
                           stdout=open(self.path(f"{name}.out"), "wb"), stderr=open(self.path(f"{name}.log"), "wb"))
        if r.returncode != 0:
            raise BenchError(f"spate produce: {tail(self.path(f'{name}.log'), 3)}")


    def flights(self, tee, nbytes):
        s = self.s
        open(self.runs, "w").close()
        arms = [arm("flights", k) for k in s.systems]
        for rep in range(1, s.reps + 1):
            for a in rotation(arms, rep):
                self.run_arm(a, rep)
        if s.profile:
            self.run_arm(arm("flights", "spate"), "profile", profile_to=self.path("profile-flights-spate"))
        # Retention must still be intact: otherwise a short count could be the broker's.
        self.check_retention(self.topic, s.rows, "the end")
        table_desc = ("ReplicatedMergeTree table (one replica, replicated_deduplication_window = 10000)"
                      if s.replicated else "MergeTree table")
        tee(f"{s.rows} flight rows ({nbytes} bytes NDJSON) pre-loaded once into {self.broker_desc} (every low "
            f"watermark checked 0 before each run), then moved into ClickHouse {self.ch_version} on the same "
            f"machine ({machine_desc()}), one arm at a time, {s.reps} repetitions interleaved, each run in its "
            f"own consumer group and into a fresh {table_desc}. Medians over the runs that passed the gates, "
            f"[min-max] beside them. Command: `PEER_BENCH_REPLICATED={int(s.replicated)} bash ci/peer-bench.sh "
            f"--kafka {s.kafka} --reps {s.reps} {s.rows}`.")
        tee()
        with open(self.runs) as f:
            tee(summary_table(f.read().splitlines(), s.reps))
        log(f"table written to {self.out}; every run in {self.runs}")


    def sensor(self, tee, partitions):
        """The sensor workload (issue 21's SensorBatch; the upstream project's
        own): produced once, fanned out, filtered and coalesced by every arm,
        gated on the closed form (sensor_expect)."""
        s = self.s
        log("building the upstream spate 0.2.0 arm (release, its own Cargo project and lockfile)")
        subprocess.run(["cargo", "build", "--release", "--locked", "--manifest-path",
                        "benches/peers/upstream-spate/Cargo.toml"], stdout=sys.stderr, check=True, cwd=ROOT,
                       env={**os.environ, "CARGO_TARGET_DIR": os.path.join(s.target, "upstream-spate")})
        reg_env = {"SPATE_REGISTRY_DIR": self.path("registry"), "SPATE_REGISTRY_PORT": str(s.registry_port)}
        os.environ.update(reg_env)
        self.cleanups.append(lambda: self.script("ci/registry.sh", "stop", check=False))
        self.registry_url = self.script("ci/registry.sh", "start").strip().splitlines()[-1]
        if s.kafka == "real":
            create_topic(self.brokers[self.sensor_topic], self.sensor_topic, partitions, 3)
        else:
            self.brokers[self.sensor_topic] = self.start_mock(self.sensor_topic, partitions)
        log(f"producing {s.sensor_messages} SensorBatch messages (registry {self.registry_url})")
        self.produce(["--topic", self.sensor_topic, "--sensor", str(s.sensor_messages), "--registry",
                      self.registry_url], "produce-sensor", self.sensor_topic)
        n = watermarks(self.brokers[self.sensor_topic], self.sensor_topic)
        if n != s.sensor_messages:
            raise BenchError(f"the sensor topic holds {n} messages, not {s.sensor_messages}")
        self.expect_kept = sensor_expect(s.sensor_messages)["rows"]
        log(f"{s.sensor_messages} messages -> {s.sensor_messages * 100} candidate rows, "
            f"{self.expect_kept} kept (closed form)")

        # The current engine behind our HTTP layer (chdb-core; the first run
        # installs it), and the same endpoint answering INSERTs unexecuted.
        os.environ.setdefault("SPATE_CHDB_VENV", os.path.join(s.target, "chdb", "venv"))
        python3 = shutil.which("python3", path=os.environ.get("PATH")) or "python3"
        for endpoint, name, flags, wait in (("chdb", "chdb", [], 1200), ("discard", "chdb-discard",
                                                                         ["--discard-inserts"], 600)):
            p = self.popen([python3, "ci/chdb_server.py", "--port", "0", "--data", self.path(f"{name}-data"), *flags],
                           name, group=True)
            os.replace(self.path(f"{name}.out"), self.path(f"{name}.urls"))  # the open file follows
            url = self.wait_file(p, self.path(f"{name}.urls"), wait * 0.5,
                                 f"ci/chdb_server.py {' '.join(flags)}".strip(), self.path(f"{name}.log"))
            self.servers[endpoint] = (url, p.pid)
        chdb_version = self.ch("SELECT version()", self.servers["chdb"][0]).strip()
        log(f"chdb endpoint {self.servers['chdb'][0]} (engine {chdb_version})")
        open(self.runs_sensor, "w").close()
        open(self.runs_discard, "w").close()
        arms = [arm("sensor", k) for k in s.sensor_systems]
        for rep in range(1, s.reps + 1):
            for a in rotation(arms, rep):
                self.run_arm(a, rep)
        if s.profile:
            self.run_arm(arm("sensor", "spate"), "profile", profile_to=self.path("profile-sensor-spate"))
            self.run_arm(arm("sensor", "upstream"), "profile", profile_to=self.path("profile-sensor-upstream"))
        # Retention must still be intact: otherwise a short count could be the broker's.
        self.check_retention(self.sensor_topic, s.sensor_messages, "the end")
        tee()
        tee(f"Sensor workload: {s.sensor_messages} SensorBatch messages (100 events each, {s.sensor_messages * 100} "
            f"candidate rows, {self.expect_kept} kept by the filters) of Confluent-framed Avro in "
            f"{self.sensor_broker_desc}, writer schema from the registry test fixture, into a fresh MergeTree "
            f"table per run on ClickHouse {self.ch_version} or on the chdb endpoint (engine {chdb_version} behind "
            f"ci/chdb_server.py), one arm at a time, {s.reps} repetitions interleaved. Gates: count, duplicates "
            f"and column checksums against the closed form. Command: `bash ci/peer-bench.sh --kafka {s.kafka} "
            f"--workload {s.workload} --reps {s.reps}`.")
        tee()
        with open(self.runs_sensor) as f:
            tee(summary_table(f.read().splitlines(), s.reps))
        if os.path.getsize(self.runs_discard):
            tee()
            tee("Sensor workload into the discarding endpoint (`ci/chdb_server.py --discard-inserts`: every INSERT "
                "checked against the table and its body read, then answered 200 unexecuted): the arms' own CPU per "
                "row without the server's cost per insert. Nothing lands, so the gates are the arm's own count of "
                f"rows acknowledged (exactly {self.expect_kept}) and the endpoint's answer to every insert; \"loss, "
                "dups\" is not measured (the tables above measure it).")
            tee()
            with open(self.runs_discard) as f:
                tee(summary_table(f.read().splitlines(), s.reps))


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n:])
    except OSError:
        return ""


def line_count(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def read_lines(path, skip=0, binary_safe=False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [ln.decode(errors="replace") for ln in data.split(b"\n")[skip:]]


def apt_install(*pkgs):
    log(f"installing {' '.join(pkgs)} (Debian packages)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def ensure_venv(s: Settings, argv):
    """Runs on in the benchmark's venv (confluent-kafka from PyPI): makes it
    when missing and re-executes this script there."""
    env_dir = os.path.join(s.target, "peer-bench-venv")
    python = os.path.join(env_dir, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(env_dir):
        return
    if not os.path.exists(python):
        log(f"creating {env_dir} with {CONFLUENT_KAFKA}")
        try:
            venv_mod.create(env_dir, with_pip=True)
        except (OSError, subprocess.CalledProcessError):
            shutil.rmtree(env_dir, ignore_errors=True)
            apt_install("python3-venv")
            venv_mod.create(env_dir, with_pip=True)
    if subprocess.run([python, "-c", "import confluent_kafka"], capture_output=True).returncode != 0:
        subprocess.run([os.path.join(env_dir, "bin", "pip"), "install", "-q", CONFLUENT_KAFKA],
                       stdout=sys.stderr, check=True)
    sys.stdout.flush()
    os.execv(python, [python, os.path.abspath(__file__), "bench", *argv])


def machine_desc():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = " ".join(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}"


KAFKA_XML = """\
<yandex>
    <logger>
        <level>trace</level>
    </logger>
    <kafka>
        <auto_offset_reset>smallest</auto_offset_reset>
        <debug>cgrp</debug>
    </kafka>
</yandex>
"""


class Tee:
    """Prints to stdout and appends to the Markdown output file."""

    def __init__(self, path):
        self.path = path

    def __call__(self, text=""):
        print(text, flush=True)
        with open(self.path, "a") as f:
            f.write(text + "\n")


def bench_main(s: Settings):
    b = Bench(s)
    os.environ.update({
        "CARGO_TARGET_DIR": s.target, "SPATE_CH_DIR": s.ch_dir, "SPATE_CH_BASE_PORT": s.ch_base_port,
        "SPATE_KAFKA_DIR": s.kafka_dir, "SPATE_KAFKA_BASE_PORT": s.kafka_base_port,
    })
    os.chdir(ROOT)

    def on_term(_sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        b.run()
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        b.cleanup()
    return 0




# ------------------------------------------------------------ command line


def main():
    argv = sys.argv[1:]
    try:
        if argv[:1] == ["bench"]:
            try:
                s = parse_settings(argv[1:], os.environ)
            except UsageError as e:
                print(e, file=sys.stderr)
                sys.exit(2)
            ensure_venv(s, argv[1:])
            sys.exit(bench_main(s))
        elif len(argv) == 2 and argv[0] == "sensor-expect":
            print(sensor_expect(int(argv[1]))["rows"])
        elif len(argv) > 2 and argv[0] == "sensor-check":
            verdict = sensor_check(int(argv[1]), argv[2:])
            print(verdict)
            sys.exit(0 if verdict == "pass" else 1)
        elif len(argv) == 3 and argv[0] == "summarize":
            summarize(argv[1], int(argv[2]))
        elif len(argv) == 3 and argv[0] == "watermarks":
            print(watermarks(argv[1], argv[2]))
        elif len(argv) == 5 and argv[0] == "create-topic":
            create_topic(argv[1], argv[2], int(argv[3]), int(argv[4]))
        elif len(argv) == 8 and argv[0] == "consume":
            consume(argv[1], argv[2], argv[3], argv[4], argv[5], int(argv[6]), argv[7])
        else:
            sys.exit(__doc__)
    except BenchError as e:
        sys.exit(f"peer_bench.py: {e}")


if __name__ == "__main__":
    main()
