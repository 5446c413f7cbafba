//! `paddock certs …`: the CA, host and operator certificates, and operator tokens. These
//! commands work on the store named by the configuration (the CA lives there, shared by
//! every host), so they run on an appliance host as root.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use paddock_security::{Permissions, ca};

use crate::access;
use crate::config::{Config, SecurityConfig};
use crate::security;

#[derive(Subcommand)]
pub enum CertsCmd {
    /// Create the CA (first host) or join it (the next hosts), this host's key and
    /// certificate, and an admin operator certificate.
    Init {
        /// More names or addresses this host answers for (repeatable).
        #[arg(long = "san")]
        sans: Vec<String>,
        /// The admin certificate's name (written as NAME.pem and NAME.key); "-" for none.
        #[arg(long, default_value = "admin")]
        admin: String,
    },
    /// Issue a certificate from the CA: CN = NAME, with the methods it may call.
    Issue {
        name: String,
        /// `Service.Method` patterns, comma-separated (globs: `Subd.*`, `*.Get*`).
        #[arg(long)]
        methods: Option<String>,
        /// A role instead of (or besides) methods: admin, read-only, image-creator,
        /// dominator, subd, agent.
        #[arg(long)]
        role: Option<String>,
        /// Groups, comma-separated.
        #[arg(long)]
        groups: Option<String>,
        /// Names or addresses for a server certificate (repeatable).
        #[arg(long = "san")]
        sans: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
        /// Sign this request instead of making a key (the key stays where it was made).
        #[arg(long)]
        csr: Option<PathBuf>,
        /// Where NAME.pem and NAME.key go.
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Make a key and a signing request for NAME (for `certs issue --csr` on a CA host).
    Request {
        name: String,
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Issue an operator token (printed once; only its digest is stored).
    Token(TokenArgs),
    /// The operator tokens: name, methods, expiry (never the tokens).
    Tokens,
    /// Revoke every operator token named NAME.
    Revoke { name: String },
    /// Void every agent token of NODE's machine (a running appliance does it).
    RevokeAgent { node: String },
    /// A new agent-token signing key: every machine's token is void (machines booting now
    /// fail their next call and boot again).
    RotateAgentKey,
    /// This host's certificates and the CA's fingerprint.
    Show,
}

#[derive(clap::Args, Debug)]
pub struct TokenArgs {
    name: String,
    #[arg(long)]
    methods: Option<String>,
    #[arg(long)]
    role: Option<String>,
    #[arg(long, default_value_t = 30)]
    days: i64,
}

impl TokenArgs {
    /// What the token may call: `--role`'s methods and `--methods`, together.
    fn permissions(&self) -> anyhow::Result<Permissions> {
        permissions(self.methods.as_deref(), self.role.as_deref())
    }
}

fn permissions(methods: Option<&str>, role: Option<&str>) -> anyhow::Result<Permissions> {
    let mut list = Vec::new();
    if let Some(r) = role {
        list.push(
            access::role(r)
                .with_context(|| {
                    format!(
                        "--role {r:?}: one of admin, read-only, image-creator, dominator, subd, agent"
                    )
                })?
                .to_string(),
        );
    }
    if let Some(m) = methods {
        list.push(m.to_string());
    }
    if list.is_empty() {
        bail!("give --methods or --role");
    }
    Ok(Permissions::parse_list(&list.join(","))?)
}

/// `certs token|tokens|revoke` against the running appliance on this host.
fn tokens_via_api(cfg: &Config, cmd: CertsCmd) -> anyhow::Result<()> {
    let api = match &cfg.security {
        SecurityConfig::Tls(t) => {
            let read = |name: &str| {
                let p = t.dir.join(name);
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
            };
            let creds = crate::cli::Credentials {
                ca_pem: Some(read(security::CA_FILE)?),
                identity: Some((read("admin.pem")?, read("admin.key")?)),
                token: None,
            };
            crate::cli::client(&t.public_url, &creds)?
        }
        SecurityConfig::Insecure => crate::cli::client(&cfg.public_url, &Default::default())?,
    };
    match cmd {
        CertsCmd::Token(args) => {
            let perms = args.permissions()?;
            let t: security::CreatedToken = api.post(
                "/api/v1/tokens",
                &security::NewToken {
                    name: args.name,
                    methods: perms.patterns().join(","),
                    days: args.days,
                },
            )?;
            println!("{}", t.token);
        }
        CertsCmd::Tokens => {
            let list: Vec<security::TokenRecord> = api.get("/api/v1/tokens")?;
            print_tokens(&list);
        }
        CertsCmd::Revoke { name } => {
            let r: security::Revoked = api.post(
                "/api/v1/tokens/revoke",
                &security::RevokeTokens { name: name.clone() },
            )?;
            println!("revoked {} token(s) named {name}", r.revoked);
        }
        CertsCmd::RevokeAgent { node } => {
            let r: security::RevokedAgent = api.post(
                "/api/v1/agent-tokens/revoke",
                &security::RevokeAgent { node: node.clone() },
            )?;
            println!("voided the agent tokens of {node} ({})", r.macs.join(", "));
        }
        CertsCmd::RotateAgentKey => {
            let _: security::RotateAgentKey = api.post(
                "/api/v1/agent-tokens/rotate",
                &security::RotateAgentKey { rotate: true },
            )?;
            println!("rotated the agent-token key: every outstanding agent token is void");
        }
        _ => bail!("only token commands go through the API"),
    }
    Ok(())
}

fn print_tokens(list: &[security::TokenRecord]) {
    for t in list {
        println!(
            "{:<24} expires {}  {}",
            t.name,
            httpdate::fmt_http_date(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_millis(u64::try_from(t.expires_ms).unwrap_or(0))
            ),
            t.methods.join(",")
        );
    }
}

fn split(list: Option<&str>) -> Vec<String> {
    list.map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

fn write_pair(out: &Path, name: &str, issued: &ca::Issued) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let cert = out.join(format!("{name}.pem"));
    security::write_file(&cert, &issued.cert_pem, 0o644)?;
    println!("certificate {}", cert.display());
    if !issued.key_pem.is_empty() {
        let key = out.join(format!("{name}.key"));
        security::write_file(&key, &issued.key_pem, 0o600)?;
        println!("key         {}", key.display());
    }
    Ok(())
}

/// `certs request`: a key and a certificate request for `name` in `out`, made on the
/// operator's own machine (no appliance and no configuration needed).
pub fn request(name: &str, out: &Path) -> anyhow::Result<()> {
    let (key, csr) = ca::request(name)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    security::write_file(&out.join(format!("{name}.key")), &key, 0o600)?;
    security::write_file(&out.join(format!("{name}.csr")), &csr, 0o644)?;
    println!("key     {}", out.join(format!("{name}.key")).display());
    println!("request {}", out.join(format!("{name}.csr")).display());
    Ok(())
}

/// Runs one `paddock certs` command against the configuration's store.
pub async fn run(cfg: &Config, cmd: CertsCmd) -> anyhow::Result<()> {
    match cmd {
        CertsCmd::Request { name, out } => return request(&name, &out),
        CertsCmd::Show => {
            let SecurityConfig::Tls(t) = &cfg.security else {
                println!("insecure mode: no certificates");
                return Ok(());
            };
            let m = security::host_material(&t.dir)?;
            println!("dir            {}", t.dir.display());
            println!(
                "ca sha256      {}",
                m.ca_fingerprint().map_err(anyhow::Error::msg)?
            );
            let der = &paddock_security::identity::pem_certificates(&m.cert_pem)
                .map_err(anyhow::Error::msg)?[0];
            let id = paddock_security::identity::from_certificate(der)?;
            println!(
                "host           {} ({})",
                id.user,
                id.methods.patterns().join(",")
            );
            println!("https          {}", t.public_url);
            return Ok(());
        }
        _ => {}
    }
    // A single-host store has one writer: while `paddock serve` holds it, token commands go
    // through its API (with the admin certificate `certs init` wrote).
    let writes_tokens = matches!(
        cmd,
        CertsCmd::Token(_) | CertsCmd::Tokens | CertsCmd::Revoke { .. }
    );
    // Agent tokens live in a running appliance's hosts: always through its API.
    let agent_tokens = matches!(cmd, CertsCmd::RevokeAgent { .. } | CertsCmd::RotateAgentKey);
    if agent_tokens
        || (writes_tokens
            && cfg.cluster.is_none()
            && crate::cluster::store_lock(&cfg.data_dir, cfg.cluster.as_ref())?.is_none())
    {
        return tokens_via_api(cfg, cmd);
    }
    let store = crate::cluster::open_store(&cfg.data_dir, cfg.cluster.as_ref()).await?;
    match cmd {
        CertsCmd::Init { sans, admin } => {
            let admin = (admin != "-").then_some(admin.as_str());
            let r = security::init(store.as_ref(), &cfg.reach(), &sans, admin).await?;
            println!(
                "{} the CA; sha256 {}",
                if r.created_ca { "created" } else { "joined" },
                r.ca_fingerprint
            );
            println!(
                "host certificate {} for {}",
                r.dir.join(security::HOST_CERT).display(),
                r.sans.join(", ")
            );
            if let Some((c, k)) = r.admin {
                println!("admin certificate {} and key {}", c.display(), k.display());
            }
        }
        CertsCmd::Issue {
            name,
            methods,
            role,
            groups,
            sans,
            days,
            csr,
            out,
        } => {
            let perms = permissions(methods.as_deref(), role.as_deref())?;
            let csr_pem = csr
                .as_ref()
                .map(|p| {
                    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
                })
                .transpose()?;
            let req = ca::Request {
                name: name.clone(),
                methods: perms.patterns().to_vec(),
                groups: split(groups.as_deref()),
                sans,
                days,
            };
            let issued = security::issue(store.as_ref(), &req, csr_pem.as_deref()).await?;
            write_pair(&out, &name, &issued)?;
        }
        CertsCmd::Token(args) => {
            let perms = args.permissions()?;
            let t = security::create_token(store.as_ref(), &args.name, &perms, args.days).await?;
            println!("{t}");
        }
        CertsCmd::Tokens => print_tokens(&security::list_tokens(store.as_ref()).await?),
        CertsCmd::Revoke { name } => {
            let n = security::revoke_tokens(store.as_ref(), &name).await?;
            if n == 0 {
                bail!("no token named {name:?}");
            }
            println!("revoked {n} token(s) named {name}");
        }
        CertsCmd::Request { .. }
        | CertsCmd::Show
        | CertsCmd::RevokeAgent { .. }
        | CertsCmd::RotateAgentKey => unreachable!("handled above"),
    }
    Ok(())
}
