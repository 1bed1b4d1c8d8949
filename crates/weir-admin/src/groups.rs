//! Consumer groups: list, describe with lag, reset offsets, standalone commits, delete; and
//! their settings (RocketMQ consumers' FIFO delivery, attempts and back-off).
//!
//! Offsets are changed the way Kafka's `kafka-consumer-groups.sh` changes them: as a standalone
//! ("simple") commit with generation −1, which the coordinator accepts only while the group has
//! no members. A reset can therefore never race a live consumer's own commits.
//!
//! A group's consumers that receive by invisible time (RocketMQ's) are no members of the group
//! protocol: they are listed from the brokers they talk to ([`forward::group_clients`]), and a
//! reset moves their position where each partition is led ([`Broker::reset_queues`]) while they
//! run, as RocketMQ's `resetOffsetByTime` does.
//!
//! [`forward::group_clients`]: crate::forward::group_clients
//! [`Broker::reset_queues`]: weir_broker::Broker::reset_queues

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use bytes::{Buf, Bytes};
use kafka_protocol::messages::ConsumerProtocolAssignment;
use kafka_protocol::protocol::Decodable;
use weir_broker::{Broker, ErrorKind};
use weir_coordinators::group::clients::ConnectedClient;
use weir_coordinators::group::{CommitParams, GroupDescription as Described, GroupState, OffsetToCommit};

use axum::http::StatusCode;
use weir_broker::group_config;
use weir_broker::topic_config::{ConfigEdit, ConfigOp};

use crate::api::{
    AlterConfigs, CommitOffsets, CommittedOffsets, ConfigEntry, Configs, CreateGroup, CreatedGroup, DeletedGroup,
    DeletedOffsets, GroupDescription, GroupList, GroupMember, GroupOffset, GroupSummary, OffsetChange,
    ResendDeadLetters, ResentDeadLetters, ResetOffsets, ResetOffsetsResult, ResetTo, TopicPartitions, TopicSelector,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::topics::require_topic;
use crate::{Core, SharedState};

/// The protocol type shown for a group whose only consumers receive by invisible time.
const ROCKETMQ_PROTOCOL: &str = "rocketmq";

/// Newest ConsumerProtocolAssignment version this decoder knows; newer ones start with the
/// same fields (Kafka's consumer protocol only ever appends), so they decode at this version.
const ASSIGNMENT_VERSION_MAX: i16 = 3;

fn coordinator_error(code: ErrorKind, group: &str) -> ApiError {
    match code {
        ErrorKind::UnknownGroup => ApiError::unknown_group(group),
        ErrorKind::GroupNotEmpty => non_empty(group, None),
        other => ApiError::new(other, format!("group '{group}': {other}")),
    }
}

fn non_empty(group: &str, state: Option<GroupState>) -> ApiError {
    let state = state.map(|s| format!(" (state {})", s.as_str())).unwrap_or_default();
    ApiError::new(
        ErrorKind::GroupNotEmpty,
        format!("group '{group}' has active members{state}; stop its consumers first"),
    )
}

async fn describe_one(core: &Core, group: &str) -> Result<Described, ApiError> {
    let described = core.groups.describe_groups(&[group.to_string()]).await.pop();
    let described = described.ok_or_else(|| ApiError::internal("the coordinator returned no group"))?;
    if let Some(code) = described.error {
        return Err(coordinator_error(code, group));
    }
    Ok(described)
}

/// A consumer group member's assignment, or nothing for other protocols and undecodable bytes.
fn decode_assignment(protocol_type: &str, bytes: &Bytes) -> Vec<TopicPartitions> {
    if protocol_type != "consumer" || bytes.len() < 2 {
        return Vec::new();
    }
    let mut buf = bytes.clone();
    let version = buf.get_i16();
    if version < 0 {
        return Vec::new();
    }
    match ConsumerProtocolAssignment::decode(&mut buf, version.min(ASSIGNMENT_VERSION_MAX)) {
        Ok(assignment) => assignment
            .assigned_partitions
            .into_iter()
            .map(|tp| TopicPartitions { topic: tp.topic.to_string(), partitions: tp.partitions })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// `GET /v1/groups`: the groups of every broker's coordinator (each lists its own, as Kafka's
/// ListGroups does; this node asks the others and merges).
pub(crate) async fn list(
    State(state): State<SharedState>,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<GroupList>, ApiError> {
    let core = state.core()?;
    let mut states = Vec::new();
    for name in query.get("state").unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()) {
        states.push(GroupState::parse(name).ok_or_else(|| {
            ApiError::invalid(format!(
                "unknown group state {name:?}: expected Empty, PreparingRebalance, CompletingRebalance or Stable"
            ))
        })?);
    }
    let listed = core.groups.list_groups(&states).await.map_err(|code| coordinator_error(code, "*"))?;
    let mut groups: BTreeMap<String, GroupSummary> = listed
        .into_iter()
        .map(|g| {
            let summary = GroupSummary {
                group_id: g.group_id,
                state: g.state.as_str().to_string(),
                protocol_type: g.protocol_type,
            };
            (summary.group_id.clone(), summary)
        })
        .collect();
    let wanted = |state: GroupState| states.is_empty() || states.contains(&state);
    // Groups whose consumers receive by invisible time from this broker: consuming.
    if wanted(GroupState::Stable) {
        for name in core.groups.clients.groups(core.broker.now_ms()) {
            let summary = groups.entry(name.clone()).or_insert_with(|| GroupSummary {
                group_id: name,
                state: String::new(),
                protocol_type: String::new(),
            });
            if summary.state.is_empty() || summary.state == GroupState::Empty.as_str() {
                summary.state = GroupState::Stable.as_str().to_string();
                summary.protocol_type = ROCKETMQ_PROTOCOL.to_string();
            }
        }
    }
    // Groups created with settings and never used yet (every node has the settings).
    if wanted(GroupState::Empty) {
        for name in core.broker.metadata().group_configs.keys() {
            groups.entry(name.clone()).or_insert_with(|| GroupSummary {
                group_id: name.clone(),
                state: GroupState::Empty.as_str().to_string(),
                protocol_type: String::new(),
            });
        }
    }
    let mut groups: Vec<GroupSummary> = groups.into_values().collect();
    if !crate::forward::is_forwarded(&headers) {
        let filter = query.get("state").map(|s| format!("?state={s}")).unwrap_or_default();
        for other in crate::forward::ask_every_broker::<GroupList>(&core.broker, &format!("/v1/groups{filter}")).await {
            groups.extend(other.groups);
        }
        // One line per group: where brokers disagree (a coordinator that sees no members, a
        // broker whose consumers receive by invisible time), the one that sees it consuming.
        groups.sort_by(|a, b| {
            let idle = |g: &GroupSummary| g.state == GroupState::Empty.as_str();
            a.group_id.cmp(&b.group_id).then(idle(a).cmp(&idle(b)))
        });
        groups.dedup_by(|a, b| a.group_id == b.group_id);
    }
    Ok(Json(GroupList { groups }))
}

pub(crate) async fn describe(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
) -> Result<Json<GroupDescription>, ApiError> {
    let core = state.core()?;
    let described = describe_one(core, &group).await?;
    let settings = core.broker.group_configs(&group);
    let connected = crate::forward::group_clients(core, &group).await;
    // A group known only by its settings (a RocketMQ group before its first commit) or by its
    // connected consumers exists.
    if described.state == GroupState::Dead && settings.is_none() && connected.is_empty() {
        return Err(ApiError::unknown_group(&group));
    }
    let committed =
        core.groups.fetch_offsets(&group, None, false).await.map_err(|code| coordinator_error(code, &group))?;
    let mut offsets: BTreeMap<(String, i32), GroupOffset> = BTreeMap::new();
    for c in committed {
        let e = offset_row(&mut offsets, &c.topic, c.partition);
        e.committed_offset = c.offset;
        e.metadata = Some(c.metadata);
    }
    let share = share_members(core, &group, &mut offsets).await;
    let mut epochs = described.consumer.as_ref().map(|c| (c.group_epoch, c.assignment_epoch));
    let member_epochs: HashMap<String, i32> = described
        .consumer
        .iter()
        .flat_map(|c| c.members.iter().map(|m| (m.member_id.clone(), m.member_epoch)))
        .collect();
    let kafka_members = described.members.len();
    let mut members = Vec::with_capacity(kafka_members + connected.len());
    let classic_members = if share.is_some() { Vec::new() } else { described.members };
    if let Some((share_members, share_epochs)) = share {
        members.extend(share_members);
        epochs = Some(share_epochs);
    }
    for m in classic_members {
        let assignment = decode_assignment(&described.protocol_type, &m.assignment);
        for tp in &assignment {
            for &partition in &tp.partitions {
                offset_row(&mut offsets, &tp.topic, partition).member_id = Some(m.member_id.clone());
            }
        }
        members.push(GroupMember {
            member_epoch: member_epochs.get(&m.member_id).copied(),
            member_id: m.member_id,
            group_instance_id: m.group_instance_id,
            client_id: m.client_id,
            client_host: m.client_host,
            assignment,
            ..GroupMember::default()
        });
    }
    members.extend(invisible_time_members(&core.broker, &connected, &mut offsets));
    let total_lag = fill_in_lag(&core.broker, &mut offsets).await;
    let (state, protocol_type) = match described.state {
        // Consuming, by invisible time only.
        GroupState::Empty | GroupState::Dead if kafka_members == 0 && !connected.is_empty() => {
            (GroupState::Stable, ROCKETMQ_PROTOCOL.to_string())
        }
        // Known by its settings, never used yet.
        GroupState::Dead => (GroupState::Empty, described.protocol_type),
        other => (other, described.protocol_type),
    };
    Ok(Json(GroupDescription {
        group_id: described.group_id,
        state: state.as_str().to_string(),
        protocol_type,
        protocol: described.protocol_data,
        members,
        offsets: offsets.into_values().collect(),
        total_lag,
        configs: config_entries(&settings.unwrap_or_default()),
        group_epoch: epochs.map(|e| e.0),
        assignment_epoch: epochs.map(|e| e.1),
    }))
}

/// The row of a partition in a group's description, added empty if it is not there yet.
fn offset_row<'a>(
    offsets: &'a mut BTreeMap<(String, i32), GroupOffset>,
    topic: &str,
    partition: i32,
) -> &'a mut GroupOffset {
    offsets.entry((topic.to_string(), partition)).or_insert_with(|| GroupOffset {
        topic: topic.to_string(),
        partition,
        committed_offset: None,
        high_watermark: None,
        lag: None,
        member_id: None,
        metadata: None,
        in_flight: None,
    })
}

/// A share group's members (each with its assignment and epoch) and, on every partition it
/// consumes, its start offset (the offset below which every record is done) as the committed
/// offset and its records in flight. `None`: not a share group.
async fn share_members(
    core: &Core,
    group: &str,
    offsets: &mut BTreeMap<(String, i32), GroupOffset>,
) -> Option<(Vec<GroupMember>, (i32, i32))> {
    let described = core.groups.share_group_describe(&[group.to_string()]).await.pop()?;
    if described.error.is_some() {
        return None;
    }
    let mut members = Vec::with_capacity(described.members.len());
    let mut topics: BTreeSet<String> = BTreeSet::new();
    for m in described.members {
        let mut assignment = Vec::with_capacity(m.assignment.len());
        for (_, topic, partitions) in m.assignment {
            for &partition in &partitions {
                // Several members may share a partition: the row names the first.
                let row = offset_row(offsets, &topic, partition);
                row.member_id.get_or_insert_with(|| m.member_id.clone());
            }
            topics.insert(topic.clone());
            assignment.push(TopicPartitions { topic, partitions });
        }
        members.push(GroupMember {
            member_id: m.member_id,
            member_epoch: Some(m.member_epoch),
            group_instance_id: None,
            client_id: m.client_id,
            client_host: m.client_host,
            assignment,
            ..GroupMember::default()
        });
    }
    let metadata = core.broker.metadata();
    for topic in &topics {
        let Some(meta) = metadata.topic(topic) else { continue };
        for partition in 0..meta.partitions {
            offset_row(offsets, topic, partition);
        }
    }
    // Each partition's position, from the broker leading it.
    let queues: Vec<(String, i32)> = offsets.keys().cloned().collect();
    let standings = core.messaging.queue_standings(group, Some(&queues)).await;
    for (queue, row) in offsets.iter_mut() {
        if let Some(standing) = standings.get(queue) {
            row.committed_offset = Some(standing.position.done_below);
            row.in_flight = Some(standing.position.in_flight);
        }
    }
    Some((members, (described.group_epoch, described.assignment_epoch)))
}

/// Consumers by invisible time: each receives from every partition of its topics, so none
/// owns a partition's row (but every partition has one).
fn invisible_time_members(
    broker: &Broker,
    connected: &[ConnectedClient],
    offsets: &mut BTreeMap<(String, i32), GroupOffset>,
) -> Vec<GroupMember> {
    let metadata = broker.metadata();
    let mut members = Vec::with_capacity(connected.len());
    for c in connected {
        let mut assignment = Vec::with_capacity(c.topics.len());
        for topic in &c.topics {
            let Some(meta) = metadata.topic(topic) else { continue };
            for partition in 0..meta.partitions {
                offset_row(offsets, topic, partition);
            }
            assignment.push(TopicPartitions { topic: topic.clone(), partitions: (0..meta.partitions).collect() });
        }
        let said = |text: &String| (!text.is_empty()).then(|| text.clone());
        members.push(GroupMember {
            member_id: c.client_id.clone(),
            group_instance_id: None,
            client_id: c.client_id.clone(),
            client_host: c.host.clone(),
            assignment,
            client_type: Some(c.kind.as_str().to_string()),
            language: said(&c.language),
            version: said(&c.version),
            subscriptions: c.subscriptions.clone(),
            member_epoch: None,
        });
    }
    members
}

/// Each row's high watermark, from its partition's leader (this broker or another), and lag;
/// returns the total lag.
async fn fill_in_lag(broker: &Arc<Broker>, offsets: &mut BTreeMap<(String, i32), GroupOffset>) -> i64 {
    let mut high_watermarks: HashMap<(String, i32), i64> = HashMap::new();
    for topic in offsets.keys().map(|(t, _)| t.clone()).collect::<BTreeSet<_>>() {
        for info in crate::forward::partition_infos(broker, &topic).await {
            if info.high_watermark >= 0 {
                high_watermarks.insert((topic.clone(), info.partition), info.high_watermark);
            }
        }
    }
    let mut total_lag = 0;
    for e in offsets.values_mut() {
        e.high_watermark = high_watermarks.get(&(e.topic.clone(), e.partition)).copied();
        if let (Some(hw), Some(committed)) = (e.high_watermark, e.committed_offset) {
            let lag = (hw - committed).max(0);
            e.lag = Some(lag);
            total_lag += lag;
        }
    }
    total_lag
}

fn config_entries(overrides: &BTreeMap<String, String>) -> Vec<ConfigEntry> {
    group_config::describe(overrides)
        .into_iter()
        .map(|e| ConfigEntry {
            name: e.name,
            value: e.value,
            source: if e.overridden { "group" } else { "default" }.to_string(),
        })
        .collect()
}

/// `POST /v1/groups`: gives a group settings; 409 when it has some already.
pub(crate) async fn create(
    State(state): State<SharedState>,
    JsonBody(request): JsonBody<CreateGroup>,
) -> Result<(StatusCode, Json<CreatedGroup>), ApiError> {
    let core = state.core()?;
    let edit = ConfigEdit::Apply(
        request
            .configs
            .iter()
            .map(|(name, value)| ConfigOp::Set { name: name.clone(), value: value.clone() })
            .collect(),
    );
    // The stored overrides, as `apply` normalises them (the controller stores the same).
    let overrides = group_config::apply(&edit, &BTreeMap::new())
        .map_err(|message| ApiError::new(ErrorKind::InvalidConfig, message))?;
    core.broker.alter_group_configs(request.name.clone(), true, request.validate_only, edit).await?;
    let status = if request.validate_only { StatusCode::OK } else { StatusCode::CREATED };
    Ok((
        status,
        Json(CreatedGroup {
            name: request.name,
            configs: config_entries(&overrides),
            validate_only: request.validate_only,
        }),
    ))
}

/// `GET /v1/groups/{group}/configs`: the settings in force (the defaults for any group
/// without settings, known or not).
pub(crate) async fn configs(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    Ok(Json(Configs { configs: config_entries(&core.broker.group_configs(&group).unwrap_or_default()) }))
}

/// `PATCH /v1/groups/{group}/configs`: sets and deletes settings, creating the group's
/// settings when it has none.
pub(crate) async fn alter_configs(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
    JsonBody(request): JsonBody<AlterConfigs>,
) -> Result<Json<Configs>, ApiError> {
    let core = state.core()?;
    let edit = crate::topics::edit_of(&request)?;
    let current = core.broker.group_configs(&group).unwrap_or_default();
    let mut overrides =
        group_config::apply(&edit, &current).map_err(|message| ApiError::new(ErrorKind::InvalidConfig, message))?;
    core.broker.alter_group_configs(group.clone(), false, request.validate_only, edit).await?;
    if !request.validate_only {
        overrides = core.broker.group_configs(&group).unwrap_or_default();
    }
    Ok(Json(Configs { configs: config_entries(&overrides) }))
}

/// Commits `offsets` for `group` as a standalone consumer: all or nothing (one fsynced append).
async fn simple_commit(core: &Core, group: &str, offsets: Vec<OffsetToCommit>) -> Result<(), ApiError> {
    let params = CommitParams {
        group_id: group.to_string(),
        generation_id: None,
        member_id: String::new(),
        group_instance_id: None,
        offsets,
    };
    for result in core.groups.commit_offsets(params).await {
        if let Some(code) = result.error {
            return Err(match code {
                // What a standalone commit gets while the group has members.
                ErrorKind::UnknownMember | ErrorKind::WrongGeneration | ErrorKind::RebalanceInProgress => {
                    non_empty(group, None)
                }
                ErrorKind::UnknownTopicOrPartition => {
                    ApiError::new(code, format!("topic '{}' has no partition {}", result.topic, result.partition))
                }
                other => ApiError::new(
                    other,
                    format!("cannot commit {}-{} for group '{group}': {other}", result.topic, result.partition),
                ),
            });
        }
    }
    Ok(())
}

fn to_commit(topic: String, partition: i32, offset: i64, metadata: Option<String>) -> OffsetToCommit {
    OffsetToCommit { topic, partition, offset, leader_epoch: None, metadata }
}

/// `POST /v1/groups/{group}/offsets`.
pub(crate) async fn commit(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
    JsonBody(request): JsonBody<CommitOffsets>,
) -> Result<Json<CommittedOffsets>, ApiError> {
    let core = state.core()?;
    if request.offsets.is_empty() {
        return Err(ApiError::invalid("no offsets to commit: `offsets` is empty"));
    }
    for o in &request.offsets {
        if o.offset < 0 {
            return Err(ApiError::invalid(format!(
                "offset {} for {}-{} is negative; commit the next offset to consume",
                o.offset, o.topic, o.partition
            )));
        }
        let topic = require_topic(&core.broker, &o.topic)?;
        if !(0..topic.partitions).contains(&o.partition) {
            return Err(ApiError::unknown_partition(&o.topic, o.partition));
        }
    }
    let offsets =
        request.offsets.iter().map(|o| to_commit(o.topic.clone(), o.partition, o.offset, o.metadata.clone())).collect();
    simple_commit(core, &group, offsets).await?;
    Ok(Json(CommittedOffsets { group_id: group, offsets: request.offsets }))
}

/// `POST /v1/groups/{group}/reset-offsets`.
pub(crate) async fn reset_offsets(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
    JsonBody(request): JsonBody<ResetOffsets>,
) -> Result<Json<ResetOffsetsResult>, ApiError> {
    let core = state.core()?;
    let broker = core.broker.clone();
    let described = describe_one(core, &group).await?;
    // A group that does not exist yet is created by the commit, as Kafka's tool does.
    if !matches!(described.state, GroupState::Empty | GroupState::Dead) {
        return Err(non_empty(&group, Some(described.state)));
    }
    let committed: HashMap<(String, i32), i64> = core
        .groups
        .fetch_offsets(&group, None, false)
        .await
        .map_err(|code| coordinator_error(code, &group))?
        .into_iter()
        .filter_map(|c| Some(((c.topic, c.partition), c.offset?)))
        .collect();
    let selectors = match request.topics {
        Some(topics) if topics.is_empty() => return Err(ApiError::invalid("`topics` is empty")),
        Some(topics) => topics,
        None => {
            let topics: BTreeSet<&String> = committed.keys().map(|(topic, _)| topic).collect();
            if topics.is_empty() {
                return Err(ApiError::invalid(format!(
                    "group '{group}' has no committed offsets; name the topics to reset"
                )));
            }
            topics.into_iter().map(|t| TopicSelector::All(t.clone())).collect()
        }
    };
    let targets = selected_partitions(&broker, &selectors)?;
    let to = request.to;
    if let ResetTo::Timestamp(t) = to {
        if t < 0 {
            return Err(ApiError::new(ErrorKind::InvalidTimestamp, format!("timestamp {t} is negative")));
        }
    }
    // Each partition's bounds from its leader (this broker or another).
    let mut bounds: HashMap<(String, i32), (i64, i64)> = HashMap::new();
    for topic in targets.iter().map(|(t, _)| t.clone()).collect::<BTreeSet<_>>() {
        for info in crate::forward::partition_infos(&broker, &topic).await {
            bounds.insert((topic.clone(), info.partition), (info.log_start_offset, info.high_watermark));
        }
    }
    let mut changes = Vec::with_capacity(targets.len());
    for (topic, index) in targets {
        let (start, hw) = match bounds.get(&(topic.clone(), index)) {
            Some(&(start, hw)) if hw >= 0 => (start, hw),
            _ => {
                return Err(ApiError::new(
                    ErrorKind::LeaderNotAvailable,
                    format!("{topic}-{index} has no leader that answers right now; retry shortly"),
                ))
            }
        };
        let previous = committed.get(&(topic.clone(), index)).copied();
        let new_offset = reset_offset(&broker, to, &topic, index, (start, hw), previous).await?;
        changes.push(OffsetChange { topic, partition: index, previous_offset: previous, new_offset });
    }
    if !request.dry_run {
        apply_reset(core, &group, &changes).await?;
    }
    Ok(Json(ResetOffsetsResult { group_id: group, dry_run: request.dry_run, offsets: changes }))
}

/// Every (topic, partition) the selectors name, checked to exist, in order and without
/// duplicates.
fn selected_partitions(broker: &Broker, selectors: &[TopicSelector]) -> Result<BTreeSet<(String, i32)>, ApiError> {
    let mut targets: BTreeSet<(String, i32)> = BTreeSet::new();
    for selector in selectors {
        let topic = require_topic(broker, selector.topic())?;
        match selector {
            TopicSelector::All(_) => targets.extend((0..topic.partitions).map(|p| (topic.name.clone(), p))),
            TopicSelector::Some { partitions, .. } => {
                if partitions.is_empty() {
                    return Err(ApiError::invalid(format!("no partitions listed for topic '{}'", topic.name)));
                }
                for &p in partitions {
                    if !(0..topic.partitions).contains(&p) {
                        return Err(ApiError::unknown_partition(&topic.name, p));
                    }
                    targets.insert((topic.name.clone(), p));
                }
            }
        }
    }
    Ok(targets)
}

/// Where `to` moves the group's offset of `topic`-`index`, whose offsets run from `start` to
/// the high watermark `hw`; `previous` is the committed offset, if any.
async fn reset_offset(
    broker: &Arc<Broker>,
    to: ResetTo,
    topic: &str,
    index: i32,
    (start, hw): (i64, i64),
    previous: Option<i64>,
) -> Result<i64, ApiError> {
    Ok(match to {
        ResetTo::Earliest => start,
        ResetTo::Latest => hw,
        ResetTo::Timestamp(t) => crate::forward::offset_at(broker, topic, index, t).await?,
        ResetTo::Offset(n) if n < start || n > hw => {
            return Err(ApiError::new(
                ErrorKind::OffsetOutOfRange,
                format!("offset {n} is out of range for {topic}-{index}: valid offsets are {start} to {hw} (the high watermark)"),
            ))
        }
        ResetTo::Offset(n) => n,
        ResetTo::ShiftBy(n) => match previous {
            Some(current) => current.saturating_add(n).clamp(start, hw),
            None => {
                return Err(ApiError::invalid(format!(
                    "group has no committed offset for {topic}-{index} to shift from; reset it to earliest, latest, a timestamp or an offset"
                )))
            }
        },
    })
}

/// Moves the group to `changes`: the invisible-time positions first, as they are what RocketMQ
/// consumers read from (and they commit what they reach as the group's offsets anyway), then
/// the committed offsets.
async fn apply_reset(core: &Core, group: &str, changes: &[OffsetChange]) -> Result<(), ApiError> {
    let mut by_topic: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
    for c in changes {
        by_topic.entry(c.topic.as_str()).or_default().push((c.partition, c.new_offset));
    }
    for (topic, positions) in by_topic {
        core.messaging.reset_queues(group, topic, &positions).await?;
    }
    let offsets = changes.iter().map(|c| to_commit(c.topic.clone(), c.partition, c.new_offset, None)).collect();
    simple_commit(core, group, offsets).await?;
    tracing::info!(group = %group, partitions = changes.len(), "reset committed offsets over HTTP");
    Ok(())
}

pub(crate) async fn delete(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
) -> Result<Json<DeletedGroup>, ApiError> {
    let core = state.core()?;
    let outcome = core.groups.delete_groups(vec![group.clone()]).await.pop();
    match outcome {
        Some((_, None)) => Ok(Json(DeletedGroup { group_id: group })),
        Some((_, Some(code))) => Err(coordinator_error(code, &group)),
        None => Err(ApiError::internal("the coordinator returned no result")),
    }
}

/// `POST /v1/groups/{group}/dead-letters/resend`: answered where the dead-letter partition is
/// led (the route's middleware forwards it there).
pub(crate) async fn resend_dead_letters(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
    JsonBody(request): JsonBody<ResendDeadLetters>,
) -> Result<Json<ResentDeadLetters>, ApiError> {
    let core = state.core()?;
    let max = request.max.unwrap_or(weir_messaging::dead_letter::RESEND_MAX);
    if max == 0 {
        return Err(ApiError::invalid("`max` is 0: nothing to resend"));
    }
    let resent =
        weir_messaging::dead_letter::resend_dead_letters(&core.broker, &group, request.from_offset, max).await?;
    Ok(Json(resent))
}

/// `DELETE /v1/groups/{group}/offsets?topic=T`: the group's committed offsets of one topic,
/// as Kafka's OffsetDelete removes them: refused while members subscribe to the topic.
pub(crate) async fn delete_offsets(
    State(state): State<SharedState>,
    PathParams(group): PathParams<String>,
    query: QueryParams,
) -> Result<Json<DeletedOffsets>, ApiError> {
    let core = state.core()?;
    let name = query.get("topic").filter(|t| !t.is_empty());
    let name = name.ok_or_else(|| ApiError::invalid("name the topic whose offsets to delete: ?topic=NAME"))?;
    let topic = require_topic(&core.broker, name)?;
    let partitions: Vec<(String, i32)> = (0..topic.partitions).map(|p| (topic.name.clone(), p)).collect();
    let results =
        core.groups.delete_offsets(group.clone(), partitions).await.map_err(|code| coordinator_error(code, &group))?;
    if let Some(code) = results.iter().find_map(|r| r.error) {
        return Err(match code {
            ErrorKind::GroupSubscribedToTopic => ApiError::new(
                code,
                format!("group '{group}' has members subscribed to topic '{}'; stop them first", topic.name),
            ),
            other => ApiError::new(other, format!("group '{group}', topic '{}': {other}", topic.name)),
        });
    }
    Ok(Json(DeletedOffsets { group_id: group, topic: topic.name, partitions: (0..topic.partitions).collect() }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    #[test]
    fn consumer_assignments_decode_at_any_version() {
        let assignment = ConsumerProtocolAssignment::default()
            .with_assigned_partitions(vec![TopicPartition::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![0, 2])]);
        for version in [0i16, 1, 3] {
            let mut buf = bytes::BytesMut::new();
            buf.extend_from_slice(&version.to_be_bytes());
            assignment.encode(&mut buf, version).unwrap();
            let decoded = decode_assignment("consumer", &buf.freeze());
            assert_eq!(decoded, vec![TopicPartitions { topic: "orders".into(), partitions: vec![0, 2] }]);
        }
        assert!(decode_assignment("connect", &Bytes::from_static(b"\0\0anything")).is_empty());
        assert!(decode_assignment("consumer", &Bytes::from_static(b"\0")).is_empty());
        assert!(decode_assignment("consumer", &Bytes::from_static(b"\0\0\0\0\0\x09")).is_empty());
    }
}
