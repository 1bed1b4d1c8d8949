//! Where the append path hands the records of a DELAY topic that are not due yet.
//!
//! The timer that keeps them until they are due is the messaging layer's (`weir-messaging`),
//! which installs itself with [`Broker::set_delayed_records`](crate::Broker::set_delayed_records)
//! when it opens; the data path knows only this trait, so it never depends on the layer above.

use std::future::Future;
use std::pin::Pin;

use bytes::BytesMut;

use crate::error::BrokerError;
use crate::partition::Partition;

/// What [`DelayedRecords::divert`] returns.
pub type Diverted<'a> = Pin<Box<dyn Future<Output = Result<Option<BytesMut>, BrokerError>> + Send + 'a>>;

/// Keeps delayed records until they are due.
pub trait DelayedRecords: Send + Sync {
    /// Takes the records of `records` (a producer's batches for `partition`, a DELAY topic that
    /// accepts delays up to `max_delay_ms`) whose delivery time is still to come; returns the
    /// batches of the others, to append now (`None`: there are none). Once this answers `Ok`,
    /// the taken records are durable and will be appended when due.
    fn divert<'a>(&'a self, partition: &'a Partition, records: BytesMut, max_delay_ms: i64) -> Diverted<'a>;
}
