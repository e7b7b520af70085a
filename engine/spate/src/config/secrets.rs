//! Credentials written into URLs (`http://user:secret@host:8123`, the form
//! clickhouse-client and most drivers accept) are lifted out at load time.
//!
//! What this guarantees: after [`lift_url_credentials`] no URL the config
//! holds carries userinfo, so no error, log line, `spate check` output or run
//! summary that prints a URL can print a password. The user and password move
//! to the section's `user` / `password` keys (sent as HTTP Basic auth, as
//! before). A URL whose userinfo disagrees with the section's own `user` or
//! `password` is an error naming the key, never a silent choice of one.
//! What it does not do: read the password's value anywhere else; messages
//! about a URL that failed to parse print it through [`redact`].
//!
//! URL syntax: RFC 3986 section 3.2.1 (`userinfo@host`, percent-encoded).

use std::borrow::Cow;

use super::{Config, ConfigError, invalid};

/// A URL's userinfo split off: the URL without it, and the user and
/// password it carried (percent-decoded; the password is empty when the
/// userinfo has no `:`).
#[derive(Debug, PartialEq, Eq)]
pub struct Lifted {
    /// The URL with `userinfo@` removed.
    pub url: String,
    /// `(user, password)`, when the URL had userinfo.
    pub credentials: Option<(String, String)>,
}

/// Where a URL's userinfo is: the byte offset where the authority starts
/// (after `scheme://`) and the offset of the `@` that ends the userinfo, or
/// `None` for a URL without userinfo (or text without `scheme://`).
fn userinfo_span(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let authority = url[start..].split(['/', '?', '#']).next()?;
    Some((start, start + authority.rfind('@')?))
}

/// Splits the userinfo off `url`.
///
/// # Errors
/// The reason, when the userinfo's percent-encoding is not valid UTF-8 or
/// not `%XX`; the reason never contains the userinfo's text.
pub fn lift(url: &str) -> Result<Lifted, String> {
    let Some((start, at)) = userinfo_span(url) else {
        return Ok(Lifted {
            url: url.to_owned(),
            credentials: None,
        });
    };
    let userinfo = &url[start..at];
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |part: &str, what: &str| {
        percent_decode(part)
            .ok_or_else(|| format!("the {what} in the URL is not valid percent-encoded UTF-8"))
    };
    let credentials = (decode(user, "user")?, decode(password, "password")?);
    if credentials.0.is_empty() {
        return Err("the URL has userinfo with an empty user".into());
    }
    let stripped = format!("{}{}", &url[..start], &url[at + 1..]);
    debug_assert!(userinfo_span(&stripped).is_none(), "one userinfo per URL");
    Ok(Lifted {
        url: stripped,
        credentials: Some(credentials),
    })
}

/// `url` with any userinfo replaced by `***`, for messages about a URL that
/// is not (or not yet) lifted.
pub fn redact(url: &str) -> Cow<'_, str> {
    match userinfo_span(url) {
        Some((start, at)) => Cow::Owned(format!("{}***{}", &url[..start], &url[at..])),
        None => Cow::Borrowed(url),
    }
}

/// RFC 3986 percent-decoding; `None` on a malformed `%` or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A section's `user` / `password` keys and the URLs that may carry them.
struct Target<'a> {
    key: String,
    user: &'a mut Option<String>,
    password: &'a mut Option<String>,
}

impl Target<'_> {
    /// Lifts `url`'s credentials into the section; `url_key` names the URL
    /// in errors.
    fn take(&mut self, url: &mut String, url_key: &str) -> Result<(), ConfigError> {
        let lifted = lift(url).map_err(|why| invalid(url_key, why))?;
        *url = lifted.url;
        let Some((user, password)) = lifted.credentials else {
            return Ok(());
        };
        for (field, have, from_url) in [
            ("user", &mut *self.user, user),
            ("password", &mut *self.password, password),
        ] {
            match have {
                Some(v) if *v != from_url => {
                    return Err(invalid(
                        url_key,
                        format!(
                            "the URL's {field} differs from `{}.{field}` (or from another URL's); \
                             give it in one place",
                            self.key
                        ),
                    ));
                }
                Some(_) => {}
                None => *have = Some(from_url),
            }
        }
        Ok(())
    }
}

/// Moves the credentials of every shard replica URL into
/// `sink.clickhouse.user` / `password`, and of a schema registry URL into
/// its section's, leaving every URL without userinfo.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the URL's key when its userinfo is
/// malformed or disagrees with the section's keys or another URL's.
pub fn lift_url_credentials(config: &mut Config) -> Result<(), ConfigError> {
    let ch = &mut config.sink.clickhouse;
    let mut target = Target {
        key: "sink.clickhouse".into(),
        user: &mut ch.user,
        password: &mut ch.password,
    };
    for (s, shard) in ch.shards.iter_mut().enumerate() {
        for (r, url) in shard.iter_mut().enumerate() {
            target.take(url, &format!("sink.clickhouse.shards[{s}][{r}]"))?;
        }
    }
    let format = &mut config.format;
    let registries = [
        (
            "format.avro.registry",
            format.avro.as_mut().and_then(|a| a.registry.as_mut()),
        ),
        (
            "format.protobuf.registry",
            format.protobuf.as_mut().and_then(|p| p.registry.as_mut()),
        ),
    ];
    for (key, section) in registries {
        let Some(r) = section else { continue };
        let mut target = Target {
            key: key.into(),
            user: &mut r.user,
            password: &mut r.password,
        };
        target.take(&mut r.url, &format!("{key}.url"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_split_off_and_decoded() {
        let l = lift("http://u%40corp:p%3Aw@ch-1:8123/path?x=1").unwrap();
        assert_eq!(l.url, "http://ch-1:8123/path?x=1");
        assert_eq!(l.credentials, Some(("u@corp".into(), "p:w".into())));
        let l = lift("https://reader@ch-2:8443").unwrap();
        assert_eq!(l.url, "https://ch-2:8443");
        assert_eq!(l.credentials, Some(("reader".into(), String::new())));
    }

    #[test]
    fn a_url_without_userinfo_is_unchanged() {
        for url in [
            "http://ch:8123",
            "http://ch:8123/a@b",
            "http://ch:8123?q=a@b",
            "ch:8123",
        ] {
            assert_eq!(
                lift(url).unwrap(),
                Lifted {
                    url: url.into(),
                    credentials: None
                }
            );
            assert_eq!(redact(url), url);
        }
    }

    #[test]
    fn a_malformed_userinfo_is_refused_without_echoing_it() {
        let e = lift("http://u:s3cr%zzet@ch:8123").unwrap_err();
        assert!(!e.contains("s3cr"), "{e}");
        assert!(
            lift("http://:s3cret@ch:8123")
                .unwrap_err()
                .contains("empty user")
        );
    }

    #[test]
    fn redact_hides_the_userinfo() {
        assert_eq!(redact("ftp://u:s3cret@ch:21/x"), "ftp://***@ch:21/x");
    }
}
