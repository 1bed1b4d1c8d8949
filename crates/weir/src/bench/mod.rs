//! `weir bench ...`: measurements of Weir's components on this machine.

pub mod fetch;
pub mod storage;
