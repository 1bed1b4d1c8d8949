//! This process's capacity for partition replicas, from its limits (see
//! `weir_controller::capacity`): read from `/proc` once, at the first decision that needs it.
//! A limit raised while the process runs (`prlimit`) counts after a restart.

use std::sync::OnceLock;

use weir_controller::capacity::ReplicaCapacity;
use weir_proc::Pid;

/// The replicas this broker can hold open under its `ulimit -n` and `vm.max_map_count`.
pub(crate) fn replica_capacity() -> Option<ReplicaCapacity> {
    static CAPACITY: OnceLock<Option<ReplicaCapacity>> = OnceLock::new();
    CAPACITY
        .get_or_init(|| ReplicaCapacity::of_limits(weir_proc::max_fds(Pid::SelfProcess), weir_proc::max_memory_maps()))
        .clone()
}
