//! What can go wrong in the tier.

/// A tier failure. A failed upload or delete is retried at the next pass; nothing a producer
/// waits on fails because of it.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A setting that cannot work; names the setting.
    #[error("invalid {name} {value:?}: {reason}")]
    Config { name: String, value: String, reason: String },
    /// The object store refused or could not be reached.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// Reading the local files of a segment failed.
    #[error("local segment files: {0}")]
    Local(#[from] weir_storage::StorageError),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// A segment's local files went away (retention) while it was being copied: the next pass
    /// plans again.
    #[error("segment at offset {0} was deleted locally while it was being uploaded")]
    SegmentGone(i64),
    /// A read of an offset the store does not hold (below its first segment, or in a gap).
    #[error("offset {0} is not in the object store")]
    NotInStore(i64),
    /// An object that does not hold what its manifest says.
    #[error("corrupt object {key}: {reason}")]
    Corrupt { key: String, reason: String },
}
