//! Which messages of a queue a receive hands out, by tag: the others are skipped (done for the
//! group) without being sent.
//!
//! The split with the front-ends: a front-end parses its protocol's expression (RocketMQ's
//! `TagA || TagB` or `*`) into a [`TagFilter`]; matching a record is the core's, against the
//! `weir.tag` header ([`weir_broker::message::headers::TAG`]), so every protocol filters alike and
//! the message index's tag hashes serve them all.

use weir_storage::records::Record;

use weir_broker::message::headers;

/// Which tags a receive takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    /// Every message, tagged or not.
    All,
    /// Messages with one of these tags; untagged ones never match. Never empty, and no tag is
    /// empty ([`TagFilter::check`]): a front-end refuses such an expression instead.
    Tags(Vec<String>),
}

impl TagFilter {
    /// Whether `record`'s tag passes. Reads the tag header only.
    pub fn matches(&self, record: &Record) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags(tags) => record
                .header(headers::TAG)
                .and_then(|h| h.value.as_deref())
                .is_some_and(|tag| tags.iter().any(|t| t.as_bytes() == tag)),
        }
    }

    /// Asserts what a front-end promises when it builds a filter (debug builds).
    pub fn check(&self) {
        if let TagFilter::Tags(tags) = self {
            debug_assert!(!tags.is_empty(), "a tag filter that takes no tag");
            debug_assert!(tags.iter().all(|t| !t.is_empty()), "an empty tag in {tags:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use weir_storage::records::Header;

    fn tagged(tag: Option<&str>) -> Record {
        let mut record = Record::new(0, None, Some(Bytes::from_static(b"v")));
        if let Some(tag) = tag {
            record.headers.push(Header::new(headers::TAG, Some(Bytes::from(tag.to_string()))));
        }
        record
    }

    #[test]
    fn a_tag_filter_takes_its_tags_only_and_all_takes_everything() {
        let filter = TagFilter::Tags(vec!["TagA".into(), "TagB".into()]);
        assert!(filter.matches(&tagged(Some("TagA"))));
        assert!(filter.matches(&tagged(Some("TagB"))));
        assert!(!filter.matches(&tagged(Some("TagC"))));
        assert!(!filter.matches(&tagged(None)), "an untagged message never matches a tag");
        assert!(TagFilter::All.matches(&tagged(None)) && TagFilter::All.matches(&tagged(Some("x"))));
    }
}
