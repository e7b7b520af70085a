//! `format.json.mode: ndjson` end to end: the real `spate` binary reads
//! messages that each hold many NDJSON lines from an embedded broker
//! (librdkafka's mock cluster) and writes one row per line into the
//! ClickHouse at `SPATE_CLICKHOUSE_URL` (without it the test prints
//! `skipped: SPATE_CLICKHOUSE_URL not set` and passes).
//!
//! Checked: every good line lands, a message with a bad line is skipped as
//! one record (its other lines still land, D6), and the group's offsets
//! reach the end only behind durable rows (D1).

use crate::common;

use common::*;

#[test]
fn ndjson_lines_become_rows_and_a_bad_line_skips_its_message() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "ndjson");

    // 200 messages of 10 lines each (CRLF endings and a blank line mixed
    // in); message 77 has a bad second line.
    let per = 10u64;
    let mut messages = Vec::new();
    for m in 0..200u64 {
        let mut lines: Vec<String> = (0..per).map(|l| flight_row(m * per + l)).collect();
        if m == 77 {
            lines[1] = lines[1].replace("\"delay\":", "\"delay\":\"abc\",\"x\":");
        }
        messages.push(format!("{}\r\n\n", lines.join("\n")));
    }
    let feed = Feed::mock("flights", 2, "ndjson");
    feed.produce(&messages);
    // One pipeline thread, NDJSON mode, small batches.
    let yaml = feed
        .config(&url, &table.name, "{ policy: skip }")
        .replace("threads: 2", "threads: 1")
        .replace("format: { json: {", "format: { json: { mode: ndjson,")
        .replace("max_rows: 100000, max_bytes: 8MiB,", "max_rows: 500,");
    assert!(
        yaml.contains("mode: ndjson") && yaml.contains("max_rows: 500,"),
        "{yaml}"
    );
    let spate = Spate::start("ndjson", &yaml);
    feed.await_commits(&spate);
    let logs = spate.logs();
    drop(spate);

    // Every line but the bad one landed, each once.
    let want = 200 * per - 1;
    let (count, distinct) = table.landed();
    assert_eq!(distinct, want, "{logs}");
    assert!(count >= want);
    assert_eq!(
        table.number(&format!(
            "SELECT count() FROM default.{} WHERE id = {}",
            table.name,
            77 * per + 1
        )),
        0
    );
}
