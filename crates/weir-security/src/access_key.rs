//! RocketMQ's access keys (ACL 2.0's `MQv2-HMAC-SHA1`): a client signs each call with its
//! secret key, and names its access key. The call's `authorization` header reads
//! `MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>`,
//! where the signature is HMAC-SHA1 under the secret key of the `x-mq-date-time` header's
//! value. An access key is a Weir user's name; its secret key the user's password, kept for
//! this (RocketMQ keeps it the same way: an HMAC needs the secret itself).

use aws_lc_rs::hmac;

/// The signing algorithm RocketMQ's clients name.
pub const ALGORITHM: &str = "MQv2-HMAC-SHA1";
/// The header a signature covers.
pub const SIGNED_HEADER: &str = "x-mq-date-time";

/// A parsed `authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization<'a> {
    pub access_key: &'a str,
    pub signature: &'a str,
}

/// Reads an `authorization` header: `None` when it names no access key (rocketmq-python-client
/// signs every call, with an empty `Credential` when it has no credentials); `Err` says what is
/// wrong with it.
pub fn parse(header: &str) -> Result<Option<Authorization<'_>>, String> {
    let Some(fields) = header.trim().strip_prefix(ALGORITHM) else {
        return Err(format!("the authorization is not {ALGORITHM}"));
    };
    let (mut access_key, mut signature, mut signed) = (None, None, None);
    for field in fields.split(',') {
        let Some((name, value)) = field.trim().split_once('=') else {
            return Err(format!("a malformed authorization field {:?}", field.trim()));
        };
        match name.trim() {
            "Credential" => access_key = Some(value.trim()),
            "Signature" => signature = Some(value.trim()),
            "SignedHeaders" => signed = Some(value.trim()),
            _ => {}
        }
    }
    if signed.is_some_and(|headers| !headers.eq_ignore_ascii_case(SIGNED_HEADER)) {
        return Err(format!("the signature must cover {SIGNED_HEADER} alone"));
    }
    match (access_key, signature) {
        (Some(""), _) => Ok(None),
        (Some(access_key), Some(signature)) if !signature.is_empty() => {
            Ok(Some(Authorization { access_key, signature }))
        }
        _ => Err("the authorization names no Credential or no Signature".into()),
    }
}

/// The signature of `date_time` under `secret`, in lower-case hex (what clients send).
pub fn sign(secret: &str, date_time: &str) -> String {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes()), date_time.as_bytes());
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Does `signature` (hex, any case) sign `date_time` under `secret`? Compared in constant time.
pub fn verify(secret: &str, date_time: &str, signature: &str) -> bool {
    let Some(tag) = decode_hex(signature) else {
        return false;
    };
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
    hmac::verify(&key, date_time.as_bytes(), &tag).is_ok()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_as_the_clients_send_it_is_read() {
        let header = "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=0a1B";
        assert_eq!(parse(header), Ok(Some(Authorization { access_key: "alice", signature: "0a1B" })));
        // rocketmq-python-client without credentials.
        let anonymous = "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=5f2a";
        assert_eq!(parse(anonymous), Ok(None));
        assert!(parse("Basic abc").is_err());
        assert!(parse("MQv2-HMAC-SHA1 Credential=alice").is_err());
        assert!(parse("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=host, Signature=00").is_err());
        assert!(parse("MQv2-HMAC-SHA1 Credential=a, Signature").is_err());
    }

    #[test]
    fn signatures_are_hmac_sha1_of_the_date_time() {
        // RFC 2202's HMAC-SHA1 test case 2.
        assert_eq!(sign("Jefe", "what do ya want for nothing?"), "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
        let signature = sign("secret", "20261207T101010Z");
        assert!(verify("secret", "20261207T101010Z", &signature));
        assert!(verify("secret", "20261207T101010Z", &signature.to_uppercase()));
        assert!(!verify("wrong", "20261207T101010Z", &signature));
        assert!(!verify("secret", "20261207T101011Z", &signature));
        assert!(!verify("secret", "20261207T101010Z", "zz"));
        assert!(!verify("secret", "20261207T101010Z", ""));
    }
}
