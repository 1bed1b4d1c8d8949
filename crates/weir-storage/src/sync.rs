//! Locks that keep working after a panic elsewhere.
//!
//! A thread that panics while holding a std lock poisons it. Every lock in Weir guards state
//! that a panic cannot leave half-changed in a way the next holder could not live with (the
//! panicking operation's result is lost, the state it guards is valid), and a broker that stops
//! serving every partition because one request panicked would turn one bug into an outage. So
//! poisoning is ignored, in one place.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}
