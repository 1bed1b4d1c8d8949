//! `weir bench ...`: measurements of Weir's components on this machine.

pub mod fetch;
pub mod kafka;
pub mod metadata;
pub mod produce;
pub mod raw_protocol;
pub mod replication;
pub mod rocketmq;
pub mod rocketmq_client;
pub mod storage;
pub mod timer;
pub mod transactions;
