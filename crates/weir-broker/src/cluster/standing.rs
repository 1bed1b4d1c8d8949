//! The broker's standing with the controller, as its last answers left it: whether it may lead,
//! and how long ago a heartbeat was acknowledged. The rounds that update it are
//! `lifecycle`'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weir_storage::sync::lock;

use crate::error::{BrokerError, ErrorKind};

/// The broker's own view of its standing with the controller.
pub(crate) struct Lifecycle {
    state: Mutex<Standing>,
    /// `!fenced` of the last answer, once there is one: read by every client append, so an
    /// atomic rather than the mutex. Written only together with `state`.
    may_lead: AtomicBool,
    /// A registration failed since the last one that succeeded, and the log said so: the
    /// log says it once, not every round (a majority of the controllers can be down for long).
    pub(super) registration_failing: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct Standing {
    /// As the controller last answered.
    fenced: bool,
    /// When the controller last acknowledged a heartbeat; `None` before the first.
    last_ack: Option<Instant>,
}

impl Lifecycle {
    pub(crate) fn new() -> Lifecycle {
        Lifecycle {
            state: Mutex::new(Standing { fenced: true, last_ack: None }),
            may_lead: AtomicBool::new(false),
            registration_failing: AtomicBool::new(false),
        }
    }

    pub(super) fn acknowledged(&self, fenced: bool) {
        let mut standing = lock(&self.state);
        standing.fenced = fenced;
        standing.last_ack = Some(Instant::now());
        self.may_lead.store(!fenced, Ordering::Release);
    }

    /// True while the broker may lead: the controller's last answer unfenced it.
    pub fn may_lead(&self) -> bool {
        self.may_lead.load(Ordering::Acquire)
    }

    /// How long ago the controller last acknowledged a heartbeat; `None` before the first.
    pub(crate) fn since_last_ack(&self) -> Option<Duration> {
        lock(&self.state).last_ack.map(|at| at.elapsed())
    }

    /// Ok while the broker may lead; the error a write gets otherwise.
    pub(crate) fn check_may_lead(&self, node_id: i32) -> Result<(), BrokerError> {
        if self.may_lead() {
            return Ok(());
        }
        Err(BrokerError::new(
            ErrorKind::NotLeader,
            format!("broker {node_id} is fenced (starting, catching up with the metadata, or shutting down)"),
        ))
    }
}
