//! `weir user create|list|delete`: the users SASL clients log in as, and their SCRAM
//! credentials (kept salted in the cluster metadata).

use clap::{Args, Subcommand};
use weir_admin::api::{CreateUser, DeletedUser, UserInfo};

use super::{print_json, segment, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct UserArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: UserCommand,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user, or set a new password: a SCRAM credential per mechanism, which SCRAM and
    /// PLAIN logins are both checked against.
    Create(CreateUserArgs),
    /// Every user and the mechanisms it can log in with.
    List,
    /// Remove a user's credentials: its next login fails (open connections stay until they
    /// re-authenticate or close).
    Delete(DeleteUserArgs),
}

#[derive(Debug, Args)]
pub struct CreateUserArgs {
    pub name: String,
    /// The password (or set WEIR_USER_PASSWORD, which keeps it out of the process list).
    #[arg(long, env = "WEIR_USER_PASSWORD", hide_env_values = true)]
    pub password: String,
    /// SCRAM-SHA-256 or SCRAM-SHA-512; repeatable. [default: both]
    #[arg(long = "mechanism", value_name = "MECHANISM")]
    pub mechanisms: Vec<String>,
    /// PBKDF2 iterations, 4096 to 16384.
    #[arg(long, default_value_t = 4096)]
    pub iterations: u32,
    /// Let RocketMQ clients sign as this user: access key the user's name, secret key its
    /// password (which the cluster then keeps whole, as RocketMQ does).
    #[arg(long, conflicts_with = "no_rocketmq")]
    pub rocketmq: bool,
    /// Take the user's RocketMQ access away.
    #[arg(long)]
    pub no_rocketmq: bool,
}

#[derive(Debug, Args)]
pub struct DeleteUserArgs {
    pub name: String,
}

pub fn run(args: &UserArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        UserCommand::Create(create) => {
            let request = CreateUser {
                name: create.name.clone(),
                password: create.password.clone(),
                mechanisms: create.mechanisms.clone(),
                iterations: Some(create.iterations),
                rocketmq: if create.rocketmq {
                    Some(true)
                } else if create.no_rocketmq {
                    Some(false)
                } else {
                    None
                },
            };
            let user: UserInfo = client.post("/v1/users", &request)?;
            if args.connection.json {
                return print_json(&mut out, &user);
            }
            write_users(&mut out, &[user])?;
        }
        UserCommand::List => {
            let users: Vec<UserInfo> = client.get("/v1/users", &[])?;
            if args.connection.json {
                return print_json(&mut out, &users);
            }
            write_users(&mut out, &users)?;
        }
        UserCommand::Delete(delete) => {
            let deleted: DeletedUser = client.delete(&format!("/v1/users/{}", segment(&delete.name)))?;
            if args.connection.json {
                return print_json(&mut out, &deleted);
            }
            use std::io::Write;
            writeln!(out, "deleted user {} ({})", deleted.name, deleted.mechanisms.join(", "))?;
        }
    }
    Ok(())
}

fn write_users(out: &mut impl std::io::Write, users: &[UserInfo]) -> anyhow::Result<()> {
    let mut table = Table::new(&["USER", "MECHANISM", "ITERATIONS", "ROCKETMQ"]);
    for user in users {
        for credential in &user.credentials {
            table.row(vec![
                user.name.clone(),
                credential.mechanism.clone(),
                credential.iterations.to_string(),
                if user.rocketmq { "yes" } else { "no" }.to_string(),
            ]);
        }
    }
    table.write(out)?;
    Ok(())
}
