//! Followers reach their leaders with Kafka's Fetch, as Kafka's replica fetchers do: this is the
//! wire side of the core's follower (`weir_broker::follower`), a [`ReplicaTransport`] that sends
//! Fetch v12 to the leader's Kafka listener, naming this broker as the replica. The leader then
//! serves it with the consumers' read path, file ranges sent with `sendfile`.
//!
//! Each connection keeps a fetch session (KIP-227) with the leader: the first fetch names every
//! partition and opens it, later ones name only the partitions whose fetch position changed
//! (and those no longer followed, as forgotten), and the leader answers only for partitions
//! with something new. An idle follower's fetch is then a few dozen bytes whatever it follows.
//! A refused session (unknown, wrong epoch) is dropped and the next fetch opens a new one.
//!
//! The connection is secured as the leader's inter-broker listener is (`InterBrokerClient`):
//! TLS, checking the leader's certificate against the truststore, and a SASL login (PLAIN or
//! SCRAM, whose last message proves the leader holds the credential too). A refused login is
//! not tried again for [`LOGIN_RETRY`], so that a broker with a wrong password does not spend
//! the address's allowance of failed logins (`connection.failed.authentication.max.per.minute`)
//! that clients on the same host share.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic, ReplicaState};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_broker::config::{InterBrokerClient, SaslLogin, SaslMechanism};
use weir_broker::follower::{
    DivergingEpoch, FetchFrom, FollowerFetch, LeaderAnswer, LeaderError, LeaderPartition, ReplicaConnection,
    ReplicaTransport, TransportFuture,
};

/// The Fetch version followers send: the first with diverging epochs, and topics by name.
const FETCH_VERSION: i16 = 12;
/// SaslHandshake v1 (the exchange goes on in SaslAuthenticate) and SaslAuthenticate v2.
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 2;
/// How long a leader that refused this broker's login is left alone.
pub const LOGIN_RETRY: Duration = Duration::from_secs(5);
/// The client id of the login's requests.
const SASL_CLIENT_ID: &str = "weir-replica-fetcher";
/// The largest answer to a handshake or login.
const MAX_SASL_RESPONSE: i32 = 64 * 1024;

/// A connection to a leader: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Kafka's Fetch over TCP, secured as the inter-broker listener is.
#[derive(Default, Clone)]
pub struct KafkaReplicaTransport {
    /// The TLS of each new connection, its files reloaded when they change.
    tls: Option<Arc<weir_security::tls::ReloadingClientTls>>,
    login: Option<SaslLogin>,
    /// When each leader address last refused the login.
    refused: Arc<Mutex<HashMap<String, Instant>>>,
}

impl KafkaReplicaTransport {
    /// The transport `client` describes (`None`: plain text, no login).
    pub fn new(client: Option<&InterBrokerClient>) -> Result<KafkaReplicaTransport, String> {
        let Some(client) = client else { return Ok(KafkaReplicaTransport::default()) };
        let tls = match &client.tls {
            Some(settings) => {
                Some(Arc::new(weir_security::tls::ReloadingClientTls::new(settings.clone(), client.verify_name)?))
            }
            None => None,
        };
        Ok(KafkaReplicaTransport { tls, login: client.login.clone(), refused: Default::default() })
    }

    fn refused_recently(&self, addr: &str) -> Option<Duration> {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        refused.get(addr).map(Instant::elapsed).filter(|since| *since < LOGIN_RETRY)
    }

    async fn open(&self, addr: &str) -> Result<Box<dyn Stream>, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let mut stream: Box<dyn Stream> = match &self.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.config());
                let host =
                    addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_start_matches('[').trim_end_matches(']');
                let name = rustls_server_name(host)?;
                let tls =
                    connector.connect(name, tcp).await.map_err(|e| format!("TLS handshake with {addr} failed: {e}"))?;
                Box::new(tls)
            }
        };
        if let Some(login) = &self.login {
            if let Err(e) = sasl_login(&mut stream, login).await {
                if e.refused {
                    let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                    refused.insert(addr.to_string(), Instant::now());
                }
                return Err(format!(
                    "SASL {} login as {:?} to {addr}: {}",
                    login.mechanism.name(),
                    login.user,
                    e.message
                ));
            }
        }
        Ok(stream)
    }
}

fn rustls_server_name(host: &str) -> Result<tokio_rustls::rustls::pki_types::ServerName<'static>, String> {
    tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a name a certificate can hold: {e}"))
}

impl ReplicaTransport for KafkaReplicaTransport {
    fn connect(&self, addr: &str) -> TransportFuture<'static, Result<Box<dyn ReplicaConnection>, String>> {
        let addr = addr.to_string();
        let transport = self.clone();
        Box::pin(async move {
            if let Some(since) = transport.refused_recently(&addr) {
                return Err(format!(
                    "{addr} refused this broker's login {:.1} s ago; trying again {} s after",
                    since.as_secs_f64(),
                    LOGIN_RETRY.as_secs()
                ));
            }
            let stream = transport.open(&addr).await?;
            Ok(Box::new(Connection { stream, correlation_id: 0, session: FetchSession::default() })
                as Box<dyn ReplicaConnection>)
        })
    }
}

/// Why a login failed; `refused` when the leader said no (not a broken connection).
struct LoginError {
    refused: bool,
    message: String,
}

fn broken(message: impl std::fmt::Display) -> LoginError {
    LoginError { refused: false, message: message.to_string() }
}

fn refused(message: impl std::fmt::Display) -> LoginError {
    LoginError { refused: true, message: message.to_string() }
}

/// SaslHandshake for the mechanism, then SaslAuthenticate until the exchange is done.
async fn sasl_login(stream: &mut Box<dyn Stream>, login: &SaslLogin) -> Result<(), LoginError> {
    let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(login.mechanism.name()));
    let answer: SaslHandshakeResponse = exchange(
        stream,
        SASL_CLIENT_ID,
        1,
        ApiKey::SaslHandshake,
        SASL_HANDSHAKE_VERSION,
        &handshake,
        MAX_SASL_RESPONSE,
    )
    .await
    .map_err(broken)?;
    if answer.error_code != 0 {
        let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
        return Err(refused(format!("the leader offers {offered:?}, not {}", login.mechanism.name())));
    }
    match login.mechanism {
        SaslMechanism::Plain => {
            authenticate(stream, 2, weir_security::scram::plain_message(&login.user, &login.password)).await?;
        }
        SaslMechanism::Scram(mechanism) => {
            let mut client = weir_security::scram::ScramClient::new(mechanism, &login.user, &login.password);
            let server_first = authenticate(stream, 2, client.client_first()).await?;
            let proof = client.client_final(&server_first).map_err(refused)?;
            let server_final = authenticate(stream, 3, proof).await?;
            client.verify_server(&server_final).map_err(refused)?;
        }
    }
    Ok(())
}

/// One SaslAuthenticate round: sends `token`, returns the leader's.
async fn authenticate(
    stream: &mut Box<dyn Stream>,
    correlation_id: i32,
    token: Vec<u8>,
) -> Result<Vec<u8>, LoginError> {
    let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    let answer: SaslAuthenticateResponse = exchange(
        stream,
        SASL_CLIENT_ID,
        correlation_id,
        ApiKey::SaslAuthenticate,
        SASL_AUTHENTICATE_VERSION,
        &request,
        MAX_SASL_RESPONSE,
    )
    .await
    .map_err(broken)?;
    if answer.error_code != 0 {
        let why = answer.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default();
        return Err(refused(format!("{why} ({:?})", ResponseError::try_from_code(answer.error_code))));
    }
    Ok(answer.auth_bytes.to_vec())
}

/// One connection to a leader's Kafka listener.
struct Connection {
    stream: Box<dyn Stream>,
    correlation_id: i32,
    session: FetchSession,
}

/// The follower's side of its fetch session with the leader.
#[derive(Debug, Default)]
struct FetchSession {
    /// 0: none; the next fetch is a full one that asks for a session.
    id: i32,
    /// The epoch of the next incremental fetch.
    epoch: i32,
    /// What the leader holds for each partition of the session, by topic (looked up by `&str`,
    /// so an idle round allocates nothing per partition): the last position sent.
    sent: HashMap<String, HashMap<i32, FetchFrom>>,
    /// Partitions in `sent`.
    len: usize,
    /// The generation of the last fetch's list (see [`FollowerFetch::generation`]).
    generation: u64,
}

impl FetchSession {
    /// The request for `fetch`: full when there is no session, else the partitions whose
    /// position changed and those no longer fetched. Records what the leader will hold.
    fn request(&mut self, fetch: &FollowerFetch) -> FetchRequest {
        let full = self.id == 0;
        if full {
            self.sent.clear();
            self.len = 0;
        }
        // The same list as last time: only the touched partitions may have moved, and none
        // was dropped. An idle round looks at none.
        let same_list = !full && self.generation == fetch.generation && fetch.touched.is_some();
        self.generation = fetch.generation;
        let candidates: Box<dyn Iterator<Item = &FetchFrom>> = match (&fetch.touched, same_list) {
            (Some(touched), true) => Box::new(touched.iter().filter_map(|i| fetch.partitions.get(*i))),
            _ => Box::new(fetch.partitions.iter()),
        };
        let mut named: Vec<&FetchFrom> = Vec::new();
        // Named again though unchanged: the follower could not apply the last answer for them.
        let retried: Vec<&FetchFrom> = fetch.retry.iter().filter_map(|i| fetch.partitions.get(*i)).collect();
        for from in candidates {
            let topic = match self.sent.get_mut(from.topic.as_str()) {
                Some(topic) => topic,
                None => self.sent.entry(from.topic.clone()).or_default(),
            };
            match topic.get_mut(&from.partition) {
                Some(sent) if sent == from => {
                    if retried.contains(&from) {
                        named.push(from);
                    }
                }
                Some(sent) => {
                    *sent = from.clone();
                    named.push(from);
                }
                None => {
                    topic.insert(from.partition, from.clone());
                    self.len += 1;
                    named.push(from);
                }
            }
        }
        // Every partition of `fetch` is in `sent` now: more there means some were dropped.
        let mut forgotten: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        if !same_list && self.len > fetch.partitions.len() {
            let fetched: std::collections::HashSet<(&str, i32)> =
                fetch.partitions.iter().map(|p| (p.topic.as_str(), p.partition)).collect();
            for (topic, partitions) in &mut self.sent {
                partitions.retain(|partition, _| {
                    let keep = fetched.contains(&(topic.as_str(), *partition));
                    if !keep {
                        forgotten.entry(topic.clone()).or_default().push(*partition);
                    }
                    keep
                });
            }
            self.sent.retain(|_, partitions| !partitions.is_empty());
            self.len = fetch.partitions.len();
        }
        let (id, epoch) = if full { (0, 0) } else { (self.id, self.epoch) };
        fetch_request(fetch, &named, id, epoch).with_forgotten_topics_data(
            forgotten
                .into_iter()
                .map(|(topic, partitions)| {
                    ForgottenTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(topic)))
                        .with_partitions(partitions)
                })
                .collect(),
        )
    }

    /// Takes in the leader's answer to a request of this session: a new session's id, or the
    /// next epoch; a refused session is dropped (the next fetch opens another).
    fn answered(&mut self, response: &FetchResponse) {
        if response.error_code != 0 || response.session_id == 0 {
            *self = FetchSession::default();
        } else if self.id == response.session_id {
            self.epoch = next_epoch(self.epoch);
        } else {
            self.id = response.session_id;
            self.epoch = 1;
        }
    }
}

/// Kafka's `FetchMetadata.nextEpoch` for an open session.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl ReplicaConnection for Connection {
    fn fetch<'a>(&'a mut self, request: &'a FollowerFetch) -> TransportFuture<'a, Result<LeaderAnswer, String>> {
        Box::pin(async move {
            self.correlation_id = self.correlation_id.wrapping_add(1);
            let client_id = format!("weir-replica-fetcher-{}", request.replica);
            let fetch = self.session.request(request);
            // A response holds at most the request's bytes plus per-partition overhead.
            let max = request.max_bytes.max(0).saturating_mul(2).saturating_add(1 << 20);
            let exchanged =
                exchange(&mut self.stream, &client_id, self.correlation_id, ApiKey::Fetch, FETCH_VERSION, &fetch, max);
            let response: FetchResponse = match exchanged.await {
                Ok(response) => response,
                Err(e) => {
                    // The connection is dropped, and its session with it.
                    self.session = FetchSession::default();
                    return Err(e);
                }
            };
            self.session.answered(&response);
            Ok(answer_of(response))
        })
    }
}

/// The Fetch request of `fetch` naming `partitions`, in session `session_id` at `epoch`.
fn fetch_request(fetch: &FollowerFetch, partitions: &[&FetchFrom], session_id: i32, epoch: i32) -> FetchRequest {
    let mut topics: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
    for from in partitions {
        topics.entry(from.topic.as_str()).or_default().push(
            FetchPartition::default()
                .with_partition(from.partition)
                .with_current_leader_epoch(from.current_leader_epoch)
                .with_fetch_offset(from.fetch_offset)
                .with_last_fetched_epoch(from.last_fetched_epoch.unwrap_or(-1))
                .with_log_start_offset(from.log_start_offset)
                .with_partition_max_bytes(from.max_bytes),
        );
    }
    let topics = topics
        .into_iter()
        .map(|(name, partitions)| {
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(name.to_string())))
                .with_partitions(partitions)
        })
        .collect();
    FetchRequest::default()
        .with_replica_id(BrokerId(fetch.replica))
        .with_replica_state(ReplicaState::default().with_replica_id(BrokerId(fetch.replica)))
        .with_max_wait_ms(fetch.max_wait_ms.min(i32::MAX as u64) as i32)
        .with_min_bytes(1)
        .with_max_bytes(fetch.max_bytes)
        .with_isolation_level(0)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

/// The core's view of a Fetch response.
fn answer_of(response: FetchResponse) -> LeaderAnswer {
    let refused = (response.error_code != 0).then(|| crate::errors::error_name(i32::from(response.error_code)));
    let partitions = response
        .responses
        .into_iter()
        .flat_map(|topic| {
            let name = topic.topic.to_string();
            topic.partitions.into_iter().map(move |data| {
                let error = match ResponseError::try_from_code(data.error_code) {
                    None => None,
                    Some(ResponseError::OffsetOutOfRange) => Some(LeaderError::OffsetOutOfRange),
                    Some(ResponseError::OffsetMovedToTieredStorage) => Some(LeaderError::MovedToTieredStorage),
                    Some(other) => Some(LeaderError::Other(format!("{other:?}"))),
                };
                let diverging = &data.diverging_epoch;
                LeaderPartition {
                    topic: name.clone(),
                    partition: data.partition_index,
                    error,
                    // Kafka's -1: the leader does not say.
                    high_watermark: (data.high_watermark >= 0).then_some(data.high_watermark),
                    log_start_offset: (data.log_start_offset >= 0).then_some(data.log_start_offset),
                    diverging: (diverging.epoch >= 0 || diverging.end_offset >= 0).then_some(DivergingEpoch {
                        epoch: (diverging.epoch >= 0).then_some(diverging.epoch),
                        end_offset: diverging.end_offset,
                    }),
                    records: data.records.unwrap_or_default(),
                }
            })
        })
        .collect();
    LeaderAnswer { refused, partitions }
}

/// Writes one request frame and reads its response (at most `response_max_bytes`).
async fn exchange<Req: Encodable, Resp: Decodable>(
    stream: &mut Box<dyn Stream>,
    client_id: &str,
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    request: &Req,
    response_max_bytes: i32,
) -> Result<Resp, String> {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut body = BytesMut::new();
    header.encode(&mut body, api_key.request_header_version(version)).map_err(|e| e.to_string())?;
    request.encode(&mut body, version).map_err(|e| e.to_string())?;
    let mut frame = BytesMut::with_capacity(body.len() + 4);
    frame.put_i32(body.len() as i32);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;

    let size = stream.read_i32().await.map_err(|e| e.to_string())?;
    if size < 0 || size > response_max_bytes {
        return Err(format!("response frame of {size} bytes"));
    }
    let mut buf = vec![0u8; size as usize];
    stream.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    let mut buf = Bytes::from(buf);
    let header =
        ResponseHeader::decode(&mut buf, api_key.response_header_version(version)).map_err(|e| e.to_string())?;
    if header.correlation_id != correlation_id {
        return Err(format!("correlation id {} in answer to {correlation_id}", header.correlation_id));
    }
    let response = Resp::decode(&mut buf, version).map_err(|e| e.to_string())?;
    if buf.has_remaining() {
        tracing::debug!(left = buf.remaining(), ?api_key, "replica fetcher: bytes after the response");
    }
    Ok(response)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn from(topic: &str, partition: i32, fetch_offset: i64) -> FetchFrom {
        FetchFrom {
            topic: topic.into(),
            partition,
            current_leader_epoch: 0,
            fetch_offset,
            last_fetched_epoch: None,
            log_start_offset: 0,
            max_bytes: 1024,
        }
    }

    fn fetch(partitions: Vec<FetchFrom>) -> FollowerFetch {
        FollowerFetch {
            replica: 2,
            max_wait_ms: 500,
            max_bytes: 1 << 20,
            partitions,
            generation: 0,
            touched: None,
            retry: Vec::new(),
        }
    }

    fn named(request: &FetchRequest) -> Vec<(String, i32, i64)> {
        let mut out: Vec<(String, i32, i64)> = request
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.to_string(), p.partition, p.fetch_offset)))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_follower_names_only_changed_partitions_once_a_session_is_open() {
        let mut session = FetchSession::default();
        let all = fetch(vec![from("a", 0, 5), from("a", 1, 0), from("b", 0, 9)]);
        let first = session.request(&all);
        assert_eq!((first.session_id, first.session_epoch), (0, 0), "no session yet: a full fetch opens one");
        assert_eq!(named(&first).len(), 3);
        session.answered(&FetchResponse::default().with_session_id(77));
        let idle = session.request(&all);
        assert_eq!((idle.session_id, idle.session_epoch), (77, 1));
        assert!(named(&idle).is_empty(), "nothing changed: nothing named");
        session.answered(&FetchResponse::default().with_session_id(77));
        let moved = session.request(&fetch(vec![from("a", 0, 8), from("b", 0, 9)]));
        assert_eq!(moved.session_epoch, 2);
        assert_eq!(named(&moved), vec![("a".to_string(), 0, 8)]);
        let forgotten: Vec<(String, Vec<i32>)> =
            moved.forgotten_topics_data.iter().map(|t| (t.topic.to_string(), t.partitions.clone())).collect();
        assert_eq!(forgotten, vec![("a".to_string(), vec![1])]);
        // The leader lost the session: the next fetch is a full one again.
        session.answered(&FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code()));
        let again = session.request(&fetch(vec![from("a", 0, 8), from("b", 0, 9)]));
        assert_eq!((again.session_id, again.session_epoch), (0, 0));
        assert_eq!(named(&again).len(), 2);
    }

    #[test]
    fn with_the_same_list_only_the_touched_partitions_are_compared() {
        let mut session = FetchSession::default();
        let mut list = fetch(vec![from("a", 0, 5), from("a", 1, 0)]);
        list.generation = 1;
        session.request(&list);
        session.answered(&FetchResponse::default().with_session_id(9));
        list.partitions[1].fetch_offset = 3;
        list.touched = Some(vec![1]);
        assert_eq!(named(&session.request(&list)), vec![("a".to_string(), 1, 3)]);
        session.answered(&FetchResponse::default().with_session_id(9));
        list.touched = Some(Vec::new());
        assert!(named(&session.request(&list)).is_empty(), "an idle round names nothing");
        // A new list is compared whole.
        list.generation = 2;
        list.touched = None;
        list.partitions[0].fetch_offset = 6;
        session.answered(&FetchResponse::default().with_session_id(9));
        assert_eq!(named(&session.request(&list)), vec![("a".to_string(), 0, 6)]);
    }

    #[test]
    fn a_partition_whose_answer_was_not_applied_is_named_again_unchanged() {
        let mut session = FetchSession::default();
        let mut list = fetch(vec![from("a", 0, 5), from("a", 1, 7)]);
        list.generation = 1;
        session.request(&list);
        session.answered(&FetchResponse::default().with_session_id(9));
        // The leader answered both; the follower could not apply partition 1's answer.
        list.touched = Some(vec![0, 1]);
        list.retry = vec![1];
        assert_eq!(
            named(&session.request(&list)),
            vec![("a".to_string(), 1, 7)],
            "named at the same position, so that the leader reads it again"
        );
        session.answered(&FetchResponse::default().with_session_id(9));
        list.retry.clear();
        assert!(named(&session.request(&list)).is_empty(), "applied: nothing to name");
    }
}
