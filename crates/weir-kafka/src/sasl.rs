//! SASL on a Kafka connection (KIP-43, KIP-152, KIP-368): SaslHandshake picks a mechanism,
//! SaslAuthenticate carries its tokens (or, after a v0 handshake, the tokens come as bare
//! length-prefixed frames). Until the client has authenticated, only ApiVersions and these two
//! are served; any other request closes the connection, as Kafka's brokers do.
//!
//! The passwords are checked against the users' SCRAM credentials in the metadata
//! ([`weir_security::scram`]): SCRAM exchanges them salted; PLAIN sends the password, which
//! is salted and compared the same way.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use weir_broker::config::SaslMechanism;
use weir_security::scram::{self, ScramServer, Step};

use crate::context::Ctx;
use crate::frame::{self, Chunk, FrameError, ResponseFrame};

/// Where a connection's authentication stands.
pub(crate) struct Authentication {
    /// The connection's listener (its index in `config.client_listeners`).
    listener: usize,
    state: State,
    /// The user once authenticated (kept across re-authentications, which must name it again).
    user: Option<String>,
    /// When the session ends (`connections.max.reauth.ms`), if it does.
    expires: Option<Instant>,
}

enum State {
    /// A SaslHandshake is due (at the start, or to re-authenticate).
    Handshake,
    /// The mechanism is chosen; its tokens come in SaslAuthenticate requests, or as bare
    /// frames after a v0 handshake.
    Exchange {
        mechanism: SaslMechanism,
        scram: Option<Box<ScramServer>>,
        raw: bool,
    },
    Authenticated,
}

/// What the connection does after a SASL request.
pub(crate) enum Outcome {
    /// Send this and go on.
    Reply(ResponseFrame),
    /// Send this (the failure), then close the connection.
    Close(ResponseFrame),
}

impl Authentication {
    pub(crate) fn new(listener: usize) -> Authentication {
        Authentication { listener, state: State::Handshake, user: None, expires: None }
    }

    /// The user, once authenticated.
    pub(crate) fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// May requests other than the SASL ones be served?
    pub(crate) fn is_authenticated(&self) -> bool {
        self.user.is_some() && self.expires.is_none_or(|at| Instant::now() < at)
    }

    /// Is the next frame a bare token (after a SaslHandshake v0)?
    pub(crate) fn expects_raw_token(&self) -> bool {
        matches!(self.state, State::Exchange { raw: true, .. })
    }

    pub(crate) async fn handshake(
        &mut self,
        ctx: &Ctx,
        version: i16,
        correlation_id: i32,
        request: SaslHandshakeRequest,
    ) -> Result<Outcome, FrameError> {
        let security = &ctx.listener(self.listener).security;
        let offered: Vec<StrBytes> =
            security.sasl_mechanisms.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        let encode = |error_code: i16| {
            let response =
                SaslHandshakeResponse::default().with_error_code(error_code).with_mechanisms(offered.clone());
            frame::encode_response(ApiKey::SaslHandshake, version, correlation_id, &response).map(whole)
        };
        if matches!(self.state, State::Exchange { .. }) {
            return Ok(Outcome::Close(encode(ResponseError::IllegalSaslState.code())?));
        }
        let wanted = request.mechanism.as_str();
        let Some(mechanism) = security.sasl_mechanisms.iter().copied().find(|m| m.name().eq_ignore_ascii_case(wanted))
        else {
            tracing::info!(mechanism = wanted, "SASL handshake asks for a mechanism this listener does not offer");
            return Ok(Outcome::Close(encode(ResponseError::UnsupportedSaslMechanism.code())?));
        };
        let scram = match mechanism {
            SaslMechanism::Scram(m) => Some(Box::new(ScramServer::new(m))),
            SaslMechanism::Plain => None,
        };
        self.state = State::Exchange { mechanism, scram, raw: version == 0 };
        Ok(Outcome::Reply(encode(0)?))
    }

    pub(crate) async fn authenticate(
        &mut self,
        ctx: &Ctx,
        peer: IpAddr,
        version: i16,
        correlation_id: i32,
        request: SaslAuthenticateRequest,
    ) -> Result<Outcome, FrameError> {
        let result = self.take_token(ctx, peer, &request.auth_bytes).await;
        let (error_code, message, bytes) = match &result {
            Ok(bytes) => (0, None, bytes.clone()),
            Err(Failure::State(message)) => {
                (ResponseError::IllegalSaslState.code(), Some(message.clone()), Bytes::new())
            }
            Err(Failure::Credentials(message)) => {
                (ResponseError::SaslAuthenticationFailed.code(), Some(message.clone()), Bytes::new())
            }
        };
        let lifetime = match (&result, self.expires) {
            (Ok(_), Some(at)) if self.is_authenticated() => {
                at.saturating_duration_since(Instant::now()).as_millis() as i64
            }
            _ => 0,
        };
        let response = SaslAuthenticateResponse::default()
            .with_error_code(error_code)
            .with_error_message(message.map(StrBytes::from_string))
            .with_auth_bytes(bytes)
            .with_session_lifetime_ms(lifetime);
        let frame = whole(frame::encode_response(ApiKey::SaslAuthenticate, version, correlation_id, &response)?);
        Ok(if result.is_ok() { Outcome::Reply(frame) } else { Outcome::Close(frame) })
    }

    /// A bare token after a v0 handshake: the answer is a bare token too; a failure closes the
    /// connection with no answer (the v0 protocol has no room for one).
    pub(crate) async fn raw_token(&mut self, ctx: &Ctx, peer: IpAddr, token: Bytes) -> Outcome {
        match self.take_token(ctx, peer, &token).await {
            Ok(bytes) => {
                let mut out = BytesMut::with_capacity(4 + bytes.len());
                out.put_u32(bytes.len() as u32);
                out.put_slice(&bytes);
                // (PLAIN's answer is an empty token, as Kafka's brokers send it.)
                Outcome::Reply(ResponseFrame { chunks: vec![Chunk::Bytes(out.freeze())] })
            }
            Err(_) => Outcome::Close(ResponseFrame { chunks: Vec::new() }),
        }
    }

    /// Takes one token of the exchange: the bytes to send back, or why it failed.
    async fn take_token(&mut self, ctx: &Ctx, peer: IpAddr, token: &[u8]) -> Result<Bytes, Failure> {
        let State::Exchange { mechanism, scram, .. } = &mut self.state else {
            return Err(Failure::State("SaslAuthenticate without a SaslHandshake first".into()));
        };
        let mechanism = *mechanism;
        let security = &ctx.listener(self.listener).security;
        if ctx.failed_logins.over_limit(peer, security.failed_authentications_per_minute) {
            ctx.metrics.connections.authentication_failures.inc();
            self.state = State::Handshake;
            return Err(Failure::Credentials(
                "too many failed authentications from this address; try again in a minute".into(),
            ));
        }
        let outcome = match (mechanism, scram) {
            (SaslMechanism::Plain, _) => check_plain(ctx, token).await.map(|user| (Some(user), Bytes::new())),
            (SaslMechanism::Scram(m), Some(server)) => {
                let step = server.step(token, |user| ctx.broker.scram_credential(user, m));
                match step {
                    Ok(Step::Continue(bytes)) => Ok((None, Bytes::from(bytes))),
                    Ok(Step::Authenticated { user, last }) => Ok((Some(user), Bytes::from(last))),
                    Err(e) => Err(e.0),
                }
            }
            (SaslMechanism::Scram(_), None) => Err("the SCRAM exchange is missing".to_string()),
        };
        match outcome {
            Ok((None, bytes)) => Ok(bytes),
            Ok((Some(user), bytes)) => {
                if self.user.as_ref().is_some_and(|before| *before != user) {
                    self.state = State::Handshake;
                    return Err(Failure::Credentials(
                        "a re-authentication must be as the same user as the connection's".into(),
                    ));
                }
                ctx.metrics.connections.authentications.inc();
                tracing::debug!(%peer, %user, mechanism = mechanism.name(), "authenticated");
                self.user = Some(user);
                self.state = State::Authenticated;
                self.expires = (security.max_reauth_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(security.max_reauth_ms));
                Ok(bytes)
            }
            Err(message) => {
                ctx.metrics.connections.authentication_failures.inc();
                ctx.failed_logins.record(peer);
                tracing::info!(%peer, mechanism = mechanism.name(), reason = %message, "authentication failed");
                self.state = State::Handshake;
                // Slows down guessing (Kafka's connection.failed.authentication.delay.ms).
                tokio::time::sleep(Duration::from_millis(security.failed_authentication_delay_ms)).await;
                Err(Failure::Credentials(format!(
                    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                    mechanism.name()
                )))
            }
        }
    }

    /// Starts a re-authentication (KIP-368): a new SaslHandshake on an authenticated
    /// connection.
    pub(crate) fn restart(&mut self) {
        if matches!(self.state, State::Authenticated) {
            self.state = State::Handshake;
        }
    }
}

fn whole(bytes: BytesMut) -> ResponseFrame {
    ResponseFrame { chunks: vec![Chunk::Bytes(bytes.freeze())] }
}

enum Failure {
    /// A request out of turn: Kafka's ResponseError::IllegalSaslState.code().
    State(String),
    /// Wrong credentials, or a malformed exchange.
    Credentials(String),
}

/// PLAIN: the user whose password this is. PBKDF2 takes milliseconds, so it runs off the
/// connection's worker.
async fn check_plain(ctx: &Ctx, token: &[u8]) -> Result<String, String> {
    let (user, password) = scram::parse_plain(token).map_err(|e| e.0)?;
    let credentials: Vec<_> = weir_security::ScramMechanism::ALL
        .into_iter()
        .filter_map(|m| ctx.broker.scram_credential(&user, m).map(|c| (m, c)))
        .collect();
    let checked = tokio::task::spawn_blocking(move || {
        // The cheapest mechanism the user has is enough: each was made from the same password.
        credentials.iter().any(|(m, c)| scram::verify_password(*m, c, &password))
    })
    .await
    .unwrap_or(false);
    if checked {
        Ok(user)
    } else {
        Err("wrong user name or password".into())
    }
}
