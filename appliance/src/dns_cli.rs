//! `paddock dns …`: what the appliance's DNS server serves, read from its API.

use clap::Subcommand;

use crate::cli::Client;
use crate::dns::{NamesView, PeerView, RecordView, ZonesView};

#[derive(Subcommand)]
pub enum DnsCmd {
    /// The zones as served: each zone's serial and records, and the names left out.
    Zone {
        /// The whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every record naming a machine (its name or UUID) or a role instance.
    Names { subject: String },
    /// Each secondary and zone: the serial it serves (asked now), and the serial
    /// announced, acknowledged and transferred.
    Peers,
}

pub fn dns(api: &Client, cmd: DnsCmd) -> anyhow::Result<()> {
    match cmd {
        DnsCmd::Zone { json } => {
            let v: ZonesView = api.get("/api/v1/dns/zone")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            for z in &v.zones {
                println!(
                    "; {} serial {} ({} records)",
                    z.apex,
                    z.serial,
                    z.records.len()
                );
                print_records(&z.records);
            }
            for s in &v.skipped {
                println!("; left out: {}: {}", s.what, s.why);
            }
        }
        DnsCmd::Names { subject } => {
            // Only a label can name anything; anything else is refused here, not sent.
            let label = paddock_dns::name::label(&subject)?;
            let v: NamesView = api.get(&format!("/api/v1/dns/names/{label}"))?;
            print_records(&v.records);
        }
        DnsCmd::Peers => {
            let v: Vec<PeerView> = api.get("/api/v1/dns/peers")?;
            if v.is_empty() {
                println!("no secondaries ([dns] secondaries)");
            }
            let or_dash = |s: Option<u32>| s.map_or_else(|| "-".to_string(), |s| s.to_string());
            println!(
                "{:<22} {:<28} {:>11} {:>11} {:>11} {:>11}  state",
                "secondary", "zone", "serves", "announced", "answered", "transferred"
            );
            for p in &v {
                let state = if p.given_up {
                    format!("given up after {} NOTIFYs", p.attempts)
                } else if p.attempts > 0 {
                    format!("{} NOTIFYs unanswered", p.attempts)
                } else {
                    "ok".to_string()
                };
                println!(
                    "{:<22} {:<28} {:>11} {:>11} {:>11} {:>11}  {state}",
                    p.peer,
                    p.zone,
                    or_dash(p.serving),
                    or_dash(p.announcing),
                    or_dash(p.acknowledged),
                    or_dash(p.transferred)
                );
            }
        }
    }
    Ok(())
}

fn print_records(records: &[RecordView]) {
    for r in records {
        println!("{:<48} {:>6} IN {:<5} {}", r.name, r.ttl, r.rtype, r.data);
    }
}
