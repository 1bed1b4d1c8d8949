//! Waiting for async work from the broker's blocking code.
//!
//! The control operations (create topics, allocate producer ids, ...) and the coordinators'
//! start-up are blocking code, run on `spawn_blocking` threads or, in tests, on the worker
//! threads of a multi-threaded runtime; they wait for the metadata quorum, which is async.

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::error::BrokerError;

/// Runs `future` to completion from blocking code within a multi-threaded tokio runtime (on a
/// worker thread, through `block_in_place`, so the other tasks keep running).
pub fn block_on<F: Future>(future: F) -> Result<F::Output, BrokerError> {
    let handle = Handle::try_current()
        .map_err(|_| BrokerError::internal("the broker's control operations must run within a tokio runtime"))?;
    if handle.runtime_flavor() == RuntimeFlavor::CurrentThread {
        return Err(BrokerError::internal("the broker's control operations need a multi-threaded tokio runtime"));
    }
    Ok(tokio::task::block_in_place(|| handle.block_on(future)))
}
