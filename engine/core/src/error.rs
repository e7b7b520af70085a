//! Error text for people: an error and its sources on one line.

/// `e` and its [`source`](std::error::Error::source) chain, `: `-joined,
/// leaving out a source whose text the line already contains (many errors
/// repeat their source in their own message; hyper's top-level messages
/// alone say little: "client error (Connect)").
///
/// ```
/// let io = std::io::Error::other("connection refused");
/// assert_eq!(spate_core::error::chain(&io), "connection refused");
/// ```
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug)]
    struct Outer(std::io::Error, &'static str);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.1)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn sources_are_joined_and_repeats_left_out() {
        let e = Outer(std::io::Error::other("refused"), "client error (Connect)");
        assert_eq!(chain(&e), "client error (Connect): refused");
        let e = Outer(std::io::Error::other("refused"), "connect: refused");
        assert_eq!(chain(&e), "connect: refused");
    }
}
