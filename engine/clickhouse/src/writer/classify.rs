//! Which failed inserts a retry can fix.
//!
//! ClickHouse answers a failed query over HTTP with a non-2xx status and a
//! body starting `Code: N` (`Code: 60, e.displayText() = DB::Exception: ...`
//! on 18.16, `Code: 60. DB::Exception: ...` later), and newer servers also
//! set the `X-ClickHouse-Exception-Code` header. The code decides; the HTTP
//! status only decides when there is no code (a proxy's 502, say).

use spate_core::sink::WriteError;

/// ClickHouse error codes a retry (same bytes, same token, maybe another
/// replica) can fix: overload, timeouts, replication hiccups.
pub const RETRYABLE_CODES: &[u32] = &[
    159, // TIMEOUT_EXCEEDED
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    225, // NO_ZOOKEEPER
    236, // ABORTED
    241, // MEMORY_LIMIT_EXCEEDED
    242, // TABLE_IS_READ_ONLY
    252, // TOO_MANY_PARTS
    319, // UNKNOWN_STATUS_OF_INSERT
    394, // QUERY_WAS_CANCELLED
    999, // KEEPER_EXCEPTION
];

/// ClickHouse error codes that can mean the table is no longer what the
/// insert's bytes were planned for (a column's type changed, a column is
/// gone): after one, the writer re-reads the table's columns at once and,
/// when the plan is stale, reports the old and new types (`watch`). Every
/// one of them is also fatal for the batch, as before.
pub const SCHEMA_CHANGE_CODES: &[u32] = &[
    10,  // NOT_FOUND_COLUMN_IN_BLOCK
    16,  // NO_SUCH_COLUMN_IN_TABLE
    20,  // NUMBER_OF_COLUMNS_DOESNT_MATCH
    27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
    33,  // CANNOT_READ_ALL_DATA (RowBinary rows of the old width)
    47,  // UNKNOWN_IDENTIFIER
    53,  // TYPE_MISMATCH
    70,  // CANNOT_CONVERT_TYPE
    117, // INCORRECT_DATA
    368, // BAD_CAST (a Native block's type is not the table's, 18.16)
];

/// `QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING`: the insert carries the batch token
/// as its `query_id`, so this means an earlier attempt of the same batch still
/// runs on that server and this one did not start (measured on 18.16:
/// `Code: 216 ... Query with id = ... is already running`).
pub const ALREADY_RUNNING_CODE: u32 = 216;

/// The `N` of a body starting `Code: N` (leading whitespace allowed).
pub fn exception_code(body: &str) -> Option<u32> {
    let rest = body.trim_start().strip_prefix("Code:")?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Classifies a failed response: `status` is the HTTP status, `code` the
/// ClickHouse error code if known, `message` what to report (the server's
/// text, with the endpoint).
pub fn classify(status: u16, code: Option<u32>, message: &str) -> WriteError {
    match code {
        Some(ALREADY_RUNNING_CODE) => WriteError::already_running(format!(
            "ClickHouse code {ALREADY_RUNNING_CODE}: {message}"
        )),
        Some(c) if RETRYABLE_CODES.contains(&c) => {
            WriteError::retryable(format!("ClickHouse code {c}: {message}"))
        }
        Some(c) => WriteError::fatal(format!("ClickHouse code {c}: {message}")),
        None if status >= 500 || status == 408 || status == 429 => {
            WriteError::retryable(format!("HTTP {status}: {message}"))
        }
        None => WriteError::fatal(format!("HTTP {status}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_codes_of_old_and_new_servers() {
        assert_eq!(
            exception_code(
                "Code: 60, e.displayText() = DB::Exception: Table default.nope doesn't exist."
            ),
            Some(60)
        );
        assert_eq!(
            exception_code("Code: 252. DB::Exception: Too many parts"),
            Some(252)
        );
        assert_eq!(exception_code("\nCode:  53. x"), Some(53));
        assert_eq!(exception_code("Bad Gateway"), None);
    }

    #[test]
    fn transient_codes_retry_and_the_rest_is_fatal() {
        for c in [252, 242, 159, 209] {
            assert!(!classify(500, Some(c), "x").is_fatal(), "{c}");
        }
        for c in [60, 62, 53, 16, 516, 115] {
            let e = classify(500, Some(c), "the server's words");
            assert!(e.is_fatal(), "{c}");
            assert!(e.message.contains("the server's words"));
        }
        assert!(!classify(502, None, "proxy").is_fatal());
        assert!(!classify(503, None, "proxy").is_fatal());
        assert!(classify(403, None, "forbidden").is_fatal());
    }

    #[test]
    fn schema_change_codes_are_fatal() {
        for &c in SCHEMA_CHANGE_CODES {
            assert!(!RETRYABLE_CODES.contains(&c), "{c}");
            assert!(classify(500, Some(c), "x").is_fatal(), "{c}");
        }
    }

    #[test]
    fn a_running_query_id_means_wait() {
        let e = classify(
            500,
            exception_code(
                "Code: 216, e.displayText() = DB::Exception: Query with id = t-1 is already running.",
            ),
            "x",
        );
        assert_eq!(e.kind, spate_core::sink::WriteErrorKind::AlreadyRunning);
    }
}
