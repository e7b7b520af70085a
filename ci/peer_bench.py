"""Kafka helpers for ci/peer-bench.sh, run in the venv that script makes.

  peer_bench.py watermarks BROKERS TOPIC
      Prints the sum of the partitions' high watermarks. Exits 1 naming the
      partition when any low watermark is not 0: the embedded broker (the
      librdkafka mock cluster) deleted data past its 5 MiB-per-partition
      retention, and a count in ClickHouse would then be short for a reason
      that is not the consumer's.

  peer_bench.py create-topic BROKERS TOPIC PARTITIONS REPLICATION
      Creates TOPIC (for `ci/peer-bench.sh --kafka real`: the real cluster
      creates no topic by itself). Exits 1 with the broker's error.

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
      Compares the checks ci/peer-bench.sh's SQL computed over a sensor
      table with the closed form: prints "pass" (exit 0) or what differs.

  peer_bench.py summarize RUNS_TSV REPS
      The Markdown table of ci/peer-bench.sh from its runs.tsv: per arm the
      median [min-max] of each measurement over the runs that passed the
      gates, how many passed, and every failed run's reason.
"""

import http.client
import signal
import sys
import time
import urllib.parse

from confluent_kafka import Consumer, KafkaException, TopicPartition

LINGER_S = 1.0
POLL_MESSAGES = 10_000


def watermarks(brokers: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": brokers, "group.id": "peer-bench-watermarks"})
    try:
        md = c.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            sys.exit(f"peer_bench.py: topic {topic} missing on {brokers}")
        total = 0
        for p in sorted(t.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if low != 0:
                sys.exit(
                    f"peer_bench.py: {topic}/{p}: low watermark {low}, not 0: the broker "
                    "deleted data (mock cluster retention); use more partitions"
                )
            total += high
        return total
    finally:
        c.close()


def create_topic(brokers: str, topic: str, partitions: int, rf: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": brokers})
    futures = a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf)])
    for name, f in futures.items():
        try:
            f.result(30)
        except KafkaException as e:
            sys.exit(f"peer_bench.py: create topic {name} on {brokers}: {e}")


def consume(brokers, topic, group, url, table, batch_rows, first_file):
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


def summarize(runs_tsv: str, reps: int) -> None:
    """Prints one Markdown table: per arm (in first-run order), the median
    and [min-max] of every measurement over the runs that passed the gates,
    how many of the repetitions passed, and each failed run's reason (a
    failed run is never a number)."""
    import statistics

    arms = {}
    with open(runs_tsv) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 12:
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

    print(
        "| arm | runs passed | rows/s | CPU s / M rows: arm | CPU s / M rows: server "
        "| peak RSS MiB: arm | peak RSS MiB: server | loss, dups | notes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, runs in arms.items():
        ok = [r for r in runs if r[2] == "pass"]
        failed = [r for r in runs if r[2] != "pass"]
        notes = []
        for r in failed:
            notes.append(f"rep {r[1]} **{r[2]}**")
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
        print(f"| {arm} | {passed} | " + " | ".join(cells) + f" | {lossdups} | {note} |")


def sensor_expect(messages: int) -> dict:
    """The closed form of the sensor workload (docs: spate-testkit's
    sensor::avro generator): message i holds events j = 0..99, k = i*100+j;
    a row is kept when unit != "drop" (k % 8 != 0) and value >= 0 (value =
    (k % 4000) * 0.25 - 100); region is null (coalesced to 'unknown') when
    i % 10 == 0; quality is null when j % 5 == 0, else j % 3; name_upper is
    SENSOR-{k % 1024}. Returns the checks ci/peer-bench.sh's SQL computes,
    in its order."""
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
    return e


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


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "sensor-expect":
        print(sensor_expect(int(sys.argv[2]))["rows"])
    elif len(sys.argv) > 3 and sys.argv[1] == "sensor-check":
        verdict = sensor_check(int(sys.argv[2]), sys.argv[3:])
        print(verdict)
        sys.exit(0 if verdict == "pass" else 1)
    elif len(sys.argv) == 4 and sys.argv[1] == "summarize":
        summarize(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "watermarks":
        print(watermarks(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 6 and sys.argv[1] == "create-topic":
        create_topic(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif len(sys.argv) == 9 and sys.argv[1] == "consume":
        a = sys.argv
        consume(a[2], a[3], a[4], a[5], a[6], int(a[7]), a[8])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
