//! The consumers of a group that receive by invisible time (RocketMQ's SimpleConsumer and
//! PushConsumer) rather than join the group protocol: connected clients, known by what they say
//! (heartbeats, subscriptions, receives) and forgotten when they say goodbye or fall silent.
//!
//! They are not members in the group protocol's sense: nothing is assigned to them (every one
//! receives from every queue of its topics), and they take no part in rebalances. What they are
//! for is showing who consumes: `weir group describe` lists them beside the group protocol's
//! members. Each broker knows the clients that talk to it; in a cluster the admin API asks every
//! broker and merges.
//!
//! The same registry says whether a client is alive at all ([`ConnectedClients::is_alive`]),
//! from any call naming its client id, producers' too: the invisible-time engine renews a push
//! consumer's messages only while it is (`pop::renew`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use weir_storage::sync::lock;

/// A client not heard from for this long is gone. RocketMQ clients heartbeat every 10 s, so
/// this is three heartbeats missed.
pub(crate) const CLIENT_SILENCE_MS_MAX: i64 = 30_000;

/// A client not heard from in any call for this long is gone for what it holds: the renewal of
/// its messages stops and they come back to the group. Longer than `CLIENT_SILENCE_MS_MAX`: a
/// consumer busy with a slow message must not lose it to a missed heartbeat or two (RocketMQ's
/// proxy waits as long).
pub const CALLER_SILENCE_MS_MAX: i64 = 60_000;

/// Most clients one broker remembers, as consumers and as callers each; past it, the longest
/// silent one is forgotten first. A bound on what misbehaving clients can make the broker keep.
pub(crate) const CLIENTS_MAX: usize = 65_536;

/// What kind of consumer a client says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ClientKind {
    SimpleConsumer,
    PushConsumer,
    PullConsumer,
    /// Not said yet (known only from a receive).
    Consumer,
}

impl ClientKind {
    /// The name `weir group describe` shows: RocketMQ's client type.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientKind::SimpleConsumer => "SimpleConsumer",
            ClientKind::PushConsumer => "PushConsumer",
            ClientKind::PullConsumer => "PullConsumer",
            ClientKind::Consumer => "Consumer",
        }
    }
}

/// One connected consumer of a group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectedClient {
    pub client_id: String,
    /// Where it connects from (`ip:port`), as the broker saw it; empty when unknown.
    pub host: String,
    pub kind: ClientKind,
    /// The topics it subscribes to or received from.
    pub topics: BTreeSet<String>,
    /// Its subscription as it said it: topic → filter expression (`*`, `TagA || TagB`, or a
    /// SQL92 expression), what `mqadmin consumerConnection` lists. Empty until it says.
    #[serde(default)]
    pub subscriptions: BTreeMap<String, String>,
    /// The client's language and version (its user agent), empty until it says.
    #[serde(default)]
    pub language: String,
    #[serde(default)]
    pub version: String,
    pub last_heard_ms: i64,
}

/// What a client said about itself in one call; `None` fields say nothing new.
#[derive(Debug, Clone, Default)]
pub struct Heard<'a> {
    pub host: Option<&'a str>,
    pub kind: Option<ClientKind>,
    /// Its whole subscription, (topic, filter expression) (replaces what was known), from its
    /// settings.
    pub subscription: Option<Vec<(String, String)>>,
    /// Its user agent: (language, version).
    pub agent: Option<(String, String)>,
    /// One topic it received from (added to what is known).
    pub topic: Option<&'a str>,
}

/// Every connected consumer this broker knows, by group and client id, and when each client
/// last called.
#[derive(Default)]
pub struct ConnectedClients {
    groups: Mutex<HashMap<String, BTreeMap<String, ConnectedClient>>>,
    /// Client id → when it last made any call (ms since the epoch); at most [`CLIENTS_MAX`].
    last_call_ms: Mutex<HashMap<String, i64>>,
}

impl ConnectedClients {
    /// Notes that `client_id`, a consumer of `group`, spoke at `now_ms`.
    pub fn heard(&self, group: &str, client_id: &str, now_ms: i64, said: Heard<'_>) {
        if group.is_empty() || client_id.is_empty() {
            return;
        }
        let mut groups = lock(&self.groups);
        let known = groups.get(group).is_some_and(|clients| clients.contains_key(client_id));
        if !known && groups.values().map(BTreeMap::len).sum::<usize>() >= CLIENTS_MAX {
            Self::forget_silent(&mut groups, now_ms);
            if groups.values().map(BTreeMap::len).sum::<usize>() >= CLIENTS_MAX {
                Self::forget_longest_silent(&mut groups);
            }
        }
        let client = groups.entry(group.to_string()).or_default().entry(client_id.to_string()).or_insert_with(|| {
            ConnectedClient {
                client_id: client_id.to_string(),
                host: String::new(),
                kind: ClientKind::Consumer,
                topics: BTreeSet::new(),
                subscriptions: BTreeMap::new(),
                language: String::new(),
                version: String::new(),
                last_heard_ms: now_ms,
            }
        });
        client.last_heard_ms = client.last_heard_ms.max(now_ms);
        if let Some(host) = said.host.filter(|h| !h.is_empty()) {
            client.host = host.to_string();
        }
        if let Some(kind) = said.kind {
            client.kind = kind;
        }
        if let Some(subscription) = said.subscription {
            client.topics = subscription.iter().map(|(topic, _)| topic.clone()).collect();
            client.subscriptions = subscription.into_iter().collect();
        }
        if let Some((language, version)) = said.agent {
            client.language = language;
            client.version = version;
        }
        if let Some(topic) = said.topic {
            if !client.topics.contains(topic) {
                client.topics.insert(topic.to_string());
            }
        }
    }

    /// `client_id` made a call at `now_ms` (any call: a producer's, an ack, a receive).
    pub fn called(&self, client_id: &str, now_ms: i64) {
        if client_id.is_empty() {
            return; // a client without an id cannot be told apart, nor followed
        }
        let mut calls = lock(&self.last_call_ms);
        if calls.len() >= CLIENTS_MAX && !calls.contains_key(client_id) {
            calls.retain(|_, last| now_ms - *last <= CALLER_SILENCE_MS_MAX);
            if calls.len() >= CLIENTS_MAX {
                let oldest = calls.iter().min_by_key(|(_, last)| **last).map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    calls.remove(&oldest);
                }
            }
        }
        let last = calls.entry(client_id.to_string()).or_insert(now_ms);
        *last = (*last).max(now_ms);
        debug_assert!(calls.len() <= CLIENTS_MAX, "{} callers remembered", calls.len());
    }

    /// Whether `client_id` called within [`CALLER_SILENCE_MS_MAX`] of `now_ms` and has not said
    /// goodbye since.
    pub fn is_alive(&self, client_id: &str, now_ms: i64) -> bool {
        lock(&self.last_call_ms).get(client_id).is_some_and(|last| now_ms - last <= CALLER_SILENCE_MS_MAX)
    }

    /// `client_id` said goodbye: it is no consumer of any group any more, nor alive.
    pub fn gone(&self, client_id: &str) {
        let mut groups = lock(&self.groups);
        groups.retain(|_, clients| {
            clients.remove(client_id);
            !clients.is_empty()
        });
        drop(groups);
        lock(&self.last_call_ms).remove(client_id);
    }

    /// The consumers of `group` heard from within `CLIENT_SILENCE_MS_MAX` of `now_ms`, by
    /// client id.
    pub fn of_group(&self, group: &str, now_ms: i64) -> Vec<ConnectedClient> {
        let mut groups = lock(&self.groups);
        Self::forget_silent(&mut groups, now_ms);
        groups.get(group).map(|clients| clients.values().cloned().collect()).unwrap_or_default()
    }

    /// The groups with a consumer heard from within `CLIENT_SILENCE_MS_MAX`, sorted.
    pub fn groups(&self, now_ms: i64) -> Vec<String> {
        let mut groups = lock(&self.groups);
        Self::forget_silent(&mut groups, now_ms);
        let mut names: Vec<String> = groups.keys().cloned().collect();
        names.sort();
        names
    }

    fn forget_silent(groups: &mut HashMap<String, BTreeMap<String, ConnectedClient>>, now_ms: i64) {
        groups.retain(|_, clients| {
            clients.retain(|_, c| now_ms - c.last_heard_ms <= CLIENT_SILENCE_MS_MAX);
            !clients.is_empty()
        });
    }

    fn forget_longest_silent(groups: &mut HashMap<String, BTreeMap<String, ConnectedClient>>) {
        let oldest = groups
            .iter()
            .flat_map(|(group, clients)| {
                clients.values().map(move |c| (c.last_heard_ms, group.clone(), c.client_id.clone()))
            })
            .min();
        if let Some((_, group, client)) = oldest {
            if let Some(clients) = groups.get_mut(&group) {
                clients.remove(&client);
                if clients.is_empty() {
                    groups.remove(&group);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_known_by_what_it_says_until_it_says_goodbye_or_falls_silent() {
        let clients = ConnectedClients::default();
        clients.heard("g", "c1", 1_000, Heard { kind: Some(ClientKind::SimpleConsumer), ..Heard::default() });
        clients.heard("g", "c1", 2_000, Heard { host: Some("10.0.0.1:5000"), topic: Some("t"), ..Heard::default() });
        let subscription = Some(vec![("a".into(), "*".into()), ("b".into(), "TagA || TagB".into())]);
        clients.heard("g", "c2", 2_000, Heard { subscription, ..Heard::default() });
        clients.heard("h", "c1", 2_000, Heard::default());
        let g = clients.of_group("g", 3_000);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].client_id.as_str(), g[0].host.as_str(), g[0].kind, g[0].topics.len(), g[0].last_heard_ms),
            ("c1", "10.0.0.1:5000", ClientKind::SimpleConsumer, 1, 2_000)
        );
        assert_eq!(g[1].topics.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(g[1].subscriptions["b"], "TagA || TagB", "the expression as the client said it");
        let agent = Some(("PYTHON".to_string(), "5.0.5".to_string()));
        clients.heard(
            "g",
            "c2",
            2_000,
            Heard { agent, subscription: Some(vec![("a".into(), "*".into())]), ..Heard::default() },
        );
        let g = clients.of_group("g", 3_000);
        assert_eq!((g[1].language.as_str(), g[1].version.as_str()), ("PYTHON", "5.0.5"));
        assert_eq!(g[1].subscriptions.keys().collect::<Vec<_>>(), ["a"], "a new subscription replaces the old");
        assert_eq!(g[1].topics.len(), 1);
        assert_eq!(clients.groups(3_000), ["g", "h"]);

        clients.gone("c1");
        assert_eq!(clients.of_group("g", 3_000).len(), 1);
        assert_eq!(clients.groups(3_000), ["g"], "h had only c1");
        // c2 falls silent.
        assert_eq!(clients.of_group("g", 2_000 + CLIENT_SILENCE_MS_MAX).len(), 1);
        assert!(clients.of_group("g", 2_001 + CLIENT_SILENCE_MS_MAX).is_empty());
        assert!(clients.groups(2_001 + CLIENT_SILENCE_MS_MAX).is_empty());
        // No group or client id: nothing to note.
        clients.heard("", "c3", 0, Heard::default());
        clients.heard("g", "", 0, Heard::default());
        assert!(clients.groups(0).is_empty());
    }

    #[test]
    fn a_caller_is_alive_until_it_falls_silent_or_says_goodbye() {
        let clients = ConnectedClients::default();
        clients.called("producer", 1_000);
        clients.called("producer", 500); // a late call does not move it back
        assert!(clients.is_alive("producer", 1_000 + CALLER_SILENCE_MS_MAX));
        assert!(!clients.is_alive("producer", 1_001 + CALLER_SILENCE_MS_MAX));
        assert!(clients.groups(1_000).is_empty(), "a call alone makes no consumer");
        clients.called("c1", 2_000);
        clients.gone("c1");
        assert!(!clients.is_alive("c1", 2_000));
        clients.called("", 2_000);
        assert!(!clients.is_alive("", 2_000));
    }

    #[test]
    fn callers_past_the_limit_forget_the_longest_silent_first() {
        let clients = ConnectedClients::default();
        clients.called("c0", 999);
        for i in 1..CLIENTS_MAX {
            clients.called(&format!("c{i}"), 1_000);
        }
        clients.called("new", 1_000);
        assert!(clients.is_alive("new", 1_000));
        assert!(!clients.is_alive("c0", 1_000), "the longest silent one is forgotten");
        assert!(clients.is_alive("c1", 1_000));
        assert_eq!(lock(&clients.last_call_ms).len(), CLIENTS_MAX);
    }
}
