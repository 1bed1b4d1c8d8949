//! Prometheus metrics of the broker. (Being written: see issue 4.)

use crate::group::GroupCoordinator;
use crate::Broker;

/// The Prometheus text exposition of every metric.
pub fn render_prometheus(_broker: &Broker, _groups: &GroupCoordinator) -> String {
    String::new()
}
