//! Failed authentications per client address over the last minute, so that guessing passwords
//! (SASL) or secret keys (RocketMQ signatures) from one address is cut short
//! (`connection.failed.authentication.max.per.minute`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most (the expired windows are forgotten first past it).
const MAX_ADDRESSES: usize = 100_000;

#[derive(Debug, Default)]
pub struct FailedAttempts {
    by_address: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl FailedAttempts {
    /// Has `peer` failed `limit` times or more within its current minute?
    pub fn over_limit(&self, peer: IpAddr, limit: u32) -> bool {
        let map = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&peer).is_some_and(|(since, count)| since.elapsed() < WINDOW && *count >= limit)
    }

    /// Counts one failure of `peer`.
    pub fn record(&self, peer: IpAddr) {
        let mut map = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, (since, _)| since.elapsed() < WINDOW);
        }
        let entry = map.entry(peer).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_over_the_limit_after_that_many_failures() {
        let attempts = FailedAttempts::default();
        let peer: IpAddr = [10, 0, 0, 1].into();
        for _ in 0..3 {
            assert!(!attempts.over_limit(peer, 3));
            attempts.record(peer);
        }
        assert!(attempts.over_limit(peer, 3));
        assert!(!attempts.over_limit([10, 0, 0, 2].into(), 3), "another address");
    }
}
