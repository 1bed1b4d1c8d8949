//! Producer ids come in blocks reserved in the metadata log, so an id is never handed out twice,
//! even across crashes (the ids of a block not used before a crash are skipped).

use weir_metadata::{MetadataRecord, MetadataState};

use crate::Decision;

/// How many producer ids one metadata record reserves.
pub(crate) const PRODUCER_ID_BLOCK: i64 = 1000;

/// Decides the next block of producer ids (for whichever broker asked): the answer is the first
/// id of the block and how many it holds.
pub fn decide_allocate(state: &MetadataState) -> Decision<(i64, i64)> {
    let first = state.next_producer_id;
    Decision {
        records: vec![MetadataRecord::AllocateProducerIds { first, count: PRODUCER_ID_BLOCK }],
        answer: (first, PRODUCER_ID_BLOCK),
    }
}
