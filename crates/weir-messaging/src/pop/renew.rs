//! Renewing the invisible time of messages a client holds, as RocketMQ 5's proxy does for push
//! consumers.
//!
//! A push consumer's receive asks the server to renew: the client holds each message until its
//! listener returns, however long that takes, and acks it or changes its invisible duration (a
//! failure, with the group's back-off) then. Such a message is handed out for a slice
//! ([`DEFAULT_SLICE`], or the receive's own invisible duration) and, while the client that
//! received it is alive ([`ConnectedClients::is_alive`]), its deadline moves one slice on
//! shortly before it runs out, keeping its receipt valid. Renewal stops when the message is
//! acked or its invisible duration changed, when the client says it terminates or stops calling
//! for [`CALLER_SILENCE_MS_MAX`](weir_coordinators::group::clients::CALLER_SILENCE_MS_MAX), and after
//! `MAX_RENEWAL` in all: then the message comes back after its current slice, as any unacked
//! one. Renewals live in memory: after a restart, a message held by a client comes back when
//! its last slice ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use weir_storage::sync::lock;

use crate::pop::{PopStore, QueueKey, QueueState};
use crate::Messaging;
use weir_coordinators::group::clients::ConnectedClients;
use weir_coordinators::group::GroupCoordinator;

/// The invisible time a held message is handed out for, and renewed by, when the receive
/// names none.
pub const DEFAULT_SLICE: Duration = Duration::from_secs(60);
/// The longest a message is renewed for (RocketMQ's proxy stops after 3 hours).
pub(crate) const MAX_RENEWAL: Duration = Duration::from_secs(3 * 3600);
/// How often the renewer looks.
const TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
struct Renewal {
    client: String,
    nonce: u64,
    slice_ms: i64,
    since_ms: i64,
}

/// The messages being renewed, by queue and offset.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    held: Mutex<HashMap<(QueueKey, i64), Renewal>>,
}

impl Renewals {
    /// Renew the message at `offset` of `key`, delivered with `nonce` to `client`.
    pub fn hold(&self, key: &QueueKey, offset: i64, nonce: u64, client: &str, slice: Duration, now_ms: i64) {
        if client.is_empty() {
            return; // a client without an id cannot be told apart, nor followed
        }
        let renewal =
            Renewal { client: client.to_string(), nonce, slice_ms: slice.as_millis() as i64, since_ms: now_ms };
        lock(&self.held).insert((key.clone(), offset), renewal);
    }

    /// The message was acked, dead-lettered or its invisible time changed by its client: stop
    /// renewing it.
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
    /// more. Blocking. A renewal is not waited for: one lost in a failover only makes its message
    /// visible at the end of the slice before.
    fn renew_due(&self, store: &PopStore, clients: &ConnectedClients, now_ms: i64) {
        let held: Vec<((QueueKey, i64), Renewal)> =
            lock(&self.held).iter().map(|(k, r)| (k.clone(), r.clone())).collect();
        for ((key, offset), renewal) in held {
            let expired = now_ms - renewal.since_ms > MAX_RENEWAL.as_millis() as i64;
            if expired || !clients.is_alive(&renewal.client, now_ms) {
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
                    if !matches!(renewed, Ok((Ok(_), _))) {
                        self.release(&key, offset);
                    }
                }
            }
        }
    }

    /// Starts the renewer; it ends when the broker shuts down or any of the three is dropped.
    pub(crate) fn start(self: &Arc<Self>, messaging: &Arc<Messaging>, groups: &Arc<GroupCoordinator>) {
        let (renewals, messaging, groups) = (Arc::downgrade(self), Arc::downgrade(messaging), Arc::downgrade(groups));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Some(renewals), Some(messaging), Some(groups)) =
                    (Weak::upgrade(&renewals), Weak::upgrade(&messaging), Weak::upgrade(&groups))
                else {
                    return;
                };
                if messaging.broker.is_shutting_down() {
                    return;
                }
                if renewals.is_empty() {
                    continue;
                }
                let now = messaging.broker.now_ms();
                let _ =
                    tokio::task::spawn_blocking(move || renewals.renew_due(&messaging.pop, &groups.clients, now)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_coordinators::group::clients::CALLER_SILENCE_MS_MAX;

    fn key() -> QueueKey {
        QueueKey::new("g", "t", 0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_message_is_renewed_while_its_client_lives_and_released_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_broker, messaging) = crate::testing::open_with_state_shards(dir.path(), "t").await;
        let store = &*messaging.pop;
        messaging.pop.load(&key()).await.expect("load");
        let (delivered, durable) = store
            .update(&key(), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(0, 2_000, 7)))
            .expect("update");
        assert!(delivered.is_ok());
        durable.wait().await.expect("durable");
        let renewals = Renewals::default();
        let clients = ConnectedClients::default();
        clients.called("c1", 0);
        renewals.hold(&key(), 0, 7, "c1", Duration::from_secs(2), 0);

        renewals.renew_due(store, &clients, 1_000); // 1 s left of 2: not yet
        assert_eq!(store.get(&key()).map(|q| q.inflight[&0].visible_at_ms), Some(2_000));
        renewals.renew_due(store, &clients, 1_500); // under a third left: one slice more, same handle
        let inflight = store.get(&key()).map(|q| q.inflight[&0]);
        assert_eq!(inflight.map(|i| (i.visible_at_ms, i.nonce)), Some((3_500, 7)));

        clients.gone("c1");
        renewals.renew_due(store, &clients, 1_600);
        assert!(renewals.is_empty(), "a client that said goodbye holds nothing");
        clients.called("c2", 3_000);
        renewals.hold(&key(), 0, 7, "c2", Duration::from_secs(2), 3_000);
        renewals.renew_due(store, &clients, 3_000 + CALLER_SILENCE_MS_MAX + 1);
        assert!(renewals.is_empty(), "a silent client's messages are released");

        clients.called("c3", 4_000);
        renewals.hold(&key(), 0, 8, "c3", Duration::from_secs(2), 4_000);
        renewals.renew_due(store, &clients, 4_000);
        assert!(renewals.is_empty(), "a handle that is not the one in flight is released");

        renewals.hold(&key(), 0, 7, "", Duration::from_secs(2), 4_000);
        assert!(renewals.is_empty(), "a client without an id cannot be followed");
    }
}
