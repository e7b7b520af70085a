//! The lines decoder: one message holds many records, one per line
//! (NDJSON, `format.json.mode: ndjson`).
//!
//! Each non-blank line goes down the chain as a payload of its own with the
//! message's partition, offset, key and timestamp, so every row it yields
//! carries the message's ack (DESIGN "Acks"): the message's offset is
//! committed only once every row of every line is durable (D1). A line ends
//! at `\n`; a `\r` before it and blank lines are ignored.
//!
//! A line the chain refuses does not stop the lines after it: the terminal
//! drops the refused line's partial row, the good lines go on, and the
//! message then returns one [`RecordError`] naming the first bad line (1-based)
//! and how many lines were bad. The driver applies the policy to the message
//! as a whole (D6): `skip` counts it once and dead-letters the whole message
//! (its good lines have landed; the reason says which lines did not), `fail`
//! freezes the watermark in front of the message. A message with no line at
//! all (empty, blank or a tombstone) is a decode error.

use crate::pipeline::chain::{Decoder, RecordCx, RecordError, Stage};
use crate::record::Payload;

/// Splits a message into lines and pushes each as its own payload.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinesDecoder;

impl Decoder for LinesDecoder {
    type Record<'a> = Payload<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<Payload<'a>>,
    {
        let bytes: &'a [u8] = cx.payload.value.unwrap_or(&[]);
        let mut lines = 0usize;
        let mut bad = 0usize;
        let mut first_error: Option<RecordError> = None;
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = raw.strip_suffix(b"\r").unwrap_or(raw);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            lines += 1;
            let payload = Payload {
                value: Some(line),
                ..cx.payload
            };
            if let Err(mut e) = next.push(payload, cx) {
                bad += 1;
                if first_error.is_none() {
                    e.reason = format!("line {}: {}", i + 1, e.reason);
                    first_error = Some(e);
                }
            }
        }
        match first_error {
            None if lines == 0 => Err(RecordError::decode(
                "no line in the message (empty, blank or a tombstone)",
            )),
            None => Ok(()),
            Some(mut e) => {
                if bad > 1 {
                    e.reason = format!(
                        "{} (and {} more bad line{} of {lines})",
                        e.reason,
                        bad - 1,
                        if bad == 2 { "" } else { "s" }
                    );
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ack::{AckIssuer, ack_channel};
    use crate::record::TopicPartition;

    /// Collects the lines it is given; refuses lines that start with `x`.
    #[derive(Default)]
    struct Collect(Vec<String>);

    impl Stage<Payload<'_>> for Collect {
        fn push(&mut self, p: Payload<'_>, _cx: &RecordCx<'_>) -> Result<(), RecordError> {
            let line = String::from_utf8(p.bytes().to_vec()).unwrap();
            if line.starts_with('x') {
                return Err(RecordError::encode("c", format!("bad `{line}`")));
            }
            self.0.push(line);
            Ok(())
        }
    }

    fn run(bytes: Option<&[u8]>) -> (Vec<String>, Result<(), RecordError>) {
        let tp = TopicPartition::new("t", 3);
        let (tx, _rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
        let ack = issuer.issue(41, 41);
        let cx = RecordCx {
            payload: Payload {
                value: bytes,
                key: Some(b"k"),
                partition: &tp,
                offset: 41,
                timestamp_ms: Some(5),
                timestamp_kind: crate::record::TimestampKind::None,
                headers: crate::record::Headers::NONE,
            },
            ack: &ack,
        };
        let mut out = Collect::default();
        let r = LinesDecoder.decode(&cx, &mut out);
        (out.0, r)
    }

    #[test]
    fn each_line_is_a_record_and_blank_lines_are_ignored() {
        let (lines, r) = run(Some(b"{\"a\":1}\r\n\n  \n{\"a\":2}\n{\"a\":3}"));
        r.unwrap();
        assert_eq!(lines, ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"]);
    }

    #[test]
    fn a_bad_line_is_named_and_the_others_still_go_on() {
        let (lines, r) = run(Some(b"a\n\nxb\nc\nxd\nxe\n"));
        assert_eq!(lines, ["a", "c"]);
        let e = r.unwrap_err();
        assert_eq!(e.column.as_deref(), Some("c"));
        assert_eq!(e.reason, "line 3: bad `xb` (and 2 more bad lines of 5)");
        let (_, r) = run(Some(b"a\nxb\nxc"));
        assert_eq!(
            r.unwrap_err().reason,
            "line 2: bad `xb` (and 1 more bad line of 3)"
        );
    }

    #[test]
    fn a_message_without_lines_is_a_decode_error() {
        for bytes in [Some(&b""[..]), Some(b"\n \r\n"), None] {
            let (lines, r) = run(bytes);
            assert!(lines.is_empty());
            let e = r.unwrap_err();
            assert_eq!(e.kind, crate::pipeline::chain::RecordErrorKind::Decode);
        }
    }

    #[test]
    fn lines_keep_the_messages_partition_offset_and_key() {
        struct Check;
        impl Stage<Payload<'_>> for Check {
            fn push(&mut self, p: Payload<'_>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
                assert_eq!(p.offset, 41);
                assert_eq!(p.partition, cx.payload.partition);
                assert_eq!(p.key, Some(&b"k"[..]));
                assert_eq!(p.timestamp_ms, Some(5));
                Ok(())
            }
        }
        let tp = TopicPartition::new("t", 3);
        let (tx, _rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
        let ack = issuer.issue(41, 41);
        let cx = RecordCx {
            payload: Payload {
                value: Some(b"1\n2"),
                key: Some(b"k"),
                partition: &tp,
                offset: 41,
                timestamp_ms: Some(5),
                timestamp_kind: crate::record::TimestampKind::None,
                headers: crate::record::Headers::NONE,
            },
            ack: &ack,
        };
        LinesDecoder.decode(&cx, &mut Check).unwrap();
    }
}
