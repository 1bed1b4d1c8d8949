//! The broker's errors. Kafka's error codes are the broker's vocabulary: every failure a client
//! can see is one [`ErrorCode`] plus a readable message; the Kafka front-end sends both as they
//! are, other front-ends map the code to their own.

use weir_storage::{BatchError, ProducerError, StorageError};

pub use kafka_protocol::ResponseError as ErrorCode;

#[derive(Debug, Clone)]
pub struct BrokerError {
    pub code: ErrorCode,
    pub message: String,
}

impl BrokerError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> BrokerError {
        BrokerError { code, message: message.into() }
    }

    pub fn unknown_topic(topic: &str, partition: i32) -> BrokerError {
        BrokerError::new(ErrorCode::UnknownTopicOrPartition, format!("This server does not host {topic}-{partition}."))
    }
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for BrokerError {}

impl From<StorageError> for BrokerError {
    fn from(e: StorageError) -> BrokerError {
        let code = match &e {
            StorageError::Batch(BatchError::Corrupt(_)) => ErrorCode::CorruptMessage,
            StorageError::Batch(BatchError::Invalid(_)) => ErrorCode::InvalidRecord,
            StorageError::Batch(BatchError::TooLarge { .. }) => ErrorCode::MessageTooLarge,
            StorageError::Batch(BatchError::UnsupportedMagic(_)) => ErrorCode::UnsupportedForMessageFormat,
            StorageError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            StorageError::InvalidConfig { .. } => ErrorCode::InvalidConfig,
            StorageError::InvalidArgument(_) => ErrorCode::InvalidRequest,
            StorageError::Closed(_) => ErrorCode::NotLeaderOrFollower,
            StorageError::Producer(p) => match p {
                ProducerError::OutOfOrderSequence(_) => ErrorCode::OutOfOrderSequenceNumber,
                ProducerError::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
                ProducerError::UnknownProducerId(_) => ErrorCode::UnknownProducerId,
                ProducerError::Invalid(_) => ErrorCode::InvalidRecord,
            },
            StorageError::CorruptSegment { .. } | StorageError::DirectoryLocked(_) | StorageError::Io { .. } => {
                ErrorCode::KafkaStorageError
            }
        };
        BrokerError { code, message: e.to_string() }
    }
}
