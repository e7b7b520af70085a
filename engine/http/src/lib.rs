//! spate-http: what spate's HTTP clients share, the ClickHouse writer
//! (spate-clickhouse) and the schema registry client (spate-formats).
//!
//! - [`connector`]: the hyper connector (TCP settings, rustls for
//!   `https://`).
//! - [`tls`]: the rustls client config from [`tls::TlsOptions`] (system
//!   roots, a CA file, or verification off by name).
//! - [`credentials`]: HTTP Basic credentials ([`Credentials`]).
//! - [`percent_encode`]: query-string values.
//!
//! It knows no ClickHouse and no registry: requests, retries and answers
//! are each client's own.
#![forbid(unsafe_code)]

pub mod connector;
pub mod credentials;
pub mod tls;

pub use connector::https_connector;
pub use credentials::Credentials;
pub use tls::{TlsError, TlsOptions};

/// Percent-encodes a query-string value (RFC 3986 unreserved bytes stay).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_string_values_are_percent_encoded() {
        assert_eq!(percent_encode("a b=`c`&d"), "a%20b%3D%60c%60%26d");
        assert_eq!(percent_encode("A-z_0.9~"), "A-z_0.9~");
    }
}
