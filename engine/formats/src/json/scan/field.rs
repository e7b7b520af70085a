//! One field's value, found by the shard router ([`crate::json::route`])
//! with the mapper's lexer: the message is scanned only up to the field
//! (earlier values skipped with their grammar checked, nothing built), so
//! routing costs a partial scan, and a malformed message is told apart from
//! one that lacks the field.
//!
//! Not here: hashing the value ([`spate_row::shard`]) or what a missing key
//! means (the router's spec).

use super::Stop;
use super::lex::{Scanner, Str};

/// Where a field's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// `json[a..b]`; whether it is a string's content (else a value's raw
    /// text: a number, `true`, `false`, an object or an array).
    Input(usize, usize, bool),
    /// A string with escapes, unescaped into the scratch buffer.
    Scratch,
}

/// Why a message has no value for the field.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotFound {
    /// A well-formed object up to where the search ended, without the field
    /// (or with `null` there, or a parent that is not an object).
    Absent,
    /// Not a JSON object, or malformed before the field.
    Malformed,
}

/// The value at `path` (object keys from the top-level object) in `json`.
///
/// # Errors
/// [`NotFound`]: absent or null, or not a well-formed object up to there.
pub(crate) fn find_field(
    json: &[u8],
    path: &[String],
    scratch: &mut Vec<u8>,
) -> Result<Found, NotFound> {
    let malformed = |_: Stop| NotFound::Malformed;
    let mut sc = Scanner {
        s: json,
        i: 0,
        depth: 0,
    };
    sc.ws();
    if sc.peek() != Some(b'{') {
        return Err(NotFound::Malformed);
    }
    for seg in path {
        if sc.peek() != Some(b'{') {
            // A parent that is not an object holds no field.
            return Err(NotFound::Absent);
        }
        if !to_key(&mut sc, seg.as_bytes(), scratch).map_err(malformed)? {
            return Err(NotFound::Absent);
        }
    }
    match sc.peek() {
        Some(b'"') => match sc.string(scratch).map_err(malformed)? {
            Str::Input(a, b) => Ok(Found::Input(a, b, true)),
            Str::Scratch => Ok(Found::Scratch),
        },
        Some(b'n') => {
            sc.literal(b"null").map_err(malformed)?;
            Err(NotFound::Absent)
        }
        _ => {
            let a = sc.i;
            sc.skip_value(scratch).map_err(malformed)?;
            Ok(Found::Input(a, sc.i, false))
        }
    }
}

/// At an object's `{`: moves past the member `want`'s key and colon (true),
/// or to the object's end when it has no such member (false). A key of at
/// most 7 bytes is compared as one word read by the lexer's short-string
/// test; other values are skipped by the lexer, strings and numbers without
/// the general dispatch.
#[inline]
fn to_key(sc: &mut Scanner<'_>, want: &[u8], scratch: &mut Vec<u8>) -> Result<bool, Stop> {
    // `want` as the lexer's word: its bytes, low first (a short key with no
    // byte to escape compares equal to exactly these).
    let short = want.len() < 8;
    let mut want_word = 0u64;
    if short {
        for (k, &b) in want.iter().enumerate() {
            want_word |= u64::from(b) << (8 * k);
        }
    }
    let mask = if short {
        (1u64 << (8 * want.len())) - 1
    } else {
        0
    };
    sc.enter()?;
    sc.i += 1;
    sc.ws();
    if sc.eat(b'}') {
        sc.depth -= 1;
        return Ok(false);
    }
    loop {
        sc.ws();
        if sc.peek() != Some(b'"') {
            return Err(sc.bad("expected a key"));
        }
        let hit = match sc.short_string() {
            Some((v, k)) => short && k == want.len() && v & mask == want_word,
            None => match sc.long_string(scratch)? {
                Str::Input(a, b) => &sc.s[a..b] == want,
                Str::Scratch => scratch.as_slice() == want,
            },
        };
        sc.colon()?;
        if hit {
            return Ok(true);
        }
        match sc.peek() {
            Some(b'"') => {
                if sc.short_string().is_none() {
                    sc.long_string(scratch)?;
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                sc.number()?;
            }
            _ => sc.skip_value(scratch)?,
        }
        sc.ws();
        if sc.eat(b',') {
            continue;
        }
        if sc.eat(b'}') {
            sc.depth -= 1;
            return Ok(false);
        }
        return Err(sc.bad("expected `,` or `}`"));
    }
}

/// Whether `json` is exactly one well-formed JSON object (whitespace
/// around it allowed). Asked only on the rare path of a record without its
/// key.
pub(crate) fn is_one_object(json: &[u8], scratch: &mut Vec<u8>) -> bool {
    let mut sc = Scanner {
        s: json,
        i: 0,
        depth: 0,
    };
    sc.ws();
    if sc.peek() != Some(b'{') || sc.skip_value(scratch).is_err() {
        return false;
    }
    sc.ws();
    sc.i == json.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The value's bytes as the router hashes them.
    fn find(json: &str, p: &[&str]) -> Result<(Vec<u8>, bool), NotFound> {
        let mut scratch = Vec::new();
        match find_field(json.as_bytes(), &path(p), &mut scratch)? {
            Found::Input(a, b, string) => Ok((json.as_bytes()[a..b].to_vec(), string)),
            Found::Scratch => Ok((scratch, true)),
        }
    }

    #[test]
    fn finds_strings_scalars_and_nested_values() {
        let j = r#"{"a":1, "long_key_name" : "x", "s":"hello world!", "n":{"k":[1,{"z":2}],"id":-4.5e3}}"#;
        assert_eq!(find(j, &["a"]), Ok((b"1".to_vec(), false)));
        assert_eq!(find(j, &["long_key_name"]), Ok((b"x".to_vec(), true)));
        assert_eq!(find(j, &["s"]), Ok((b"hello world!".to_vec(), true)));
        assert_eq!(find(j, &["n", "id"]), Ok((b"-4.5e3".to_vec(), false)));
        assert_eq!(
            find(j, &["n", "k"]),
            Ok((br#"[1,{"z":2}]"#.to_vec(), false))
        );
    }

    #[test]
    fn escaped_keys_and_values_are_unescaped() {
        let j = r#"{"\u0069d":"a\"b","k\u00e9y_long_enough":"v"}"#;
        assert_eq!(find(j, &["id"]), Ok((b"a\"b".to_vec(), true)));
        assert_eq!(
            find(j, &["k\u{e9}y_long_enough"]),
            Ok((b"v".to_vec(), true))
        );
    }

    #[test]
    fn absent_null_and_non_object_parents_are_absent() {
        let j = r#"{"a":null,"b":5,"c":{}}"#;
        assert_eq!(find(j, &["a"]), Err(NotFound::Absent));
        assert_eq!(find(j, &["x"]), Err(NotFound::Absent));
        assert_eq!(find(j, &["b", "y"]), Err(NotFound::Absent));
        assert_eq!(find(j, &["c", "y"]), Err(NotFound::Absent));
        // A prefix of a short key is another key.
        assert_eq!(find(r#"{"ab":1}"#, &["a"]), Err(NotFound::Absent));
        assert_eq!(find(r#"{"a":1}"#, &["ab"]), Err(NotFound::Absent));
    }

    #[test]
    fn malformed_before_the_field_is_told_apart() {
        for j in [
            r#"{"a":tru,"id":1}"#,
            r#"{"a":01,"id":1}"#,
            r#"{"a" 1,"id":1}"#,
            r#"{"a":1 "id":1}"#,
            "[1]",
            "5",
            "",
            r#"{"a":"unterminated"#,
        ] {
            assert_eq!(find(j, &["id"]), Err(NotFound::Malformed), "{j}");
        }
        // After the field nothing is read: the encoder checks the rest.
        assert_eq!(
            find(r#"{"id":1,"a":tru}"#, &["id"]),
            Ok((b"1".to_vec(), false))
        );
    }

    #[test]
    fn one_object_is_exactly_one_well_formed_object() {
        let mut scratch = Vec::new();
        for (j, want) in [
            (r#" {"a":[1,2],"b":{"c":null}} "#, true),
            (r#"{"a":1}{"b":2}"#, false),
            (r#"{"a":tru}"#, false),
            ("[]", false),
            ("", false),
        ] {
            assert_eq!(is_one_object(j.as_bytes(), &mut scratch), want, "{j}");
        }
    }
}
