//! The loop that keeps the DNS zones: it rebuilds them whenever nodes, leases, census
//! entries or the spec change (watched, not polled; changes within [`DEBOUNCE`] are taken
//! together), when a pending self-removal falls due, and every [`SWEEP`] so that expired
//! leases leave. The server answers from the newest build, swapped in whole.
//!
//! Every host of an appliance serves the same zones under the same serials. The leading
//! host decides who stands in the services (the membership hysteresis is its alone),
//! stamps the serials, and publishes both with a digest of each zone under [`PUBLISHED`].
//! The other hosts build the zones from their copy of the store with the leader's
//! decisions and serve a build only under the leader's serial, once its digest matches;
//! until then they go on serving the last one. A host that has not caught up for
//! [`IN_STEP_GRACE`] (no leader, or a leader that publishes nothing) goes on alone, its
//! serials moving past the published ones; never back. A host that takes over the lead
//! resumes the hysteresis from the published decisions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use paddock_clock::UnixMs;
use paddock_dhcp::{Lease, LeaseState, MacAddr};
use paddock_dns::{
    Carried, Inputs, Machine, Member, Membership, Policy, Report, ServicePort, Stamp, ZoneConfig,
    Zones,
};
use paddock_inspector::node::Node;
use paddock_store::{Op, Store, Txn};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::census::{INSTANCES, InstanceEntry, node_hostname};
use crate::leader::Leadership;
use crate::runtime::Context;

/// Changes this close together are built into one zone.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// The longest the zones go unrebuilt: leases expire without a store event.
const SWEEP: Duration = Duration::from_secs(30);
/// What the leading host serves, for the others to serve the same.
pub const PUBLISHED: &str = "dns/published";
/// How long a host serves its last zones while its build differs from the leader's
/// before it goes on alone: far longer than a leader takes to publish a change, shorter
/// than an election.
const IN_STEP_GRACE: Duration = Duration::from_secs(3);

/// What the zones are built from besides the store (from `[dns]` and `[dhcp]`).
#[derive(Clone, Debug)]
pub struct Sources {
    pub zone: ZoneConfig,
    pub policy: Policy,
    /// A machine's address where it holds no live lease: its DHCP reservation.
    pub reservations: BTreeMap<MacAddr, Ipv4Addr>,
}

/// The leading host's zones and decisions, as published.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Apex → the serial and digest of the zone the leader serves.
    pub zones: BTreeMap<String, PublishedZone>,
    /// Role → the leader's decisions on its instances.
    pub services: BTreeMap<String, PublishedService>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedZone {
    pub serial: u32,
    pub digest: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedService {
    /// Every instance the leader decided on.
    pub known: BTreeSet<String>,
    /// Those in the service's records, each with when it reported down (Unix ms; its
    /// removal pending).
    pub in_service: BTreeMap<String, Option<i64>>,
    /// When the self-removals still inside the window took effect (Unix ms).
    pub removals: Vec<i64>,
}

impl Published {
    fn stamps(&self) -> BTreeMap<String, Stamp> {
        self.zones
            .iter()
            .map(|(apex, z)| {
                let stamp = Stamp {
                    serial: z.serial,
                    digest: z.digest.clone(),
                };
                (apex.clone(), stamp)
            })
            .collect()
    }

    /// The leader's word on an instance: `None` for one it did not know.
    fn in_service(&self, role: &str, instance: &str) -> Option<bool> {
        let s = self.services.get(role)?;
        s.known
            .contains(instance)
            .then(|| s.in_service.contains_key(instance))
    }

    /// The hysteresis where the leader left it.
    fn membership(&self) -> Membership {
        Membership::resume(
            self.services
                .iter()
                .map(|(role, s)| {
                    let carried = Carried {
                        in_service: s
                            .in_service
                            .iter()
                            .map(|(i, down)| (i.clone(), down.map(UnixMs)))
                            .collect(),
                        removals: s.removals.iter().copied().map(UnixMs).collect(),
                    };
                    (role.clone(), carried)
                })
                .collect(),
        )
    }

    /// What a leader publishes: its zones' stamps, the instances it decided on, and its
    /// hysteresis.
    fn of(zones: &Zones, inputs: &Inputs, membership: &Membership) -> Published {
        let zones = zones
            .stamps()
            .into_iter()
            .map(|(apex, s)| {
                let z = PublishedZone {
                    serial: s.serial,
                    digest: s.digest,
                };
                (apex, z)
            })
            .collect();
        let mut services: BTreeMap<String, PublishedService> = membership
            .carried()
            .into_iter()
            .map(|(role, c)| {
                let s = PublishedService {
                    known: BTreeSet::new(),
                    in_service: c
                        .in_service
                        .into_iter()
                        .map(|(i, down)| (i, down.map(|t| t.0)))
                        .collect(),
                    removals: c.removals.into_iter().map(|t| t.0).collect(),
                };
                (role, s)
            })
            .collect();
        for m in &inputs.members {
            services
                .entry(m.role.clone())
                .or_default()
                .known
                .insert(m.instance.clone());
        }
        Published { zones, services }
    }
}

/// Rebuilds the zones on every change until cancelled.
pub async fn keep_zones(
    ctx: Context,
    cfg: Arc<Sources>,
    tx: watch::Sender<Arc<Zones>>,
) -> anyhow::Result<()> {
    let store = ctx.store.clone();
    let prefixes = [
        paddock_inspector::service::records::NODES,
        paddock_dhcp::shell::LEASE_PREFIX,
        INSTANCES,
        crate::roles::SPEC_KEY,
        PUBLISHED,
    ];
    debug_assert_eq!(prefixes[PUBLISHED_WATCH], PUBLISHED);
    let mut watches = Vec::new();
    for p in prefixes {
        watches.push(store.watch(p, 0).await?);
    }
    // While this host leads: the hysteresis it keeps.
    let mut membership: Option<Membership> = None;
    // Since when this host's build has differed from the leader's.
    let mut behind_since: Option<UnixMs> = None;
    let mut leader_rx = ctx.leader.clone();
    loop {
        let now = paddock_clock::now();
        let leadership = leader_rx.borrow_and_update().clone();
        // A host alone has no one to keep in step with.
        let published = match leadership {
            Some(Leadership::Sole) => Published::default(),
            _ => read_published(store.as_ref()).await?,
        };
        let (mut inputs, registrations) = gather(store.as_ref(), &cfg.reservations, now).await?;
        let mut due = None;
        if leadership.is_some() {
            let m = membership.get_or_insert_with(|| published.membership());
            due = m.observe(
                now,
                registrations
                    .iter()
                    .map(|(role, instance, report)| (role.as_str(), instance.as_str(), *report)),
                &cfg.policy,
            );
            for member in &mut inputs.members {
                member.in_service = m.in_service(&member.role, &member.instance);
            }
        } else {
            membership = None;
            let reports: BTreeMap<(&str, &str), Report> = registrations
                .iter()
                .map(|(r, i, report)| ((r.as_str(), i.as_str()), *report))
                .collect();
            for member in &mut inputs.members {
                member.in_service = published
                    .in_service(&member.role, &member.instance)
                    .unwrap_or_else(|| {
                        let key = (member.role.as_str(), member.instance.as_str());
                        reports.get(&key) == Some(&Report::Up)
                    });
            }
        }
        let mut zones = Zones::build(&cfg.zone, &inputs);
        let before = tx.borrow().clone();
        let alone = behind_since.is_some_and(|t| now.since(t) >= IN_STEP_GRACE);
        let own = leadership.is_some() || alone;
        let mut wait = due.map_or(SWEEP, |t| t.since(now).min(SWEEP));
        if zones.stamp_in_step(Some(&before), &published.stamps(), own, now) {
            if alone {
                tracing::warn!("dns: the leader has not published this state; serving it alone");
            }
            behind_since = None;
            if zones != *before {
                let serials: Vec<u32> = zones.zones.iter().map(|z| z.serial).collect();
                tracing::debug!(
                    ?serials,
                    names = zones.zones[0].names(),
                    "dns: zones rebuilt"
                );
                for s in zones.skipped.iter().filter(|s| !before.skipped.contains(s)) {
                    tracing::warn!(what = %s.what, why = %s.why, "dns: left out of the zone");
                }
                tx.send_replace(Arc::new(zones.clone()));
            }
            if let (Some(Leadership::Elected(leader)), Some(m)) = (&leadership, &membership) {
                let mine = Published::of(&zones, &inputs, m);
                if mine != published {
                    let mut txn = Txn::default();
                    txn.compare.push(leader.fence());
                    txn.success
                        .push(Op::put(PUBLISHED, serde_json::to_vec(&mine)?));
                    if !store.txn(txn).await?.succeeded {
                        tracing::debug!("dns: no longer leading; the zones stay unpublished");
                    }
                }
            }
        } else {
            let since = *behind_since.get_or_insert(now);
            wait = wait.min(since.after(IN_STEP_GRACE).since(now));
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let fired = tokio::select! {
                () = tokio::time::sleep_until(deadline) => None,
                ev = next_event(&mut watches) => match ev {
                    Some(i) => Some(i),
                    None => anyhow::bail!("the store's watch ended"),
                },
                // A new leader publishes at once; one that stepped down stops deciding.
                Ok(()) = leader_rx.changed() => None,
                () = ctx.cancel.cancelled() => return Ok(()),
            };
            tokio::time::sleep(DEBOUNCE).await;
            let mut only_published = fired == Some(PUBLISHED_WATCH);
            for (i, w) in watches.iter_mut().enumerate() {
                while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, w.next()).await {
                    only_published &= i == PUBLISHED_WATCH;
                }
            }
            // What a leading host published itself changes nothing it builds from.
            if !(only_published && leadership.is_some()) {
                break;
            }
        }
    }
}

/// The index of the watch of [`PUBLISHED`] among `keep_zones`' watches.
const PUBLISHED_WATCH: usize = 4;

/// The leader's last word (nothing before a leader has published; a record that does not
/// parse is logged and taken as nothing, so that this host goes on alone).
async fn read_published(store: &dyn Store) -> anyhow::Result<Published> {
    let Some(kv) = store.get(PUBLISHED).await? else {
        return Ok(Published::default());
    };
    Ok(serde_json::from_slice(&kv.value).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "dns: the published zones do not parse");
        Published::default()
    }))
}

/// Which of the watches has the next event; `None` once one has ended.
async fn next_event(watches: &mut [paddock_store::Watch]) -> Option<usize> {
    let nexts = watches.iter_mut().map(|w| Box::pin(w.next()));
    let (ev, i, _) = futures_util::future::select_all(nexts).await;
    matches!(ev, Some(Ok(_))).then_some(i)
}

/// The machines as DNS sees them, and the census's instances with their word on their
/// health.
async fn gather(
    store: &dyn Store,
    reservations: &BTreeMap<MacAddr, Ipv4Addr>,
    now: UnixMs,
) -> anyhow::Result<(Inputs, Vec<(String, String, Report)>)> {
    let mut leases: BTreeMap<MacAddr, Lease> = BTreeMap::new();
    let now_secs = u64::try_from(now.secs()).unwrap_or(0);
    for kv in store.range(paddock_dhcp::shell::LEASE_PREFIX).await? {
        let Ok(l) = serde_json::from_slice::<Lease>(&kv.value) else {
            continue;
        };
        if l.state != LeaseState::Bound || l.expires <= now_secs {
            continue;
        }
        // A MAC with several live leases (a moved machine): the one that lasts longest.
        if leases.get(&l.mac).is_none_or(|o| o.expires < l.expires) {
            leases.insert(l.mac, l);
        }
    }
    let mut inputs = Inputs::default();
    for kv in store
        .range(paddock_inspector::service::records::NODES)
        .await?
    {
        let Ok(node) = serde_json::from_slice::<Node>(&kv.value) else {
            continue;
        };
        let macs = || node.pxe_mac.iter().chain(node.macs.iter());
        let ipv4 = macs()
            .find_map(|m| leases.get(m).map(|l| l.ip))
            .or_else(|| macs().find_map(|m| reservations.get(m).copied()));
        inputs.machines.push(Machine {
            name: node_hostname(&node),
            uuid: node.uuid.to_string(),
            ipv4,
            ipv6: None,
        });
    }
    inputs.ports = ports(store).await?;
    let mut registrations = Vec::new();
    for kv in store.range(INSTANCES).await? {
        let Ok(e) = serde_json::from_slice::<InstanceEntry>(&kv.value) else {
            continue;
        };
        let report = if e.says_up() {
            Report::Up
        } else {
            Report::Down
        };
        registrations.push((e.role.clone(), e.instance.clone(), report));
        inputs.members.push(Member {
            role: e.role,
            instance: e.instance,
            host: e.host,
            in_service: false,
        });
    }
    Ok((inputs, registrations))
}

/// Role → the ports its service declares, from the applied spec (none without one; a spec
/// in the store was validated when applied, so one that no longer parses is logged and
/// declares nothing).
async fn ports(store: &dyn Store) -> anyhow::Result<BTreeMap<String, Vec<ServicePort>>> {
    let Some(kv) = store.get(crate::roles::SPEC_KEY).await? else {
        return Ok(BTreeMap::new());
    };
    let stored: crate::roles::StoredSpec = serde_json::from_slice(&kv.value)?;
    let spec = match paddock_roles::Spec::parse(&stored.file, &stored.text) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "dns: the applied spec does not parse; no SRV records");
            return Ok(BTreeMap::new());
        }
    };
    Ok(spec
        .roles
        .into_iter()
        .filter(|(_, r)| !r.dns_ports.is_empty())
        .map(|(name, r)| {
            let ports = r
                .dns_ports
                .iter()
                .map(|p| ServicePort {
                    port: p.port,
                    priority: p.priority,
                    weight: p.weight,
                })
                .collect();
            (name, ports)
        })
        .collect())
}
