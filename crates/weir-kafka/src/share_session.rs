//! Share sessions (KIP-932): which partitions a share consumer fetches from, kept between its
//! ShareFetch requests, and the session epoch that orders them. Kafka protocol state, like the
//! incremental fetch sessions of `fetch_session`: the records themselves, their locks and
//! delivery counts are the invisible-time engine's.
//!
//! Epochs: a request with epoch 0 opens a session (replacing the member's earlier one) with the
//! partitions it names; each later request must carry the session's next epoch (1, 2, ...; after
//! `i32::MAX` comes 1 again) and may add partitions or forget some; epoch -1 closes the session
//! after its acknowledgements. A request for a session that does not exist gets
//! SHARE_SESSION_NOT_FOUND, one with another epoch INVALID_SHARE_SESSION_EPOCH.
//!
//! A session belongs to the connection that last used it: when that connection closes (the
//! consumer died or went away without its final epoch) the session closes with it, and what
//! the member held is released at once, as Kafka's share session cache does on a disconnect,
//! instead of waiting for the record locks to run out.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;
use weir_storage::sync::lock;

/// Epoch of a request that opens a session; of one that closes it.
pub(crate) const INITIAL_EPOCH: i32 = 0;
pub(crate) const FINAL_EPOCH: i32 = -1;

/// Most share sessions kept (Kafka's `group.share.max.share.sessions` default).
const SESSIONS_MAX: usize = 2000;
/// Most partitions one share session fetches from: a bound on the receives of one request.
const SESSION_PARTITIONS_MAX: usize = 10_000;
/// A session unused this long may be evicted to make room for a new one.
const IDLE_EVICTABLE: Duration = Duration::from_secs(120);

/// Why a share session refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionError {
    NotFound,
    InvalidEpoch,
    LimitReached,
    /// More than [`SESSION_PARTITIONS_MAX`] partitions.
    TooManyPartitions,
}

struct Session {
    /// The epoch the next request must carry.
    next_epoch: i32,
    partitions: BTreeSet<(Uuid, i32)>,
    used: Instant,
    /// The connection of the last request that used the session.
    connection: u64,
}

/// A session closed with its connection: whose it was, and the partitions it had.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OrphanedSession {
    pub(crate) group: String,
    pub(crate) member: String,
    pub(crate) partitions: Vec<(Uuid, i32)>,
}

/// Every share session of this broker, by (group, member).
#[derive(Default)]
pub(crate) struct ShareSessions(Mutex<HashMap<(String, String), Session>>);

fn next(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl ShareSessions {
    /// Applies one request's session part, made on `connection`: opens, checks and advances,
    /// or closes the session of (`group`, `member`), adding `added` and dropping `forgotten`.
    /// Returns the partitions to fetch from; for a closing request, the partitions the session
    /// had (whose records the member still holds are released).
    pub(crate) fn advance(
        &self,
        connection: u64,
        group: &str,
        member: &str,
        epoch: i32,
        added: &[(Uuid, i32)],
        forgotten: &[(Uuid, i32)],
    ) -> Result<Vec<(Uuid, i32)>, SessionError> {
        let mut sessions = lock(&self.0);
        let key = (group.to_string(), member.to_string());
        match epoch {
            INITIAL_EPOCH => {
                if !sessions.contains_key(&key) && sessions.len() >= SESSIONS_MAX {
                    let now = Instant::now();
                    sessions.retain(|_, s| now.duration_since(s.used) < IDLE_EVICTABLE);
                    if sessions.len() >= SESSIONS_MAX {
                        return Err(SessionError::LimitReached);
                    }
                }
                let partitions: BTreeSet<(Uuid, i32)> = added.iter().copied().collect();
                if partitions.len() > SESSION_PARTITIONS_MAX {
                    return Err(SessionError::TooManyPartitions);
                }
                let fetch = partitions.iter().copied().collect();
                sessions.insert(key, Session { next_epoch: 1, partitions, used: Instant::now(), connection });
                Ok(fetch)
            }
            FINAL_EPOCH => match sessions.remove(&key) {
                Some(session) => Ok(session.partitions.into_iter().collect()),
                None => Err(SessionError::NotFound),
            },
            _ => {
                let session = sessions.get_mut(&key).ok_or(SessionError::NotFound)?;
                if epoch != session.next_epoch {
                    return Err(SessionError::InvalidEpoch);
                }
                let mut partitions = session.partitions.clone();
                for p in forgotten {
                    partitions.remove(p);
                }
                partitions.extend(added.iter().copied());
                if partitions.len() > SESSION_PARTITIONS_MAX {
                    return Err(SessionError::TooManyPartitions);
                }
                session.partitions = partitions;
                session.next_epoch = next(epoch);
                session.used = Instant::now();
                session.connection = connection;
                Ok(session.partitions.iter().copied().collect())
            }
        }
    }

    /// Whether (`group`, `member`) has a session at `epoch` (a ShareAcknowledge, which must
    /// belong to an open session), advancing it; closing it for the final epoch, then with the
    /// partitions it had.
    pub(crate) fn acknowledge(
        &self,
        connection: u64,
        group: &str,
        member: &str,
        epoch: i32,
    ) -> Result<Vec<(Uuid, i32)>, SessionError> {
        if epoch == INITIAL_EPOCH {
            return Err(SessionError::InvalidEpoch);
        }
        let partitions = self.advance(connection, group, member, epoch, &[], &[])?;
        Ok(if epoch == FINAL_EPOCH { partitions } else { Vec::new() })
    }

    /// Closes the sessions whose last request came on `connection`, now closed; returns them.
    pub(crate) fn connection_closed(&self, connection: u64) -> Vec<OrphanedSession> {
        let mut sessions = lock(&self.0);
        let orphaned: Vec<(String, String)> =
            sessions.iter().filter(|(_, s)| s.connection == connection).map(|(key, _)| key.clone()).collect();
        orphaned
            .into_iter()
            .filter_map(|key| {
                let session = sessions.remove(&key)?;
                let (group, member) = key;
                Some(OrphanedSession { group, member, partitions: session.partitions.into_iter().collect() })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_session_when_requests_come_in_order_they_are_served_and_others_refused() {
        let sessions = ShareSessions::default();
        let (t, u) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert_eq!(sessions.advance(7, "g", "m", 1, &[], &[]), Err(SessionError::NotFound));
        assert_eq!(sessions.advance(7, "g", "m", 0, &[(t, 0)], &[]), Ok(vec![(t, 0)]));
        assert_eq!(sessions.advance(7, "g", "m", 2, &[], &[]), Err(SessionError::InvalidEpoch));
        assert_eq!(sessions.advance(7, "g", "m", 1, &[(u, 1)], &[]), Ok(vec![(t, 0), (u, 1)]));
        assert_eq!(sessions.acknowledge(7, "g", "m", 2), Ok(vec![]));
        assert_eq!(sessions.advance(7, "g", "m", 3, &[], &[(t, 0)]), Ok(vec![(u, 1)]));
        assert_eq!(sessions.acknowledge(7, "g", "m", 0), Err(SessionError::InvalidEpoch));
        assert_eq!(sessions.advance(7, "g", "m", -1, &[], &[]), Ok(vec![(u, 1)]), "closed, with what it had");
        assert_eq!(sessions.advance(7, "g", "m", 4, &[], &[]), Err(SessionError::NotFound), "closed");
        assert_eq!(next(i32::MAX), 1);
    }

    #[test]
    fn given_sessions_when_a_connection_closes_only_the_sessions_it_last_served_close() {
        let sessions = ShareSessions::default();
        let t = Uuid::from_u128(1);
        sessions.advance(1, "g", "a", 0, &[(t, 0)], &[]).expect("opened");
        sessions.advance(1, "g", "b", 0, &[(t, 1)], &[]).expect("opened");
        // b's consumer reconnected: its session goes on on connection 2.
        sessions.advance(2, "g", "b", 1, &[], &[]).expect("advanced");
        let closed = sessions.connection_closed(1);
        assert_eq!(
            closed,
            [OrphanedSession { group: "g".into(), member: "a".into(), partitions: vec![(t, 0)] }],
            "only a's session was last used on connection 1"
        );
        assert_eq!(sessions.advance(3, "g", "a", 1, &[], &[]), Err(SessionError::NotFound), "a's closed");
        assert_eq!(sessions.advance(2, "g", "b", 2, &[], &[]), Ok(vec![(t, 1)]), "b's goes on");
        assert!(sessions.connection_closed(1).is_empty(), "nothing left on connection 1");
    }
}
