//! Criterion benchmarks of the wire codec as the broker runs it: a request frame is checked and
//! decoded as `dispatch::route` does (`frame::peek_prefix`, the `versions` gate,
//! `frame::decode_header`, `frame::decode_body`), a Fetch response is encoded as the fetch
//! handler does (`frame::encode_response`, then `zero_copy::splice_files` for the record data).
//!
//! `cargo bench -p weir-kafka` (add `-- --quick` for a run of seconds, as CI does).

use std::fs::File;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, MetadataRequest, ProduceRequest, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use weir_kafka::{frame, versions, zero_copy};
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::FileSlice;

const PARTITIONS: i32 = 1000;

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// A request frame as `frame::read_frame` returns it: header and body, without the size prefix.
fn request_frame<T: Encodable>(api_key: ApiKey, version: i16, body: &T) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(42)
        .with_client_id(Some(StrBytes::from_static_str("rdkafka")));
    let mut buf = BytesMut::new();
    header.encode(&mut buf, api_key.request_header_version(version)).expect("encode header");
    body.encode(&mut buf, version).expect("encode body");
    buf.freeze()
}

/// What `dispatch::route` does with a frame before it calls the handler.
fn decode<T: Decodable>(frame: &Bytes) -> T {
    let mut frame = frame.clone();
    let prefix = frame::peek_prefix(&frame).expect("prefix");
    let api_key = ApiKey::try_from(prefix.api_key).expect("known API key");
    let version = prefix.version;
    assert!(versions::supported(api_key).is_some_and(|r| version >= r.min && version <= r.max));
    let header = frame::decode_header(&mut frame, api_key, version).expect("header");
    black_box(header.client_id.as_ref().map(|s| s.to_string()));
    frame::decode_body(&mut frame, api_key, version).expect("body")
}

fn requests(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");

    // Produce v9 (flexible) with one partition carrying one 1 MiB batch of 1,000 x 1 KiB.
    let records = Bytes::from(batch(&BatchSpec { records: 1000, value_bytes: 1024, ..Default::default() }));
    let produce = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![
        TopicProduceData::default()
            .with_name(topic("bench"))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(records))]),
    ]);
    // The records field is a slice of the frame (no copy), so the cost is per request, not per
    // byte: throughput in requests.
    let bytes = request_frame(ApiKey::Produce, 9, &produce);
    group.throughput(Throughput::Elements(1));
    group.bench_function("Produce v9, one 1 MiB batch", |b| b.iter(|| decode::<ProduceRequest>(black_box(&bytes))));

    // Fetch v12 naming 1,000 partitions of one topic, as librdkafka sends for a consumer
    // assigned all of them (no fetch sessions).
    let partitions = (0..PARTITIONS)
        .map(|p| {
            FetchPartition::default()
                .with_partition(p)
                .with_current_leader_epoch(0)
                .with_fetch_offset(1_000_000 + i64::from(p))
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    let fetch = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default().with_topic(topic("bench")).with_partitions(partitions)]);
    let bytes = request_frame(ApiKey::Fetch, 12, &fetch);
    group.throughput(Throughput::Elements(PARTITIONS as u64));
    group.bench_function("Fetch v12, 1000 partitions", |b| b.iter(|| decode::<FetchRequest>(black_box(&bytes))));

    // Metadata v12 for ten topics.
    let metadata = MetadataRequest::default().with_allow_auto_topic_creation(true).with_topics(Some(
        (0..10).map(|i| MetadataRequestTopic::default().with_name(Some(topic(&format!("topic-{i}"))))).collect(),
    ));
    let bytes = request_frame(ApiKey::Metadata, 12, &metadata);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("Metadata v12, 10 topics", |b| b.iter(|| decode::<MetadataRequest>(black_box(&bytes))));
    group.finish();
}

fn responses(c: &mut Criterion) {
    // A Fetch v12 response for 1,000 partitions, as the fetch handler builds it: every 100th
    // partition has 64 KiB of record data (a placeholder in the encoded response, spliced out
    // into a file chunk), the others none. splice_files only records the file ranges; the file
    // is never read here.
    let file = Arc::new(File::open("/dev/null").expect("open /dev/null"));
    let mut files = Vec::new();
    let partitions = (0..PARTITIONS)
        .map(|p| {
            let records = if p % 100 == 0 {
                let placeholder = zero_copy::placeholder(files.len());
                files.push(FileSlice {
                    file: Arc::clone(&file),
                    path: PathBuf::from("/dev/null"),
                    position: 0,
                    len: 64 << 10,
                    first_offset: 0,
                    next_offset: 64,
                    data: None,
                });
                placeholder
            } else {
                Bytes::new()
            };
            PartitionData::default()
                .with_partition_index(p)
                .with_high_watermark(1_000_000)
                .with_last_stable_offset(1_000_000)
                .with_log_start_offset(0)
                .with_records(Some(records))
        })
        .collect();
    let response = FetchResponse::default()
        .with_session_id(0)
        .with_responses(vec![FetchableTopicResponse::default().with_topic(topic("bench")).with_partitions(partitions)]);
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Elements(PARTITIONS as u64));
    group.bench_function("Fetch v12 response, 1000 partitions (10 with data)", |b| {
        b.iter(|| {
            let encoded = frame::encode_response(ApiKey::Fetch, 12, 42, black_box(&response)).expect("encode");
            zero_copy::splice_files(encoded, files.clone(), true).expect("splice")
        })
    });
    group.finish();
}

criterion_group!(benches, requests, responses);
criterion_main!(benches);
