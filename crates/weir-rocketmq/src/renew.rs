//! Renewing the invisible time of push consumers' messages, as RocketMQ 5's proxy does.
//!
//! A push consumer's receive asks the server to renew (`auto_renew`): the client holds each
//! message until its listener returns, however long that takes, and acks it or changes its
//! invisible duration (a failure, with the group's back-off) then. Weir hands such a message
//! out for a slice ([`DEFAULT_SLICE`], or the receive's own invisible duration) and, while the
//! client that received it is alive, moves its deadline one slice on shortly before it runs
//! out, keeping its receipt handle valid. Renewal stops when the message is acked or its
//! invisible duration changed, when the client says it terminates or stops heartbeating for
//! [`CLIENT_SILENCE`], and after [`MAX_RENEWAL`] in all: then the message comes back after its
//! current slice, as any unacked one. Renewals live in memory: after a restart, a message held
//! by a client comes back when its last slice ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use weir_broker::pop::{PopStore, QueueKey, QueueState};
use weir_broker::storage::sync::lock;
use weir_broker::Broker;

/// The invisible time a push consumer's message is handed out for, and renewed by.
pub const DEFAULT_SLICE: Duration = Duration::from_secs(60);
/// A client not heard from (any call naming its client id) for this long is gone.
pub const CLIENT_SILENCE: Duration = Duration::from_secs(60);
/// The longest a message is renewed for (RocketMQ's proxy stops after 3 hours).
pub const MAX_RENEWAL: Duration = Duration::from_secs(3 * 3600);
/// How often the renewer looks.
const TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
struct Renewal {
    client: String,
    nonce: u64,
    slice_ms: i64,
    since_ms: i64,
}

/// The messages being renewed, and when each client was last heard from.
#[derive(Debug, Default)]
pub struct Renewals {
    held: Mutex<HashMap<(QueueKey, i64), Renewal>>,
    clients: Mutex<HashMap<String, i64>>,
}

impl Renewals {
    /// The client `client` made a call at `now_ms`.
    pub fn heard_from(&self, client: &str, now_ms: i64) {
        if !client.is_empty() {
            lock(&self.clients).insert(client.to_string(), now_ms);
        }
    }

    /// The client `client` terminated: its messages are renewed no more.
    pub fn client_gone(&self, client: &str) {
        lock(&self.clients).remove(client);
        lock(&self.held).retain(|_, r| r.client != client);
    }

    /// Renew the message at `offset` of `key`, delivered with `nonce` to `client`.
    pub fn hold(&self, key: &QueueKey, offset: i64, nonce: u64, client: &str, slice: Duration, now_ms: i64) {
        if client.is_empty() {
            return; // a client without an id cannot be told apart, nor followed
        }
        let renewal =
            Renewal { client: client.to_string(), nonce, slice_ms: slice.as_millis() as i64, since_ms: now_ms };
        lock(&self.held).insert((key.clone(), offset), renewal);
    }

    /// The message was acked or its invisible time changed by its client: stop renewing it.
    pub fn release(&self, key: &QueueKey, offset: i64) {
        lock(&self.held).remove(&(key.clone(), offset));
    }

    /// How many messages are being renewed.
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One round: renews what is about to become visible, drops what should be renewed no
    /// more. Blocking (writes the invisible-time journal).
    fn renew_due(&self, store: &PopStore, now_ms: i64) {
        let alive = |client: &str| {
            lock(&self.clients).get(client).is_some_and(|seen| now_ms - seen <= CLIENT_SILENCE.as_millis() as i64)
        };
        let held: Vec<((QueueKey, i64), Renewal)> =
            lock(&self.held).iter().map(|(k, r)| (k.clone(), r.clone())).collect();
        for ((key, offset), renewal) in held {
            let expired = now_ms - renewal.since_ms > MAX_RENEWAL.as_millis() as i64;
            if expired || !alive(&renewal.client) {
                self.release(&key, offset);
                continue;
            }
            // Renew once less than a third of the slice (at most 10 s) is left.
            let ahead = (renewal.slice_ms / 3).min(10_000);
            let due = |q: &QueueState| {
                q.inflight.get(&offset).filter(|i| i.nonce == renewal.nonce).map(|i| i.visible_at_ms - now_ms < ahead)
            };
            let Some(state) = store.get(&key) else {
                self.release(&key, offset);
                continue;
            };
            match due(&state) {
                None => self.release(&key, offset), // acked, changed, or redelivered meanwhile
                Some(false) => {}
                Some(true) => {
                    let visible_at = now_ms + renewal.slice_ms;
                    let renewed = store.update(
                        &key,
                        || QueueState::starting_at(0),
                        |q| q.change_invisible(offset, renewal.nonce, visible_at, renewal.nonce),
                    );
                    if !matches!(renewed, Ok(Ok(_))) {
                        self.release(&key, offset);
                    }
                }
            }
        }
    }

    /// Starts the renewer; it ends when the broker shuts down or the renewals are dropped.
    pub fn start(self: &Arc<Self>, broker: &Arc<Broker>, store: &Arc<PopStore>) {
        let (renewals, broker, store) = (Arc::downgrade(self), Arc::downgrade(broker), Arc::downgrade(store));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Some(renewals), Some(broker), Some(store)) =
                    (Weak::upgrade(&renewals), Weak::upgrade(&broker), Weak::upgrade(&store))
                else {
                    return;
                };
                if *broker.shutdown_signal().borrow() {
                    return;
                }
                if renewals.is_empty() {
                    continue;
                }
                let now = broker.now_ms();
                let _ = tokio::task::spawn_blocking(move || renewals.renew_due(&store, now)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> QueueKey {
        QueueKey::new("g", "t", 0)
    }

    #[test]
    fn a_held_message_is_renewed_while_its_client_lives_and_released_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = PopStore::open(dir.path()).unwrap();
        store.update(&key(), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(0, 2_000, 7))).unwrap().unwrap();
        let renewals = Renewals::default();
        renewals.heard_from("c1", 0);
        renewals.hold(&key(), 0, 7, "c1", Duration::from_secs(2), 0);

        renewals.renew_due(&store, 1_000); // 1 s left of 2: not yet
        assert_eq!(store.get(&key()).unwrap().inflight[&0].visible_at_ms, 2_000);
        renewals.renew_due(&store, 1_500); // under a third left: one slice more, same handle
        let inflight = store.get(&key()).unwrap().inflight[&0];
        assert_eq!((inflight.visible_at_ms, inflight.nonce), (3_500, 7));

        renewals.client_gone("c1");
        assert!(renewals.is_empty());
        renewals.heard_from("c2", 3_000);
        renewals.hold(&key(), 0, 7, "c2", Duration::from_secs(2), 3_000);
        renewals.renew_due(&store, 3_000 + CLIENT_SILENCE.as_millis() as i64 + 1);
        assert!(renewals.is_empty(), "a silent client's messages are released");

        renewals.heard_from("c3", 4_000);
        renewals.hold(&key(), 0, 8, "c3", Duration::from_secs(2), 4_000);
        renewals.renew_due(&store, 4_000);
        assert!(renewals.is_empty(), "a handle that is not the one in flight is released");
    }
}
