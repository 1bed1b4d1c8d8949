//! The principal of a mutual-TLS client (an SSL listener with `ssl.client.auth`): its
//! certificate's subject as Kafka names it (`CN=alice,OU=eng,O=Example` — RFC 2253, most
//! specific first), mapped by `ssl.principal.mapping.rules`:
//!
//! - `DEFAULT` keeps the whole name;
//! - `RULE:pattern/replacement/` applies when the pattern matches the whole name, `$1` and so
//!   on taking its groups; a trailing `L` or `U` lowers or raises the case of the result.
//!
//! Rules are tried in order; a name no rule matches is refused (the connection's
//! authentication fails), as in Kafka.

use regex::Regex;
use x509_parser::prelude::{FromDer, X509Certificate};

/// One `ssl.principal.mapping.rules` rule.
#[derive(Debug, Clone)]
enum Rule {
    Default,
    Replace { pattern: Regex, replacement: String, case: Case },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// `ssl.principal.mapping.rules`, parsed.
#[derive(Debug, Clone)]
pub struct PrincipalRules(Vec<Rule>);

impl Default for PrincipalRules {
    fn default() -> Self {
        PrincipalRules(vec![Rule::Default])
    }
}

impl PrincipalRules {
    /// Parses Kafka's syntax: rules separated by commas (or white space), each `DEFAULT` or
    /// `RULE:pattern/replacement/[LU]` where `\/` is a slash inside the pattern or replacement.
    pub fn parse(text: &str) -> Result<PrincipalRules, String> {
        let mut rules = Vec::new();
        let mut rest = text.trim_start_matches([',', ' ', '\t', '\n']);
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) = until_slash(after).ok_or("a RULE needs pattern/replacement/")?;
                let (replacement, after) = until_slash(after).ok_or("a RULE needs pattern/replacement/")?;
                let (case, after) = match after.chars().next() {
                    Some('L') => (Case::Lower, &after[1..]),
                    Some('U') => (Case::Upper, &after[1..]),
                    _ => (Case::Keep, after),
                };
                let pattern =
                    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| format!("RULE pattern {pattern:?}: {e}"))?;
                rules.push(Rule::Replace { pattern, replacement, case });
                rest = after;
            } else {
                return Err(format!("expected DEFAULT or RULE:pattern/replacement/ at {rest:?}"));
            }
            let trimmed = rest.trim_start_matches([' ', '\t', '\n']);
            rest = match trimmed.strip_prefix(',') {
                Some(after) => after.trim_start_matches([' ', '\t', '\n']),
                None if trimmed.is_empty() => trimmed,
                None => return Err(format!("expected a comma between rules at {trimmed:?}")),
            };
        }
        if rules.is_empty() {
            return Err("no rule (DEFAULT keeps the certificate's whole name)".into());
        }
        Ok(PrincipalRules(rules))
    }

    /// The name `distinguished_name` maps to, or `None` when no rule applies.
    pub fn apply(&self, distinguished_name: &str) -> Option<String> {
        for rule in &self.0 {
            match rule {
                Rule::Default => return Some(distinguished_name.to_string()),
                Rule::Replace { pattern, replacement, case } => {
                    if pattern.is_match(distinguished_name) {
                        let mapped = pattern.replace(distinguished_name, replacement.as_str()).into_owned();
                        return Some(match case {
                            Case::Keep => mapped,
                            Case::Lower => mapped.to_lowercase(),
                            Case::Upper => mapped.to_uppercase(),
                        });
                    }
                }
            }
        }
        None
    }

    /// The principal (`User:<name>`) of a client certificate, its leaf in DER: the subject's
    /// name, mapped by these rules.
    pub fn principal_of_certificate(&self, leaf_der: &[u8]) -> Result<String, String> {
        let subject = subject_name(leaf_der)?;
        let name =
            self.apply(&subject).ok_or_else(|| format!("no ssl.principal.mapping.rules rule maps {subject:?}"))?;
        Ok(format!("User:{name}"))
    }
}

/// The text up to the next unescaped `/`, with `\/` unescaped, and what follows the slash.
fn until_slash(text: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, '/')) => out.push('/'),
                Some((_, other)) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            '/' => return Some((out, &text[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

/// The certificate's subject in RFC 2253 form, as Java's `X500Principal.getName()` gives it:
/// relative names from the most specific (the last in the certificate) to the least, joined
/// by commas; attributes by their usual short names, others by their dotted OID.
pub fn subject_name(certificate_der: &[u8]) -> Result<String, String> {
    let (_, certificate) = X509Certificate::from_der(certificate_der)
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let mut names: Vec<String> = Vec::new();
    for rdn in certificate.subject().iter() {
        let mut parts = Vec::new();
        for attribute in rdn.iter() {
            let oid = attribute.attr_type().to_id_string();
            let key = match oid.as_str() {
                "2.5.4.3" => "CN".to_string(),
                "2.5.4.6" => "C".to_string(),
                "2.5.4.7" => "L".to_string(),
                "2.5.4.8" => "ST".to_string(),
                "2.5.4.9" => "STREET".to_string(),
                "2.5.4.10" => "O".to_string(),
                "2.5.4.11" => "OU".to_string(),
                "0.9.2342.19200300.100.1.25" => "DC".to_string(),
                "0.9.2342.19200300.100.1.1" => "UID".to_string(),
                other => other.to_string(),
            };
            let value = attribute.as_str().map(escape).unwrap_or_else(|_| {
                // (A value that is not a string: RFC 2253's #hex of its encoding.)
                let hex: String = attribute.attr_value().data.iter().map(|b| format!("{b:02x}")).collect();
                format!("#{hex}")
            });
            parts.push(format!("{key}={value}"));
        }
        names.push(parts.join("+"));
    }
    names.reverse();
    Ok(names.join(","))
}

/// RFC 2253's escaping of an attribute value.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == value.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_the_name_and_rules_map_it_in_order() {
        let rules = PrincipalRules::parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),.*$/$1/L, DEFAULT")
            .expect("Kafka's documented example parses");
        assert_eq!(rules.apply("CN=kafka-app,OU=ServiceUsers,O=Example").as_deref(), Some("kafka-app"));
        assert_eq!(rules.apply("CN=Alice,OU=People,O=Example").as_deref(), Some("alice"));
        assert_eq!(rules.apply("O=Example").as_deref(), Some("O=Example"), "DEFAULT last");
        let strict = PrincipalRules::parse("RULE:^CN=([a-z]+)$/$1/U").expect("parses");
        assert_eq!(strict.apply("CN=bob").as_deref(), Some("BOB"));
        assert_eq!(strict.apply("CN=bob,O=x"), None, "no rule: refused");
        assert_eq!(PrincipalRules::default().apply("CN=x").as_deref(), Some("CN=x"));
    }

    #[test]
    fn slashes_are_escaped_and_bad_rules_refused() {
        let rules = PrincipalRules::parse(r"RULE:^CN=(.*)$/users\/$1/").expect("parses");
        assert_eq!(rules.apply("CN=a").as_deref(), Some("users/a"));
        assert!(PrincipalRules::parse("RULE:^CN=(.*$/x/").is_err(), "bad regex");
        assert!(PrincipalRules::parse("RULE:nothing").is_err());
        assert!(PrincipalRules::parse("SOMETHING").is_err());
        assert!(PrincipalRules::parse("").is_err());
    }

    #[test]
    fn special_characters_in_values_are_escaped() {
        assert_eq!(escape("a,b"), r"a\,b");
        assert_eq!(escape("#x"), r"\#x");
        assert_eq!(escape("plain"), "plain");
    }
}
