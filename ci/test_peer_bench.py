"""Tests of ci/peer_bench.py's pure parts (the arm table, settings, /proc
parsing, the watch loop, the gates and the summary table); no server, no
Kafka. Run: `python3 -m unittest ci/test_peer_bench.py` (under a second)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_bench as pb  # noqa: E402

# A /proc/PID/stat line whose comm holds a space and a parenthesis:
# utime 150 and stime 50 ticks (fields 14 and 15).
STAT = "4242 (spate pipe) 0) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 50 0 0 20 0 5 0 100 0 0"


class Proc(unittest.TestCase):
    def test_cpu_of_a_stat_line(self):
        self.assertEqual(pb.parse_stat_cpu(STAT, ticks=100), 2.0)
        self.assertEqual(pb.parse_stat_comm(STAT), "spate pipe) 0")

    def test_thread_cpu_sums_by_name_without_digits(self):
        stats = [
            "1 (spate) S " + " ".join(["0"] * 10) + " 1 0",
            "2 (spate-pipe-0) S " + " ".join(["0"] * 10) + " 10 9",
            "3 (spate-pipe-1) S " + " ".join(["0"] * 10) + " 20 0",
            "4 (rdk:broker1) S " + " ".join(["0"] * 10) + " 30 0",
            "5 (idle) S " + " ".join(["0"] * 10) + " 0 0",
        ]
        self.assertEqual(pb.thread_cpu_summary(stats, ticks=100),
                         "spate-pipe 0.39, rdk:broker 0.30, spate 0.01")

    def test_metric_sum_over_labels(self):
        page = ("# HELP spate_records_polled_total x\n"
                'spate_records_polled_total{partition="0"} 5\n'
                'spate_records_polled_total{partition="1"} 7\n'
                "spate_sink_rows 1\n")
        self.assertEqual(pb.metric_sum(page, "spate_records_polled_total"), 12)
        self.assertEqual(pb.metric_sum("", "spate_records_polled_total"), 0)

    def test_this_process(self):
        self.assertGreaterEqual(pb.cpu_of(os.getpid()), 0)
        self.assertNotEqual(pb.hwm_of(os.getpid()), "-")
        self.assertEqual(pb.hwm_of(2 ** 22 + 1), "-")


class Settings(unittest.TestCase):
    def test_defaults(self):
        s = pb.parse_settings([], {})
        self.assertEqual((s.kafka, s.workload, s.rows, s.reps), ("real", "all", 1_000_000, 3))
        self.assertEqual(s.systems, pb.FLIGHT_ARMS)
        self.assertEqual(s.sensor_systems, pb.SENSOR_ARMS)
        self.assertTrue(s.replicated)
        self.assertFalse(s.profile)

    def test_arguments_and_environment(self):
        env = {"PEER_BENCH_REPS": "5", "PEER_BENCH_SYSTEMS": "spate python", "PEER_BENCH_STALL": "7",
               "PEER_BENCH_REPLICATED": "0", "PEER_BENCH_PROFILE": "1", "PEER_BENCH_SENSOR_MESSAGES": "300",
               "CARGO_TARGET_DIR": "/t"}
        s = pb.parse_settings(["--kafka", "mock", "--workload", "sensor", "20000"], env)
        self.assertEqual((s.kafka, s.workload, s.rows, s.reps), ("mock", "sensor", 20000, 5))
        self.assertEqual(s.systems, ("spate", "python"))
        self.assertEqual((s.stall, s.replicated, s.profile, s.sensor_messages, s.target),
                         (7, False, True, 300, "/t"))
        self.assertEqual(pb.parse_settings(["--reps", "2"], env).reps, 2)

    def test_refusals(self):
        for argv, env in ((["--kafka", "x"], {}), (["--workload", "x"], {}), (["0"], {}),
                          (["--reps"], {}), (["--reps", "1.5"], {}), ([], {"PEER_BENCH_REPS": "0"}),
                          ([], {"PEER_BENCH_SYSTEMS": "spate flink"}),
                          ([], {"PEER_BENCH_SENSOR_SYSTEMS": "spate kafka"}),
                          ([], {"PEER_BENCH_TIMEOUT": "soon"})):
            with self.assertRaises(pb.UsageError, msg=f"{argv} {env}"):
                pb.parse_settings(argv, env)

    def test_rotation(self):
        self.assertEqual(pb.rotation(["a", "b", "c"], 1), ["a", "b", "c"])
        self.assertEqual(pb.rotation(["a", "b", "c"], 2), ["b", "c", "a"])
        self.assertEqual(pb.rotation(["a", "b", "c"], 4), ["a", "b", "c"])

    def test_mock_partitions_keep_under_3_mib(self):
        # 1 M flight rows (101 MB of NDJSON): 43 partitions, as the bash script had it.
        self.assertEqual(pb.mock_partitions(101_888_890, 1_000_000), 43)
        self.assertEqual(pb.mock_partitions(1000, 10), 8)


class ArmTable(unittest.TestCase):
    def test_every_arm_once_with_its_gate(self):
        self.assertEqual(len({(a.workload, a.key) for a in pb.ARMS}), len(pb.ARMS))
        self.assertEqual(len({a.name for a in pb.ARMS if a.workload == "sensor"}), len(pb.SENSOR_ARMS))
        self.assertEqual(pb.arm("flights", "spate-eo").delivery, "effectively_once")
        self.assertEqual(pb.arm("flights", "kafka").gate, "flights")
        self.assertEqual(pb.arm("sensor", "spate-chdb").gate, "sensor")
        self.assertEqual(pb.arm("sensor", "upstream-discard").gate, "discard")
        self.assertEqual(pb.arm("sensor", "upstream-discard").ack_metric, "spate_sink_records_total")
        self.assertEqual(pb.arm("sensor", "spate-discard").ack_metric, "spate_sink_rows_written_total")
        self.assertIsNone(pb.arm("sensor", "spate").ack_metric)
        self.assertEqual(pb.arm("sensor", "upstream-native").first_metric, "spate_deser_records_total")
        self.assertIsNone(pb.arm("flights", "python").first_metric)
        self.assertEqual(pb.arm("sensor", "upstream").table_for(2), "sensor_upstream_2")
        self.assertEqual(pb.arm("flights", "spate").table_for(2), "peer_spate")

    def test_the_yaml_names_the_delivery_only_when_not_the_default(self):
        args = ("t", 1, "9", "b:1", "flights", "http://ch", 2, 17190)
        self.assertNotIn("delivery", pb.spate_flights_yaml(pb.arm("flights", "spate"), *args))
        self.assertIn("delivery: effectively_once", pb.spate_flights_yaml(pb.arm("flights", "spate-eo"), *args))


class Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, d):
        self.t += d


class Watch(unittest.TestCase):
    def run_watch(self, counts, target=10, alive=None, first_at=0.3, stall=5, timeout=100):
        c = Clock()
        seq = iter(counts)
        last = [0]

        def count():
            last[0] = next(seq, last[0])
            return last[0]

        return pb.watch(count, target, lambda: c.t if c.t >= first_at else None, alive, timeout=timeout,
                        stall=stall, clock=c.now, mono=c.now, sleep=c.sleep, interval=0.1)

    def test_complete(self):
        m = self.run_watch([0, 0, 0, 0, 3, 10])
        self.assertEqual((m.status, m.landed), ("complete", 10))
        self.assertAlmostEqual(m.first, 0.3)
        self.assertAlmostEqual(m.first_landed, 0.4)
        self.assertAlmostEqual(m.done, 0.5)
        self.assertEqual(pb.rate_cells(m), ("0.20", "50"))

    def test_stall_restarts_on_every_new_row(self):
        m = self.run_watch([1] * 30 + [2], stall=5)
        self.assertEqual(m.status, "stalled at 2 rows (no new row for 5s)")
        self.assertGreater(m.done, 8)

    def test_exit_and_timeout(self):
        self.assertEqual(self.run_watch([4], alive=lambda: False).status, "consumer exited after 4 rows")
        self.assertEqual(self.run_watch(range(1000), target=10**6, timeout=3, stall=60).status,
                         "timed out after 3s with 30 rows")


class Gates(unittest.TestCase):
    def m(self, **kw):
        return pb.Measurement(**{"first": 1.0, "done": 3.0, "landed": 10, **kw})

    def test_flights(self):
        self.assertEqual(pb.flights_gate(self.m(), 10, 10, 10), "pass")
        self.assertEqual(pb.flights_gate(self.m(), 10, 9, 9), "lost 1 rows")
        self.assertEqual(pb.flights_gate(self.m(), 10, 12, 10), "2 duplicate rows")
        self.assertEqual(pb.flights_gate(self.m(status="stalled at 9 rows"), 10, 10, 10), "stalled at 9 rows")
        self.assertEqual(pb.flights_gate(self.m(first=None), 10, 10, 10), "no first-row time")
        # No polled-row time: the first count() > 0 stands in (not into the
        # discarding endpoint).
        self.assertEqual(pb.flights_gate(self.m(first=None, first_landed=2.0), 10, 10, 10), "pass")

    def test_sensor_closed_form(self):
        e = pb.sensor_expect(50)
        vals = [str(v) for v in e.values()]
        kept = e["rows"]
        self.assertGreater(kept, 0)
        self.assertEqual(pb.sensor_gate(self.m(landed=kept), 50, kept, vals), "pass")
        dup = [str(kept + 1)] + vals[1:]
        self.assertEqual(pb.sensor_gate(self.m(), 50, kept, dup), "1 duplicate rows")
        bad = vals[:2] + [str(float(vals[2]) + 0.25)] + vals[3:]
        self.assertIn("sum_value", pb.sensor_gate(self.m(), 50, kept, bad))
        self.assertIn("kept", pb.sensor_gate(self.m(), 50, kept + 1, vals))
        self.assertIn("values, expected", pb.sensor_check(50, vals[:-1]))

    def test_discard(self):
        self.assertEqual(pb.discard_gate(self.m(), 10, 0), "pass")
        self.assertEqual(pb.discard_gate(self.m(landed=9), 10, 0), "acknowledged 9 rows, expected 10")
        self.assertEqual(pb.discard_gate(self.m(), 10, 1), "1 inserts refused by the endpoint")
        self.assertEqual(pb.discard_gate(self.m(first=None, first_landed=2.0), 10, 0), "no first-row time")

    def test_per_million(self):
        self.assertEqual(pb.per_million("0.510", 1_000_000), "0.51")
        self.assertEqual(pb.per_million("-", 10), "-")
        self.assertEqual(pb.per_million("1.0", 0), "-")


class KafkaEngineLog(unittest.TestCase):
    def test_the_stream_that_committed_rows(self):
        lines = [
            "2026.12.02 10:00:00.100000 [ 1 ] <Debug> StorageKafka (peer_kafka_queue): Started streaming",
            "2026.12.02 10:00:01.000000 [ 1 ] <Debug> StorageKafka (peer_kafka_queue): Committing 0 messages",
            "2026.12.02 10:00:02.500000 [ 1 ] <Debug> StorageKafka (other): Started streaming",
            "2026.12.02 10:00:03.250000 [ 1 ] <Debug> StorageKafka (peer_kafka_queue): Started streaming",
            "2026.12.02 10:00:09.000000 [ 1 ] <Debug> StorageKafka (peer_kafka_queue): Committing 42 messages",
        ]
        self.assertEqual(pb.kafka_stream_start(lines), "2026.12.02 10:00:03.250000")
        self.assertIsNone(pb.kafka_stream_start(lines[:4]))
        t = pb.server_log_time("2026.12.02 10:00:03.250000")
        self.assertAlmostEqual(t - pb.server_log_time("2026.12.02 10:00:00.000000"), 3.25)


class Summary(unittest.TestCase):
    def test_medians_ranges_failures_and_not_run(self):
        def run(arm, rep, gate, rate, cpu, note="n"):
            return "\t".join([arm, str(rep), gate, "10", "0", "1.00", rate, cpu, "100", "0.20", "200", note])

        lines = [
            run("spate", 1, "pass", "1000", "0.50"),
            run("spate", 2, "pass", "3000", "0.70", "last|note"),
            run("spate", 3, "stalled at 5 rows", "-", "-"),
            "\t".join(["clickhouse_sinker", "1", "not run: 403"] + ["-"] * 8 + ["403"]),
            "short\tline",
        ]
        table = pb.summary_table(lines, 3).splitlines()
        self.assertEqual(len(table), 4)
        self.assertEqual(table[2], "| spate | 2 of 3 | 2,000 [1,000-3,000] | 0.60 [0.50-0.70] | 0.20 [0.20-0.20] "
                                   "| 100 [100-100] | 200 [200-200] | 0, 0 | rep 3 **stalled at 5 rows**; last/note |")
        self.assertEqual(table[3], "| clickhouse_sinker | 0 of 3 | not run | - | - | - | - | - | **not run: 403** |")


if __name__ == "__main__":
    unittest.main()
