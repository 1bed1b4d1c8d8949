//! `weir quota list|set|delete`: client quotas (what `kafka-configs.sh --entity-type users
//! --entity-type clients --entity-type ips` manages), by Kafka's keys: `producer_byte_rate`,
//! `consumer_byte_rate`, `request_percentage`, `controller_mutation_rate` and
//! `connection_creation_rate`.

use clap::{Args, Subcommand};
use weir_admin::api::{AlterQuotas, QuotaEntity, Quotas};

use super::{print_json, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct QuotaArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: QuotaCommand,
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// The quotas of the entities having every component given (all without any).
    List(EntityArgs),
    /// Set quotas of an entity: `weir quota set --user alice producer_byte_rate=1048576`.
    Set(SetArgs),
    /// Remove quotas of an entity: the keys given, or all of them.
    Delete(DeleteArgs),
}

/// Who a quota applies to: a user, a client id, both, or an IP address. `<default>` names
/// the default of its type (every user, client id or address without a quota of its own).
#[derive(Debug, Args)]
pub struct EntityArgs {
    /// A user (a SASL user name; ANONYMOUS without SASL, RocketMQ clients included).
    #[arg(long)]
    pub user: Option<String>,
    /// A client id (`client.id`; a RocketMQ client's id).
    #[arg(long)]
    pub client_id: Option<String>,
    /// A client's IP address (for connection_creation_rate).
    #[arg(long, conflicts_with_all = ["user", "client_id"])]
    pub ip: Option<String>,
}

impl EntityArgs {
    fn entity(&self) -> QuotaEntity {
        QuotaEntity { user: self.user.clone(), client_id: self.client_id.clone(), ip: self.ip.clone() }
    }

    fn query(&self) -> Vec<(&'static str, String)> {
        [("user", &self.user), ("client_id", &self.client_id), ("ip", &self.ip)]
            .into_iter()
            .filter_map(|(name, value)| value.clone().map(|v| (name, v)))
            .collect()
    }

    fn require(&self) -> anyhow::Result<()> {
        if self.user.is_none() && self.client_id.is_none() && self.ip.is_none() {
            anyhow::bail!("name the entity: --user, --client-id (or both), or --ip");
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub entity: EntityArgs,
    /// `key=value`, e.g. `producer_byte_rate=1048576` (bytes per second) or
    /// `request_percentage=50` (percent of one thread).
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub quotas: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub entity: EntityArgs,
    /// The keys to remove; none: every quota of the entity.
    #[arg(value_name = "KEY")]
    pub keys: Vec<String>,
}

pub fn run(args: &QuotaArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    let found = match &args.command {
        QuotaCommand::List(entity) => client.get::<Vec<Quotas>>("/v1/quotas", &entity.query())?,
        QuotaCommand::Set(set) => {
            set.entity.require()?;
            let mut request = AlterQuotas { entity: set.entity.entity(), ..AlterQuotas::default() };
            for quota in &set.quotas {
                let Some((key, value)) = quota.split_once('=') else {
                    anyhow::bail!("{quota:?}: expected KEY=VALUE, e.g. producer_byte_rate=1048576");
                };
                let value: f64 =
                    value.trim().parse().map_err(|_| anyhow::anyhow!("{quota:?}: {value:?} is not a number"))?;
                request.set.insert(key.trim().to_string(), value);
            }
            client.post::<_, Vec<Quotas>>("/v1/quotas", &request)?
        }
        QuotaCommand::Delete(delete) => {
            delete.entity.require()?;
            let entity = delete.entity.entity();
            let keys = if delete.keys.is_empty() {
                let existing: Vec<Quotas> = client.get("/v1/quotas", &delete.entity.query())?;
                let own = existing.into_iter().find(|q| q.entity == entity);
                own.map(|q| q.quotas.into_keys().collect()).unwrap_or_default()
            } else {
                delete.keys.clone()
            };
            if keys.is_empty() {
                anyhow::bail!("the entity has no quota to delete");
            }
            let request = AlterQuotas { entity, remove: keys, ..AlterQuotas::default() };
            client.post::<_, Vec<Quotas>>("/v1/quotas", &request)?
        }
    };
    if args.connection.json {
        return print_json(&mut out, &found);
    }
    let mut table = Table::new(&["USER", "CLIENT-ID", "IP", "QUOTA", "VALUE"]);
    for quotas in &found {
        for (key, value) in &quotas.quotas {
            let name = |n: &Option<String>| n.clone().unwrap_or_else(|| "-".to_string());
            table.row(vec![
                name(&quotas.entity.user),
                name(&quotas.entity.client_id),
                name(&quotas.entity.ip),
                key.clone(),
                value.to_string(),
            ]);
        }
    }
    table.write(&mut out)?;
    Ok(())
}
