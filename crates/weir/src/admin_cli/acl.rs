//! `weir acl create|list|delete`: the ACLs the authorizer decides by (`authorizer.class.name`),
//! in Kafka's model and with `kafka-acls.sh`'s vocabulary: principals, hosts, operations, and
//! one resource (a topic, a group, a transactional id or the cluster), literal or prefixed.

use clap::{Args, Subcommand};
use weir_admin::api::{Acl, AclResult, CreateAcls, DeletedAcls};

use super::{print_json, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct AclArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: AclCommand,
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Allow (or with --deny, deny) principals operations on a resource: one ACL per principal
    /// and operation.
    Create(CreateAclArgs),
    /// The ACLs matching the options given (every ACL without any).
    List(FilterArgs),
    /// Remove the ACLs matching the options given (at least one is needed).
    Delete(FilterArgs),
}

/// The resource an ACL is about: exactly one of these.
#[derive(Debug, Args)]
#[group(required = false, multiple = false)]
pub struct ResourceArgs {
    /// A topic (`*`: every topic).
    #[arg(long)]
    pub topic: Option<String>,
    /// A consumer group (`*`: every group).
    #[arg(long)]
    pub group: Option<String>,
    /// A transactional id (`*`: every one).
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// The cluster.
    #[arg(long)]
    pub cluster: bool,
}

impl ResourceArgs {
    /// (resource type, name), if one was given.
    fn resource(&self) -> Option<(&'static str, String)> {
        if let Some(topic) = &self.topic {
            Some(("TOPIC", topic.clone()))
        } else if let Some(group) = &self.group {
            Some(("GROUP", group.clone()))
        } else if let Some(id) = &self.transactional_id {
            Some(("TRANSACTIONAL_ID", id.clone()))
        } else if self.cluster {
            Some(("CLUSTER", "kafka-cluster".to_string()))
        } else {
            None
        }
    }
}

#[derive(Debug, Args)]
pub struct CreateAclArgs {
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// `User:<name>` (or `User:*`); repeatable.
    #[arg(long = "principal", required = true)]
    pub principals: Vec<String>,
    /// READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
    /// ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL; repeatable.
    #[arg(long = "operation", required = true)]
    pub operations: Vec<String>,
    /// The client's IP address the ACL applies to.
    #[arg(long, default_value = "*")]
    pub host: String,
    /// The resource name is a prefix: the ACL covers every name starting with it.
    #[arg(long)]
    pub prefixed: bool,
    /// Deny instead of allow (a DENY wins over any ALLOW).
    #[arg(long)]
    pub deny: bool,
}

#[derive(Debug, Args)]
pub struct FilterArgs {
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// Only ACLs of this principal (`User:<name>`).
    #[arg(long)]
    pub principal: Option<String>,
    /// Only ACLs of this operation.
    #[arg(long)]
    pub operation: Option<String>,
    /// Only prefixed ACLs (with a resource: named exactly as given).
    #[arg(long, conflicts_with = "matching")]
    pub prefixed: bool,
    /// Every ACL that applies to the resource: its literal name, `*`, and the prefixes of it.
    #[arg(long)]
    pub matching: bool,
}

impl FilterArgs {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        if let Some((resource_type, name)) = self.resource.resource() {
            query.push(("resource_type", resource_type.to_string()));
            query.push(("resource_name", name));
            let pattern = if self.matching {
                "MATCH"
            } else if self.prefixed {
                "PREFIXED"
            } else {
                "LITERAL"
            };
            query.push(("pattern_type", pattern.to_string()));
        } else if self.prefixed {
            query.push(("pattern_type", "PREFIXED".to_string()));
        }
        if let Some(principal) = &self.principal {
            query.push(("principal", principal.clone()));
        }
        if let Some(operation) = &self.operation {
            query.push(("operation", operation.clone()));
        }
        query
    }
}

pub fn run(args: &AclArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        AclCommand::Create(create) => {
            let Some((resource_type, resource_name)) = create.resource.resource() else {
                anyhow::bail!("name the resource: --topic, --group, --transactional-id or --cluster");
            };
            let mut acls = Vec::new();
            for principal in &create.principals {
                for operation in &create.operations {
                    acls.push(Acl {
                        resource_type: resource_type.to_string(),
                        resource_name: resource_name.clone(),
                        pattern_type: if create.prefixed { "PREFIXED" } else { "LITERAL" }.to_string(),
                        principal: principal.clone(),
                        host: create.host.clone(),
                        operation: operation.to_uppercase().replace('-', "_"),
                        permission: if create.deny { "DENY" } else { "ALLOW" }.to_string(),
                    });
                }
            }
            let results: Vec<AclResult> = client.post("/v1/acls", &CreateAcls { acls })?;
            if args.connection.json {
                print_json(&mut out, &results)?;
            } else {
                let refused: Vec<&AclResult> = results.iter().filter(|r| r.error.is_some()).collect();
                let created: Vec<Acl> = results.iter().filter(|r| r.error.is_none()).map(|r| r.acl.clone()).collect();
                if !created.is_empty() {
                    write_acls(&mut out, &created)?;
                }
                for result in &refused {
                    eprintln!(
                        "refused: {} {} on {} {}: {}",
                        result.acl.principal,
                        result.acl.operation,
                        result.acl.resource_type,
                        result.acl.resource_name,
                        result.error.as_deref().unwrap_or_default()
                    );
                }
            }
            if results.iter().any(|r| r.error.is_some()) {
                anyhow::bail!("some ACLs were refused");
            }
        }
        AclCommand::List(filter) => {
            let acls: Vec<Acl> = client.get("/v1/acls", &filter.query())?;
            if args.connection.json {
                return print_json(&mut out, &acls);
            }
            write_acls(&mut out, &acls)?;
        }
        AclCommand::Delete(filter) => {
            let query = filter.query();
            if query.is_empty() {
                anyhow::bail!("name the ACLs to delete (a resource, --principal or --operation)");
            }
            let deleted: DeletedAcls = client.delete_with_query("/v1/acls", &query)?;
            if args.connection.json {
                return print_json(&mut out, &deleted);
            }
            write_acls(&mut out, &deleted.deleted)?;
            use std::io::Write;
            writeln!(out, "deleted {} ACL(s)", deleted.deleted.len())?;
        }
    }
    Ok(())
}

fn write_acls(out: &mut impl std::io::Write, acls: &[Acl]) -> anyhow::Result<()> {
    let mut table = Table::new(&["PRINCIPAL", "HOST", "PERMISSION", "OPERATION", "RESOURCE", "NAME", "PATTERN"]);
    for acl in acls {
        table.row(vec![
            acl.principal.clone(),
            acl.host.clone(),
            acl.permission.clone(),
            acl.operation.clone(),
            acl.resource_type.clone(),
            acl.resource_name.clone(),
            acl.pattern_type.clone(),
        ]);
    }
    table.write(out)?;
    Ok(())
}
