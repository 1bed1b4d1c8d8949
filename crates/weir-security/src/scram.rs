//! SCRAM (RFC 5802, with the SHA-256 and SHA-512 hashes of RFC 7677 as Kafka names them): the
//! server's side of the exchange, and the salted credential it checks against.
//!
//! ```text
//! client-first   n,,n=alice,r=<client nonce>
//! server-first   r=<client nonce><server nonce>,s=<salt>,i=<iterations>
//! client-final   c=biws,r=<both nonces>,p=<proof>
//! server-final   v=<server signature>
//! ```
//! The server keeps `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and
//! `ServerKey = HMAC(SaltedPassword, "Server Key")`: enough to check a proof and to prove
//! itself, not enough to log in. An unknown user gets a made-up salt (the same each time for
//! the same name) and fails at the proof, as a wrong password does, so the exchange does not
//! tell who has an account.

use std::num::NonZeroU32;
use std::sync::OnceLock;

use aws_lc_rs::{constant_time, digest, hmac, pbkdf2, rand};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use weir_metadata::{ScramCredential, ScramMechanism};

/// Why an exchange failed. The message may go to the client: it never says whether the user
/// exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramError(pub String);

impl std::fmt::Display for ScramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScramError {}

fn failed(message: &str) -> ScramError {
    ScramError(message.to_string())
}

/// Iterations of a credential made from a password when none is asked for (Kafka's minimum;
/// its tools' default).
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Bytes of a new salt.
const SALT_LEN: usize = 32;

fn hmac_algorithm(mechanism: ScramMechanism) -> hmac::Algorithm {
    match mechanism {
        ScramMechanism::Sha256 => hmac::HMAC_SHA256,
        ScramMechanism::Sha512 => hmac::HMAC_SHA512,
    }
}

fn digest_algorithm(mechanism: ScramMechanism) -> &'static digest::Algorithm {
    match mechanism {
        ScramMechanism::Sha256 => &digest::SHA256,
        ScramMechanism::Sha512 => &digest::SHA512,
    }
}

fn pbkdf2_algorithm(mechanism: ScramMechanism) -> pbkdf2::Algorithm {
    match mechanism {
        ScramMechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
        ScramMechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
    }
}

fn output_len(mechanism: ScramMechanism) -> usize {
    digest_algorithm(mechanism).output_len()
}

fn hmac_of(mechanism: ScramMechanism, key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac_algorithm(mechanism), key), data).as_ref().to_vec()
}

/// `Hi(password, salt, i)` of RFC 5802: PBKDF2 with the mechanism's HMAC.
pub fn salted_password(mechanism: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = vec![0u8; output_len(mechanism)];
    let iterations = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
    pbkdf2::derive(pbkdf2_algorithm(mechanism), iterations, salt, password, &mut out);
    out
}

/// The credential of a salted password (what Kafka's AlterUserScramCredentials carries).
pub fn credential_from_salted(
    mechanism: ScramMechanism,
    salt: Vec<u8>,
    salted_password: &[u8],
    iterations: u32,
) -> ScramCredential {
    let client_key = hmac_of(mechanism, salted_password, b"Client Key");
    let stored_key = digest::digest(digest_algorithm(mechanism), &client_key).as_ref().to_vec();
    let server_key = hmac_of(mechanism, salted_password, b"Server Key");
    ScramCredential { salt, stored_key, server_key, iterations }
}

/// A new credential for `password`, with a random salt.
pub fn credential(mechanism: ScramMechanism, password: &str, iterations: u32) -> ScramCredential {
    let salt = random_bytes(SALT_LEN);
    let salted = salted_password(mechanism, password.as_bytes(), &salt, iterations);
    credential_from_salted(mechanism, salt, &salted, iterations)
}

/// Whether `password` is the one `credential` was made from (how SASL/PLAIN logs in against
/// the same store). Costs one PBKDF2 of the credential's iterations.
/// An HMAC-SHA-256 of `input` under a key drawn at random once per process: lets a caller
/// remember which passwords it checked (the admin API does) without keeping them, or a plain
/// hash of them that a dictionary could reverse.
pub fn process_keyed_digest(input: &[u8]) -> [u8; 32] {
    static KEY: OnceLock<hmac::Key> = OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut bytes = [0u8; 32];
        // (Without randomness the key is still unknown outside this process's memory.)
        let _ = rand::fill(&mut bytes);
        hmac::Key::new(hmac::HMAC_SHA256, &bytes)
    });
    let tag = hmac::sign(key, input);
    let mut out = [0u8; 32];
    out.copy_from_slice(&tag.as_ref()[..32]);
    out
}

pub fn verify_password(mechanism: ScramMechanism, credential: &ScramCredential, password: &str) -> bool {
    let salted = salted_password(mechanism, password.as_bytes(), &credential.salt, credential.iterations);
    let derived = credential_from_salted(mechanism, credential.salt.clone(), &salted, credential.iterations);
    constant_time::verify_slices_are_equal(&derived.stored_key, &credential.stored_key).is_ok()
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // The system's generator only fails when the kernel has none to give; a zero salt or nonce
    // is then still a valid (if weaker) one.
    let _ = rand::fill(&mut out);
    out
}

/// A per-process secret, so that an unknown user's made-up salt cannot be told from a real one.
fn decoy_key() -> &'static [u8] {
    static KEY: OnceLock<Vec<u8>> = OnceLock::new();
    KEY.get_or_init(|| random_bytes(32))
}

/// A credential no password opens, for a user that has none: the exchange goes on as for a real
/// user and fails at the proof.
fn decoy(mechanism: ScramMechanism, user: &str, iterations: u32) -> ScramCredential {
    let salt = hmac_of(ScramMechanism::Sha256, decoy_key(), user.as_bytes());
    let unusable = random_bytes(output_len(mechanism));
    ScramCredential { salt, stored_key: unusable.clone(), server_key: unusable, iterations }
}

/// The user name of a `saslname` (RFC 5802 5.1: `=2C` is a comma and `=3D` an equals sign;
/// any other `=` is an error).
fn decode_saslname(text: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3).ok_or_else(|| failed("a user name has an unfinished '=' escape"))?;
        match code {
            "=2C" => out.push(','),
            "=3D" => out.push('='),
            _ => return Err(failed("a user name has an '=' that is not =2C or =3D")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The attributes `k=value` of a message, in order.
fn attributes(message: &str) -> Vec<(char, &str)> {
    message
        .split(',')
        .filter_map(|part| {
            let mut chars = part.chars();
            let key = chars.next()?;
            part.get(1..).and_then(|rest| rest.strip_prefix('=')).map(|value| (key, value))
        })
        .collect()
}

/// Where an exchange stands.
enum State {
    /// Waiting for the client's first message.
    Start,
    /// The server's first message was sent; waiting for the client's proof.
    Challenged {
        user: String,
        credential: ScramCredential,
        /// Both nonces, as the client must repeat them.
        nonce: String,
        /// The GS2 header the client's final message must bind (`c=`).
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
    },
    Done,
}

/// What a step of the exchange produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this to the client and wait for its next message.
    Continue(Vec<u8>),
    /// The client proved it knows `user`'s password: send this last message (the server's
    /// signature, which proves the server to the client).
    Authenticated { user: String, last: Vec<u8> },
}

/// The server's side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
}

impl ScramServer {
    pub fn new(mechanism: ScramMechanism) -> ScramServer {
        ScramServer { mechanism, state: State::Start }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes the client's next message. `credential_of` looks a user's credential up (for this
    /// exchange's mechanism). Any error ends the exchange.
    pub fn step(
        &mut self,
        message: &[u8],
        credential_of: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Step, ScramError> {
        let text = std::str::from_utf8(message).map_err(|_| failed("a SCRAM message must be UTF-8"))?;
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start => {
                let (step, state) = self.first(text, credential_of)?;
                self.state = state;
                Ok(step)
            }
            State::Challenged { user, credential, nonce, gs2_header, client_first_bare, server_first } => {
                let last = self.last(text, &credential, &nonce, &gs2_header, &client_first_bare, &server_first)?;
                Ok(Step::Authenticated { user, last })
            }
            State::Done => Err(failed("the SCRAM exchange is over")),
        }
    }

    fn first(
        &self,
        text: &str,
        credential_of: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<(Step, State), ScramError> {
        // gs2-header: a channel-binding flag and an optional authorization id, then the rest.
        let mut parts = text.splitn(3, ',');
        let (flag, authzid, bare) = match (parts.next(), parts.next(), parts.next()) {
            (Some(flag), Some(authzid), Some(bare)) => (flag, authzid, bare),
            _ => return Err(failed("the first SCRAM message is not gs2-header,client-first-bare")),
        };
        match flag {
            "n" | "y" => {}
            _ if flag.starts_with("p=") => return Err(failed("SCRAM channel binding is not supported")),
            _ => return Err(failed("the first SCRAM message has an unknown channel-binding flag")),
        }
        let gs2_header = format!("{flag},{authzid},");
        let attributes = attributes(bare);
        let mut user = None;
        let mut client_nonce = None;
        for (i, (key, value)) in attributes.iter().enumerate() {
            match (i, key) {
                (0, 'm') => return Err(failed("SCRAM mandatory extensions are not supported")),
                (_, 'n') if user.is_none() => user = Some(decode_saslname(value)?),
                (_, 'r') if client_nonce.is_none() => client_nonce = Some(*value),
                // Kafka's delegation tokens (tokenauth=true) are not supported.
                (_, 't') if value.starts_with("okenauth") || *value == "true" => {
                    return Err(failed("delegation tokens are not supported"))
                }
                _ => {}
            }
        }
        let (Some(user), Some(client_nonce)) = (user, client_nonce) else {
            return Err(failed("the first SCRAM message needs n= and r="));
        };
        if user.is_empty() || client_nonce.is_empty() || client_nonce.contains(',') {
            return Err(failed("the first SCRAM message has an empty user name or nonce"));
        }
        if let Some(authzid) = authzid.strip_prefix("a=") {
            if decode_saslname(authzid)? != user {
                return Err(failed("the authorization id must be the user name"));
            }
        } else if !authzid.is_empty() {
            return Err(failed("the first SCRAM message has a malformed authorization id"));
        }
        let credential = credential_of(&user).unwrap_or_else(|| decoy(self.mechanism, &user, DEFAULT_ITERATIONS));
        let server_nonce = BASE64.encode(random_bytes(24));
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&credential.salt), credential.iterations);
        let state = State::Challenged {
            user,
            credential,
            nonce,
            gs2_header,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
        };
        Ok((Step::Continue(server_first.into_bytes()), state))
    }

    fn last(
        &self,
        text: &str,
        credential: &ScramCredential,
        nonce: &str,
        gs2_header: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> Result<Vec<u8>, ScramError> {
        let (without_proof, proof) =
            text.rsplit_once(",p=").ok_or_else(|| failed("the final SCRAM message has no proof (p=)"))?;
        let attributes = attributes(without_proof);
        let binding = attributes.iter().find(|(k, _)| *k == 'c').map(|(_, v)| *v);
        let repeated = attributes.iter().find(|(k, _)| *k == 'r').map(|(_, v)| *v);
        if binding != Some(BASE64.encode(gs2_header.as_bytes()).as_str()) {
            return Err(failed("the final SCRAM message does not bind the first one's header"));
        }
        // librdkafka 2.0 (Debian 12's, which its kcat uses) repeats its own nonce in front of
        // the combined one. The proof below covers the message exactly as sent, with the
        // server's nonce in it, so taking that form loses nothing.
        let client_nonce = client_first_bare.split(',').find_map(|a| a.strip_prefix("r=")).unwrap_or_default();
        let doubled = repeated.and_then(|r| r.strip_prefix(client_nonce));
        if repeated != Some(nonce) && doubled != Some(nonce) {
            return Err(failed("the final SCRAM message has the wrong nonce"));
        }
        let proof = BASE64.decode(proof).map_err(|_| failed("the SCRAM proof is not base64"))?;
        let mechanism = self.mechanism;
        if proof.len() != output_len(mechanism) {
            return Err(failed("authentication failed: invalid credentials"));
        }
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac_of(mechanism, &credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        let stored_key = digest::digest(digest_algorithm(mechanism), &client_key);
        if constant_time::verify_slices_are_equal(stored_key.as_ref(), &credential.stored_key).is_err() {
            return Err(failed("authentication failed: invalid credentials"));
        }
        let server_signature = hmac_of(mechanism, &credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", BASE64.encode(server_signature)).into_bytes())
    }
}

/// The client's side of one SCRAM exchange, as a broker logs in to another broker's SASL
/// listener: [`client_first`](ScramClient::client_first), then
/// [`client_final`](ScramClient::client_final) with the server's first message, then
/// [`verify_server`](ScramClient::verify_server) with its last, which proves the server knew the
/// credential (a server that skips it is not trusted).
pub struct ScramClient {
    mechanism: ScramMechanism,
    user: String,
    password: String,
    client_nonce: String,
    client_first_bare: String,
    /// The server's signature the last message must carry, once the proof is sent.
    expected_server_signature: Option<Vec<u8>>,
}

/// A user name as a `saslname` (RFC 5802 5.1).
fn encode_saslname(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    pub fn new(mechanism: ScramMechanism, user: &str, password: &str) -> ScramClient {
        let client_nonce = BASE64.encode(random_bytes(24));
        let client_first_bare = format!("n={},r={client_nonce}", encode_saslname(user));
        ScramClient {
            mechanism,
            user: user.to_string(),
            password: password.to_string(),
            client_nonce,
            client_first_bare,
            expected_server_signature: None,
        }
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    /// The first message: no channel binding, no authorization id.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// The proof, answering the server's first message (`r=...,s=...,i=...`).
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(server_first).map_err(|_| failed("a SCRAM message must be UTF-8"))?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(ScramError(format!("the server refused: {error}")));
        }
        let attributes = attributes(text);
        let value = |key: char| attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let (Some(nonce), Some(salt), Some(iterations)) = (value('r'), value('s'), value('i')) else {
            return Err(failed("the server's first SCRAM message needs r=, s= and i="));
        };
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(failed("the server's nonce does not extend the client's"));
        }
        let salt = BASE64.decode(salt).map_err(|_| failed("the SCRAM salt is not base64"))?;
        let iterations: u32 = iterations.parse().map_err(|_| failed("the SCRAM iteration count is not a number"))?;
        // Kafka's bounds (4096 to 16384): a server asking for more would make each login cost
        // seconds of CPU.
        if !(DEFAULT_ITERATIONS..=16_384).contains(&iterations) {
            return Err(ScramError(format!("the server asks for {iterations} iterations (4096 to 16384 expected)")));
        }
        let mechanism = self.mechanism;
        let salted = salted_password(mechanism, self.password.as_bytes(), &salt, iterations);
        let client_key = hmac_of(mechanism, &salted, b"Client Key");
        let stored_key = digest::digest(digest_algorithm(mechanism), &client_key);
        // c=biws is base64 of the GS2 header "n,,".
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let client_signature = hmac_of(mechanism, stored_key.as_ref(), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&client_signature).map(|(k, s)| k ^ s).collect();
        let server_key = hmac_of(mechanism, &salted, b"Server Key");
        self.expected_server_signature = Some(hmac_of(mechanism, &server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server's last message (`v=<signature>`).
    pub fn verify_server(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let text = std::str::from_utf8(server_final).map_err(|_| failed("a SCRAM message must be UTF-8"))?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(ScramError(format!("the server refused: {error}")));
        }
        let expected = self.expected_server_signature.as_ref().ok_or_else(|| failed("no proof was sent yet"))?;
        let signature = text
            .strip_prefix("v=")
            .and_then(|v| BASE64.decode(v).ok())
            .ok_or_else(|| failed("the server's last SCRAM message is not v=<signature>"))?;
        constant_time::verify_slices_are_equal(&signature, expected)
            .map_err(|_| failed("the server's SCRAM signature is wrong: it does not hold this credential"))
    }
}

/// A SASL/PLAIN message for `user` and `password` (no authorization id).
pub fn plain_message(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// The user name and password of a SASL/PLAIN message (RFC 4616: `authzid NUL authcid NUL
/// passwd`); an authorization id, if given, must be the user name.
pub fn parse_plain(message: &[u8]) -> Result<(String, String), ScramError> {
    let text = std::str::from_utf8(message).map_err(|_| failed("a PLAIN message must be UTF-8"))?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(failed("a PLAIN message is authzid NUL user NUL password"));
    };
    if user.is_empty() || password.is_empty() {
        return Err(failed("a PLAIN message needs a user name and a password"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(failed("the authorization id must be the user name"));
    }
    Ok((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(
        mechanism: ScramMechanism,
        stored: &ScramCredential,
        user: &str,
        password: &str,
    ) -> Result<Step, ScramError> {
        let mut server = ScramServer::new(mechanism);
        let mut client = ScramClient::new(mechanism, user, password);
        let lookup = |name: &str| (name == "alice").then(|| stored.clone());
        let Step::Continue(server_first) = server.step(&client.client_first(), lookup)? else {
            panic!("expected a challenge")
        };
        let last = client.client_final(&server_first)?;
        let step = server.step(&last, |_| None)?;
        if let Step::Authenticated { last, .. } = &step {
            client.verify_server(last).expect("the server proves itself");
        }
        Ok(step)
    }

    #[test]
    fn the_right_password_authenticates_and_others_do_not() {
        for mechanism in ScramMechanism::ALL {
            let stored = credential(mechanism, "secret", 4096);
            assert_eq!(stored.stored_key.len(), output_len(mechanism));
            match exchange(mechanism, &stored, "alice", "secret").unwrap() {
                Step::Authenticated { user, .. } => assert_eq!(user, "alice"),
                other => panic!("{other:?}"),
            }
            assert!(exchange(mechanism, &stored, "alice", "wrong").is_err());
            // An unknown user fails at the proof, like a wrong password.
            assert!(exchange(mechanism, &stored, "mallory", "secret").is_err());
            assert!(verify_password(mechanism, &stored, "secret"));
            assert!(!verify_password(mechanism, &stored, "secreT"));
        }
    }

    /// RFC 7677's test vector for SCRAM-SHA-256 (user "user", password "pencil").
    #[test]
    fn rfc_7677_vector() {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salted_password(ScramMechanism::Sha256, b"pencil", &salt, 4096);
        let stored = credential_from_salted(ScramMechanism::Sha256, salt, &salted, 4096);
        let bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server = ScramServer::new(ScramMechanism::Sha256);
        let last = server
            .last(
                &format!("{without_proof},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="),
                &stored,
                "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
                "n,,",
                bare,
                server_first,
            )
            .unwrap();
        assert_eq!(last, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec());
    }

    /// The client's side of the same vector: its proof and the server signature it expects.
    #[test]
    fn rfc_7677_vector_client() {
        let mut client = ScramClient::new(ScramMechanism::Sha256, "user", "pencil");
        client.client_nonce = "rOprNGfwEbeRWgbNEkqO".into();
        client.client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO".into();
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = client.client_final(server_first).unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        client.verify_server(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
        assert!(client.verify_server(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_err());
        assert!(client.verify_server(b"e=invalid-proof").is_err());
    }

    #[test]
    fn the_client_refuses_odd_challenges() {
        let mut client = ScramClient::new(ScramMechanism::Sha512, "alice", "secret");
        let nonce = client.client_nonce.clone();
        for bad in [
            "r=other,s=c2FsdA==,i=4096".to_string(),
            format!("r={nonce},s=c2FsdA==,i=4096"),
            format!("r={nonce}x,s=c2FsdA==,i=100"),
            format!("r={nonce}x,s=c2FsdA==,i=100000000"),
            format!("r={nonce}x,s=!!,i=4096"),
            "e=unknown-user".to_string(),
        ] {
            assert!(client.client_final(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(client.verify_server(b"v=AAAA").is_err(), "nothing was proved yet");
    }

    #[test]
    fn malformed_messages_are_refused() {
        let stored = credential(ScramMechanism::Sha512, "secret", 4096);
        for bad in [
            &b"\xff"[..],
            b"",
            b"n,,",
            b"n,,r=abc",
            b"n,,n=alice",
            b"p=tls-unique,,n=alice,r=x",
            b"n,a=bob,n=alice,r=x",
            b"n,,n=al=ice,r=x",
        ] {
            let mut server = ScramServer::new(ScramMechanism::Sha512);
            assert!(server.step(bad, |_| Some(stored.clone())).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut server = ScramServer::new(ScramMechanism::Sha512);
        server.step(b"n,,n=alice,r=abc", |_| Some(stored.clone())).unwrap();
        assert!(server.step(b"c=biws,r=abc", |_| None).is_err());
        assert!(server.step(b"c=biws,r=abc,p=AAAA", |_| None).is_err(), "the exchange is over after a failure");
        assert_eq!(decode_saslname("a=2Cb=3Dc").unwrap(), "a,b=c");
    }

    #[test]
    fn plain_messages() {
        assert_eq!(parse_plain(b"\0alice\0pw").unwrap(), ("alice".into(), "pw".into()));
        assert_eq!(parse_plain(b"alice\0alice\0pw").unwrap(), ("alice".into(), "pw".into()));
        assert!(parse_plain(b"bob\0alice\0pw").is_err());
        assert!(parse_plain(b"alice\0pw").is_err());
        assert!(parse_plain(b"\0alice\0").is_err());
    }
}
