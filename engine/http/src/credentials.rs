//! HTTP Basic credentials, as the ClickHouse writer and the schema registry
//! client send them: user and password, `Debug` without the password, and
//! the header value (base64 per RFC 4648, written here: one function, no
//! dependency).

/// User and password for the HTTP interface (sent as HTTP Basic auth, which
/// every ClickHouse version accepts). `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ClickHouse user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Reads the user from the environment variable `user_var` and the
    /// password from `password_var` (empty when unset); `None` when the user
    /// variable is unset.
    pub fn from_env(user_var: &str, password_var: &str) -> Option<Credentials> {
        let user = std::env::var(user_var).ok()?;
        Some(Credentials {
            user,
            password: std::env::var(password_var).unwrap_or_default(),
        })
    }

    /// The `Authorization` header value: `Basic` and base64 of
    /// `user:password`.
    pub fn basic_auth(&self) -> String {
        format!(
            "Basic {}",
            base64(format!("{}:{}", self.user, self.password).as_bytes())
        )
    }
}

/// Standard base64 with padding (RFC 4648 section 4), for Basic auth.
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }

    #[test]
    fn credentials_do_not_leak_in_debug() {
        let c = Credentials {
            user: "u".into(),
            password: "secret".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
        assert_eq!(c.basic_auth(), "Basic dTpzZWNyZXQ=");
    }
}
