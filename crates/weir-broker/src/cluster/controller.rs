//! This node as the active controller: it runs the controller's decisions (`weir-controller`)
//! against its applied metadata, commits their records to the metadata quorum and says what
//! happened. One decision at a time, under the controller lock ([`Broker::lock_controller`]);
//! a decision that takes several metadata entries (one per topic of a CreateTopics, one per
//! broker fenced by the tick) is run once per entry against the state the previous one left.
//!
//! Also here: the controller's periodic tick (the cluster's first record, fencing brokers whose
//! sessions expired or whose processes are gone (`liveness`), completing reassignments, the leader balance) and the broker-side calls
//! that ask the controller for something.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;
use weir_controller::election::{ElectionResult, ElectionType};
use weir_controller::reassignment::{OngoingReassignment, ReassignmentResult, ReassignmentTarget};
use weir_controller::{
    balance, brokers, elastic, election, isr, producer_ids, reassignment, topics, ControllerConfig, Decision,
};
use weir_controller::{HeartbeatAnswer, RandomEntropy};
use weir_storage::sync::lock;

use super::control::{ControlAnswer, ControlRequest};
use crate::broker::{Broker, CreatedTopic, NewTopic};
use crate::error::BrokerError;
use crate::metadata::{BrokerRegistration, MetadataRecord, TopicMetadata};
use crate::replication::IsrProposal;
use crate::runtime::block_on;
use crate::topic_config::{self, ConfigEdit};

/// How often the active controller looks for expired sessions.
pub(crate) fn tick_interval(session_timeout_ms: u64) -> Duration {
    Duration::from_millis((session_timeout_ms / 8).clamp(50, 500))
}

/// Kafka 3.x still accepts its deprecated topic configs, and so does Weir, but they do nothing:
/// say so to whoever sets one.
fn warn_deprecated(topic: &str, configs: &BTreeMap<String, String>) {
    for name in topic_config::deprecated_in(configs) {
        tracing::warn!(topic, config = name, "a deprecated topic config: accepted, and it has no effect");
    }
}

impl Broker {
    /// What the controller decides with: this broker's settings.
    fn controller_config(&self) -> ControllerConfig {
        let config = &self.config;
        ControllerConfig {
            num_partitions: config.num_partitions,
            default_replication_factor: config.default_replication_factor,
            max_partitions_per_topic: config.max_partitions_per_topic,
            delete_topic_enable: config.delete_topic_enable,
            offsets_topic_replication_factor: config.offsets_topic_replication_factor,
            transaction_state_replication_factor: config.transaction_state_replication_factor,
            messaging_state_replication_factor: config.messaging_state_replication_factor,
            // The cluster-wide dynamic defaults count (unclean.leader.election.enable among them).
            topic_defaults: topic_config::effective_defaults(
                &config.topic_defaults,
                &self.metadata().broker_configs,
                None,
            ),
            replica_capacity: crate::capacity::replica_capacity(),
        }
    }

    fn term(&self) -> u64 {
        self.quorum.status().term
    }

    /// Commits a decision's records (when it has any) and gives its answer.
    fn settle<T>(&self, held: &MutexGuard<'_, ()>, decision: Decision<T>) -> Result<T, BrokerError> {
        if !decision.records.is_empty() {
            self.commit(held, decision.records)?;
        }
        Ok(decision.answer)
    }

    /// Runs `request` on this node, the active controller, with the controller lock `held`.
    /// Blocking.
    pub(crate) fn run_decision(
        &self,
        held: &MutexGuard<'_, ()>,
        request: ControlRequest,
    ) -> Result<ControlAnswer, BrokerError> {
        match request {
            ControlRequest::CreateTopics { topics, validate_only } => {
                Ok(ControlAnswer::CreatedTopics(self.decide_create_topics(held, topics, validate_only)))
            }
            ControlRequest::CreateElasticTopic { topic, stable_partitions, validate_only } => {
                let result = self.decide_create_elastic_topic(held, topic, stable_partitions, validate_only);
                Ok(ControlAnswer::CreatedTopics(vec![result]))
            }
            ControlRequest::SplitPhysical { topic, partition } => {
                let state = self.metadata();
                let decision = elastic::decide_split(&state, &topic, partition, &self.split_loads(&state))?;
                self.settle_elastic(held, &topic, "split", decision).map(ControlAnswer::Elastic)
            }
            ControlRequest::MergePhysical { topic, partitions: (a, b) } => {
                let decision = elastic::decide_merge(&self.metadata(), &topic, a, b)?;
                self.settle_elastic(held, &topic, "merge", decision).map(ControlAnswer::Elastic)
            }
            ControlRequest::DeleteTopic { name, id } => {
                self.decide_delete_topic(held, name, id).map(ControlAnswer::Topic)
            }
            ControlRequest::CreatePartitions { name, count, assignments, validate_only } => {
                let config = self.controller_config();
                let state = self.metadata();
                let decision =
                    topics::decide_create_partitions(&state, &config, &name, count, assignments, validate_only)?;
                let added = !decision.records.is_empty();
                self.settle(held, decision)?;
                if added {
                    tracing::info!(topic = %name, partitions = count, "added partitions");
                }
                Ok(ControlAnswer::Done)
            }
            ControlRequest::AlterTopicConfigs { name, validate_only, edit } => {
                self.decide_alter_topic_configs(held, name, validate_only, edit).map(|()| ControlAnswer::Done)
            }
            ControlRequest::EnsureInternalTopic { name, partitions, configs } => {
                self.decide_ensure_internal_topic(held, &name, partitions, configs).map(ControlAnswer::Topic)
            }
            ControlRequest::AllocateProducerIds => {
                let (first, count) = self.settle(held, producer_ids::decide_allocate(&self.metadata()))?;
                Ok(ControlAnswer::ProducerIds { first, count })
            }
            ControlRequest::RegisterBroker { registration } => {
                self.decide_register_broker(held, registration).map(|()| ControlAnswer::Done)
            }
            ControlRequest::Heartbeat { id, incarnation, applied_offset, shutting_down, load } => {
                if let Some(load) = load {
                    lock(&self.cluster.sessions).loads.insert(id, load);
                }
                self.decide_heartbeat(held, id, incarnation, applied_offset, shutting_down)
                    .map(ControlAnswer::Heartbeat)
            }
            ControlRequest::DescribeBalance => {
                let loads = lock(&self.cluster.sessions).loads.clone();
                Ok(ControlAnswer::Balance(balance::report(&self.metadata(), &loads, &self.config.elastic_balance)))
            }
            ControlRequest::AlterPartition { proposal } => {
                self.decide_alter_partition(held, proposal).map(|()| ControlAnswer::Done)
            }
            ControlRequest::ElectLeaders { kind, partitions } => {
                self.decide_elect_leaders(held, kind, partitions).map(ControlAnswer::Elected)
            }
            ControlRequest::AlterBrokerConfigs { resource, validate_only, edit } => {
                self.decide_alter_broker_configs(held, resource, validate_only, edit).map(|()| ControlAnswer::Done)
            }
            ControlRequest::AlterGroupConfigs { group, create, validate_only, edit } => {
                self.decide_alter_group_configs(held, group, create, validate_only, edit).map(|()| ControlAnswer::Done)
            }
            ControlRequest::AlterReassignments { targets, allow_replication_factor_change } => self
                .decide_alter_reassignments(held, targets, allow_replication_factor_change)
                .map(ControlAnswer::Reassigned),
            ControlRequest::UnregisterBroker { id } => {
                self.decide_unregister_broker(held, id).map(|()| ControlAnswer::Done)
            }
            ControlRequest::AlterScramCredentials { changes } => {
                self.decide_alter_scram_credentials(held, changes).map(ControlAnswer::Each)
            }
            ControlRequest::CreateAcls { bindings } => self.decide_create_acls(held, bindings).map(ControlAnswer::Each),
            ControlRequest::DeleteAcls { filters } => {
                self.decide_delete_acls(held, filters).map(ControlAnswer::DeletedAcls)
            }
            ControlRequest::SetAccessSecret { user, secret } => {
                self.decide_access_secret(held, user, secret).map(|()| ControlAnswer::Done)
            }
            ControlRequest::AlterClientQuotas { alterations, validate_only } => {
                self.decide_alter_client_quotas(held, alterations, validate_only).map(ControlAnswer::Each)
            }
        }
    }

    // ----- topics ------------------------------------------------------------------------------

    /// Each topic is decided and committed on its own, against the state the one before left
    /// (two topics of one name in a request: the second exists already).
    fn decide_create_topics(
        &self,
        held: &MutexGuard<'_, ()>,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> Vec<Result<CreatedTopic, BrokerError>> {
        let config = self.controller_config();
        let mut results = Vec::with_capacity(topics.len());
        for topic in topics {
            let result = topics::decide_create(&self.metadata(), &config, &mut RandomEntropy, &topic, validate_only)
                .and_then(|decision| {
                    warn_deprecated(&topic.name, &topic.configs);
                    let planned = decision.answer.clone();
                    self.settle(held, decision)?;
                    // The committed topic as the metadata holds it.
                    let topic = self.metadata().topic(&topic.name).cloned().unwrap_or(planned.topic);
                    Ok(CreatedTopic { topic, replication_factor: planned.replication_factor })
                });
            match &result {
                Err(e) => tracing::info!(topic = %topic.name, error = %e, validate_only, "create topic refused"),
                Ok(_) if !validate_only => tracing::info!(topic = %topic.name, "created topic"),
                Ok(_) => {}
            }
            results.push(result);
        }
        results
    }

    fn decide_create_elastic_topic(
        &self,
        held: &MutexGuard<'_, ()>,
        topic: NewTopic,
        stable_partitions: Option<i32>,
        validate_only: bool,
    ) -> Result<CreatedTopic, BrokerError> {
        let config = self.controller_config();
        let result = elastic::decide_create(
            &self.metadata(),
            &config,
            &mut RandomEntropy,
            &topic,
            stable_partitions,
            validate_only,
        )
        .and_then(|decision| {
            warn_deprecated(&topic.name, &topic.configs);
            let planned = decision.answer.clone();
            self.settle(held, decision)?;
            let created = self.metadata().topic(&topic.name).cloned().unwrap_or(planned.topic);
            Ok(CreatedTopic { topic: created, replication_factor: planned.replication_factor })
        });
        match &result {
            Err(e) => tracing::info!(topic = %topic.name, error = %e, validate_only, "create elastic topic refused"),
            Ok(created) if !validate_only => {
                tracing::info!(topic = %topic.name, stable_partitions = created.topic.partitions, "created elastic topic")
            }
            Ok(_) => {}
        }
        result
    }

    /// The loads a split places its upper half by: the brokers' measured traffic once every
    /// unfenced broker reported some (replica and leader counts break ties), else those counts.
    fn split_loads(&self, state: &crate::metadata::MetadataState) -> BTreeMap<i32, f64> {
        let counts = elastic::placement_load(state);
        let reports = lock(&self.cluster.sessions).loads.clone();
        let measured = balance::broker_loads(state, &reports);
        let traffic: f64 = measured.iter().map(|l| l.bytes_per_sec).sum();
        if measured.is_empty() || traffic <= 0.0 || measured.iter().any(|l| !l.reported) {
            return counts;
        }
        measured
            .into_iter()
            .map(|l| (l.broker, l.bytes_per_sec + counts.get(&l.broker).copied().unwrap_or(0.0) * 1e-6))
            .collect()
    }

    /// Commits a split or merge, then elects the preferred leaders it changed.
    fn settle_elastic(
        &self,
        held: &MutexGuard<'_, ()>,
        topic: &str,
        what: &str,
        decision: Decision<elastic::ElasticChange>,
    ) -> Result<elastic::ElasticChange, BrokerError> {
        let change = self.settle(held, decision)?;
        tracing::info!(
            topic,
            replaced = ?change.replaced,
            created = ?change.created,
            moving = change.moving.len(),
            "elastic topic: {what}"
        );
        if !change.new_leaders.is_empty() {
            let partitions = change.new_leaders.iter().map(|s| (topic.to_string(), *s)).collect();
            for (_, partition, outcome) in self.decide_elect_leaders(held, ElectionType::Preferred, Some(partitions))? {
                if let Err(e) = outcome {
                    tracing::info!(topic, partition, error = %e, "elastic topic: preferred leader not elected yet");
                }
            }
        }
        Ok(change)
    }

    fn decide_ensure_internal_topic(
        &self,
        held: &MutexGuard<'_, ()>,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<TopicMetadata, BrokerError> {
        let config = self.controller_config();
        let decision =
            topics::decide_ensure_internal(&self.metadata(), &config, &mut RandomEntropy, name, partitions, configs)?;
        if !decision.records.is_empty() {
            self.settle(held, decision)?;
            tracing::info!(topic = name, partitions, "created internal topic");
        }
        self.metadata().topic(name).cloned().ok_or_else(|| BrokerError::internal("internal topic vanished"))
    }

    fn decide_delete_topic(
        &self,
        held: &MutexGuard<'_, ()>,
        name: Option<String>,
        id: Option<Uuid>,
    ) -> Result<TopicMetadata, BrokerError> {
        let decision = topics::decide_delete(&self.metadata(), &self.controller_config(), name.as_deref(), id)?;
        let topic = self.settle(held, decision)?;
        tracing::info!(topic = %topic.name, "deleted topic");
        Ok(topic)
    }

    fn decide_alter_topic_configs(
        &self,
        held: &MutexGuard<'_, ()>,
        name: String,
        validate_only: bool,
        edit: ConfigEdit,
    ) -> Result<(), BrokerError> {
        let decision =
            topics::decide_alter_configs(&self.metadata(), &self.controller_config(), &name, validate_only, &edit)?;
        if let Some(MetadataRecord::SetTopicConfigs { configs, .. }) = decision.records.first() {
            warn_deprecated(&name, configs);
        }
        let changed = !decision.records.is_empty();
        self.settle(held, decision)?;
        if changed {
            tracing::info!(topic = %name, "altered topic configs");
            self.elect_where_unclean_allowed(held)?;
        }
        Ok(())
    }

    /// After a config change: the leaderless partitions whose topic now allows unclean
    /// elections get a leader from their live replicas (Kafka does the same when
    /// `unclean.leader.election.enable` turns on).
    pub(crate) fn elect_where_unclean_allowed(&self, held: &MutexGuard<'_, ()>) -> Result<(), BrokerError> {
        let candidates = election::unclean_candidates(&self.metadata(), &self.controller_config());
        if candidates.is_empty() {
            return Ok(());
        }
        let results = self.decide_elect_leaders(held, ElectionType::Unclean, Some(candidates))?;
        let elected = results.iter().filter(|(_, _, outcome)| outcome.is_ok()).count();
        tracing::warn!(
            partitions = elected,
            left_offline = results.len() - elected,
            "unclean.leader.election.enable turned on: elected leaders outside the ISR"
        );
        Ok(())
    }

    // ----- brokers -----------------------------------------------------------------------------

    /// Removes a decommissioned, stopped broker: its registration, and its place as a learner
    /// of the metadata quorum (the controller stops sending it the log).
    fn decide_unregister_broker(&self, held: &MutexGuard<'_, ()>, id: i32) -> Result<(), BrokerError> {
        let voter = u64::try_from(id).is_ok_and(|node| self.quorum.voters().contains(&node));
        let decision = brokers::decide_unregister(&self.metadata(), id, voter)?;
        self.settle(held, decision)?;
        if let Ok(node) = u64::try_from(id) {
            block_on(self.quorum.remove_learner(node))??;
        }
        tracing::info!(broker = id, "broker unregistered");
        Ok(())
    }

    /// A broker (re)registers. One that does not vote follows the metadata log as a Raft
    /// learner, which the quorum adds first.
    fn decide_register_broker(
        &self,
        held: &MutexGuard<'_, ()>,
        registration: BrokerRegistration,
    ) -> Result<(), BrokerError> {
        let decision = brokers::decide_register(&self.metadata(), &self.controller_config(), &registration)?;
        let voter = self.quorum.voters().contains(&(registration.id as u64));
        if !voter && !registration.internal.is_empty() {
            block_on(self.quorum.add_learner(registration.id as u64, registration.internal.clone()))??;
        }
        let changed = !decision.records.is_empty();
        self.settle(held, decision)?;
        if changed {
            tracing::info!(
                broker = registration.id,
                host = %registration.host,
                port = registration.port,
                incarnation = %registration.incarnation,
                "broker registered (fenced until it catches up)"
            );
        }
        let registered_at = self.metadata().applied_offset;
        lock(&self.cluster.sessions).registered(
            self.term(),
            registration.id,
            registration.incarnation,
            Instant::now(),
            registered_at,
        );
        Ok(())
    }

    /// A broker's heartbeat: renews its session, unfences it once it has caught up, fences it
    /// when it shuts down.
    fn decide_heartbeat(
        &self,
        held: &MutexGuard<'_, ()>,
        id: i32,
        incarnation: Uuid,
        applied_offset: i64,
        shutting_down: bool,
    ) -> Result<HeartbeatAnswer, BrokerError> {
        let decision = {
            let mut sessions = lock(&self.cluster.sessions);
            brokers::decide_heartbeat(
                &self.metadata(),
                &self.controller_config(),
                &mut sessions,
                self.term(),
                Instant::now(),
                id,
                incarnation,
                applied_offset,
                shutting_down,
            )
        };
        let fenced = decision.records.iter().any(|r| matches!(r, MetadataRecord::FenceBroker { .. }));
        let unfenced = decision.records.iter().any(|r| matches!(r, MetadataRecord::UnfenceBroker { .. }));
        let answer = self.settle(held, decision)?;
        if fenced {
            tracing::warn!(broker = id, "broker fenced: it is shutting down");
        } else if unfenced {
            tracing::info!(broker = id, applied_offset, "broker unfenced: it caught up with the metadata");
        }
        Ok(answer)
    }

    /// Commits the fencing of broker `id` with the leader changes it implies.
    pub(crate) fn fence(&self, held: &MutexGuard<'_, ()>, id: i32, why: &str) -> Result<(), BrokerError> {
        let partitions = self.settle(held, brokers::decide_fence(&self.metadata(), &self.controller_config(), id))?;
        tracing::warn!(broker = id, partitions, "broker fenced: {why}");
        Ok(())
    }

    /// The active controller's periodic duties: the cluster's first record, fencing the
    /// brokers whose sessions expired, completing reassignments, the leader balance. Blocking;
    /// does nothing on other nodes.
    pub(crate) fn controller_tick(self: &Arc<Self>) -> Result<(), BrokerError> {
        if self.quorum.leader() != Some(self.quorum.node_id()) {
            return Ok(());
        }
        let held = self.lock_controller();
        if self.quorum.check_active_controller().is_err() {
            return Ok(());
        }
        if self.metadata().cluster_id.is_empty() {
            let init = MetadataRecord::InitCluster { cluster_id: weir_controller::new_cluster_id() };
            self.commit(&held, vec![init])?;
            tracing::info!(cluster_id = %self.cluster_id(), "initialized the cluster");
        }
        let timeout = Duration::from_millis(self.config.broker_session_timeout_ms);
        let expired = lock(&self.cluster.sessions).expired(self.term(), &self.metadata(), Instant::now(), timeout);
        for (id, silent) in expired {
            self.fence(&held, id, &format!("no heartbeat for {} ms", silent.as_millis()))?;
        }
        let completions = reassignment::completions(&self.metadata());
        if !completions.is_empty() {
            let count = completions.len();
            self.commit(&held, completions)?;
            tracing::info!(partitions = count, "partition reassignments completed");
        }
        self.balance_if_due(&held)?;
        let retirements = elastic::retirements(&self.metadata());
        if !retirements.is_empty() {
            self.commit(&held, retirements)?;
            tracing::info!("elastic topics: physical partitions retired, their moves done");
        }
        self.rebalance_leaders_if_due(&held)
    }

    /// Runs [`Broker::controller_tick`] until shutdown, and keeps the liveness watches of the
    /// brokers in line with the metadata while this node leads the quorum.
    pub(crate) fn run_controller(self: &Arc<Self>) {
        if self.config.liveness_watch {
            self.every(super::liveness::SYNC_INTERVAL, |broker| async move { broker.sync_broker_watches() });
        }
        self.every(tick_interval(self.config.broker_session_timeout_ms), |broker| async move {
            match tokio::task::spawn_blocking(move || broker.controller_tick()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "controller: periodic duties failed"),
                Err(e) => tracing::error!(error = %e, "controller: the periodic task failed"),
            }
        });
    }

    /// Runs `tick` every `interval` until the broker shuts down (or is dropped).
    pub(crate) fn every<F, Fut>(self: &Arc<Self>, interval: Duration, tick: F)
    where
        F: Fn(Arc<Broker>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = shutdown.changed() => return,
                }
                let Some(broker) = broker.upgrade() else { return };
                tick(broker).await;
            }
        });
    }

    // ----- partitions --------------------------------------------------------------------------

    /// A leader's ISR proposal (AlterPartition), committed before it counts anywhere.
    fn decide_alter_partition(&self, held: &MutexGuard<'_, ()>, proposal: IsrProposal) -> Result<(), BrokerError> {
        let completes = self.settle(held, isr::decide_alter_partition(&self.metadata(), &proposal)?)?;
        if completes {
            tracing::info!(topic = %proposal.topic, partition = proposal.partition, "reassignment completed: every target replica is in sync");
        }
        Ok(())
    }

    /// Elects leaders of `kind` for `partitions` (all partitions when `None`, reporting only
    /// those that changed or could not).
    fn decide_elect_leaders(
        &self,
        held: &MutexGuard<'_, ()>,
        kind: ElectionType,
        partitions: Option<Vec<(String, i32)>>,
    ) -> Result<Vec<ElectionResult>, BrokerError> {
        let decision = election::decide_elect(&self.metadata(), kind, partitions);
        let elected = decision.records.len();
        let results = self.settle(held, decision)?;
        if elected > 0 {
            tracing::info!(?kind, partitions = elected, "elected leaders");
        }
        Ok(results)
    }

    /// The leader balance check, when `leader.imbalance.check.interval.seconds` has passed
    /// since the last (and `auto.leader.rebalance.enable` is on).
    fn rebalance_leaders_if_due(&self, held: &MutexGuard<'_, ()>) -> Result<(), BrokerError> {
        if !self.config.auto_leader_rebalance_enable {
            return Ok(());
        }
        let interval = Duration::from_secs(self.config.leader_imbalance_check_interval_seconds);
        {
            let mut sessions = lock(&self.cluster.sessions);
            let now = Instant::now();
            let last = *sessions.last_rebalance_check.get_or_insert(now);
            if now.saturating_duration_since(last) < interval {
                return Ok(());
            }
            sessions.last_rebalance_check = Some(now);
        }
        let decision = election::decide_rebalance(&self.metadata(), self.config.leader_imbalance_per_broker_percentage);
        let elected = decision.records.len();
        for (topic, index, outcome) in self.settle(held, decision)? {
            if let Err(e) = outcome {
                tracing::debug!(topic, partition = index, error = %e, "leader rebalance: not moved");
            }
        }
        if elected > 0 {
            tracing::info!(kind = ?ElectionType::Preferred, partitions = elected, "elected leaders");
        }
        Ok(())
    }

    /// The load balance check, when `elastic.balance.interval.ms` has passed since the last (and
    /// `elastic.balance.enable` is on): at most one physical partition starts moving.
    fn balance_if_due(&self, held: &MutexGuard<'_, ()>) -> Result<(), BrokerError> {
        let config = self.config.elastic_balance;
        if !config.enable {
            return Ok(());
        }
        let loads = {
            let mut sessions = lock(&self.cluster.sessions);
            let now = Instant::now();
            let last = *sessions.last_balance_check.get_or_insert(now);
            if now.saturating_duration_since(last) < Duration::from_millis(self.config.elastic_balance_interval_ms) {
                return Ok(());
            }
            sessions.last_balance_check = Some(now);
            sessions.loads.clone()
        };
        let decision = balance::decide_balance(&self.metadata(), &loads, &config);
        let Some((planned, new_leaders)) = self.settle(held, decision)? else { return Ok(()) };
        tracing::info!(
            topic = %planned.topic,
            physical = planned.physical,
            from = planned.from,
            to = planned.to,
            bytes_per_sec = planned.bytes_per_sec,
            "load balance: moving a physical partition"
        );
        if !new_leaders.is_empty() {
            let partitions = new_leaders.iter().map(|s| (planned.topic.clone(), *s)).collect();
            self.decide_elect_leaders(held, ElectionType::Preferred, Some(partitions))?;
        }
        Ok(())
    }

    /// Decides a batch of reassignment changes, committing the accepted ones together.
    fn decide_alter_reassignments(
        &self,
        held: &MutexGuard<'_, ()>,
        targets: Vec<ReassignmentTarget>,
        allow_replication_factor_change: bool,
    ) -> Result<Vec<ReassignmentResult>, BrokerError> {
        let decision = reassignment::decide_alter(&self.metadata(), targets, allow_replication_factor_change);
        let count = decision.records.len();
        let results = self.settle(held, decision)?;
        if count > 0 {
            tracing::info!(partitions = count, "partition reassignments changed");
        }
        Ok(results)
    }

    // ----- asking the controller ---------------------------------------------------------------

    /// Has the active controller unregister broker `id` (Kafka's UnregisterBroker): a stopped
    /// broker that holds no replica leaves the cluster.
    pub async fn unregister_broker(self: &Arc<Self>, id: i32) -> Result<(), BrokerError> {
        match self.control(ControlRequest::UnregisterBroker { id }).await? {
            ControlAnswer::Done => Ok(()),
            other => Err(BrokerError::internal(format!("the controller answered UnregisterBroker with {other:?}"))),
        }
    }

    /// Has the active controller elect leaders of `kind` for `partitions` (every partition when
    /// `None`): one result per partition asked for, or per partition that changed.
    pub async fn elect_leaders(
        self: &Arc<Self>,
        kind: ElectionType,
        partitions: Option<Vec<(String, i32)>>,
    ) -> Result<Vec<ElectionResult>, BrokerError> {
        match self.control(ControlRequest::ElectLeaders { kind, partitions }).await? {
            ControlAnswer::Elected(results) => Ok(results),
            other => Err(BrokerError::internal(format!("the controller answered ElectLeaders with {other:?}"))),
        }
    }

    /// Has the active controller start, replace or cancel these reassignments: one result per
    /// target, in order. `allow_replication_factor_change` false refuses targets with another
    /// number of replicas (AlterPartitionReassignments v1).
    pub async fn alter_partition_reassignments(
        self: &Arc<Self>,
        targets: Vec<ReassignmentTarget>,
        allow_replication_factor_change: bool,
    ) -> Result<Vec<ReassignmentResult>, BrokerError> {
        let request = ControlRequest::AlterReassignments { targets, allow_replication_factor_change };
        match self.control(request).await? {
            ControlAnswer::Reassigned(results) => Ok(results),
            other => Err(BrokerError::internal(format!("the controller answered a reassignment with {other:?}"))),
        }
    }

    /// The reassignments in progress, of `partitions` (topic → partitions) or of all of them,
    /// ordered by topic and partition.
    pub fn list_partition_reassignments(
        &self,
        partitions: Option<&BTreeMap<String, Vec<i32>>>,
    ) -> Vec<OngoingReassignment> {
        reassignment::ongoing(&self.metadata(), partitions)
    }
}
