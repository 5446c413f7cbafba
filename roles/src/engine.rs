//! The planning engine: `plan(spec, census) → Plan`, pure (no clock, no I/O, no randomness).
//!
//! * **Demand.** An edge `p → s` with capacity `c` means one `s` instance serves `c` `p`
//!   instances; the demand on `s` is `ceil(Σ rep(p) / c(p,s))` over its dependers, summed
//!   exactly (a common denominator, not per path). A role needs `max(min, demand)`.
//! * **Minimums** are inferred once, in topological order (dependers first), from the
//!   dependers' minimums: the diamond A(4)→B, A→C, B→C, C→D gives D = 8, not BlacKnight's 12.
//! * **Phase 0**: instances above a role's `max` are stopped.
//! * **Phase 1** (minimum viable): every role, roots first, is brought to what it needs; a
//!   role that runs on a host takes an idle eligible host, else re-purposes a surplus host
//!   of another host-bound role (stop there, start here). If the current dependers cannot be
//!   kept, dependers above their minimum are trimmed to it (orphans stopped) and phase 1 is
//!   tried again; if even the minimums cannot be met the plan is a fail-stop with the reason
//!   and no actions at all.
//! * **Phase 2** (growth): roots by priority (higher first; equal priorities take turns),
//!   one instance at a time, each step all-or-nothing across its dependency chain, with idle
//!   hosts only, until every root is at its max or cannot grow.
//! * **Order**: stops first, dependers before dependees; then starts, dependees before
//!   dependers. Growth that re-creates an orphan of the same role cancels its stop.
//!
//! The same spec and census give the same plan; a census after the plan is applied gives
//! an empty plan.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::model::Host;
use crate::model::{Role, Spec};
use crate::scale::{Decision, ScaleState};

/// A live role instance (its registration's lease is alive).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Instance {
    pub role: String,
    pub id: String,
    /// The host it runs on (always, for roles without dependencies).
    #[serde(default)]
    pub host: Option<String>,
}

/// A metric's value, as an instance registered it: finite (the census refuses others), so
/// it compares and orders as a number.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metric(pub f64);

impl Eq for Metric {}

/// What the planner sees.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Census {
    /// Hosts that may be allocated (eligible by default for every role that runs on a host).
    pub hosts: Vec<Host>,
    pub instances: Vec<Instance>,
    /// Hosts not to start anything on now (a hook failed there recently).
    #[serde(default)]
    pub quarantined: BTreeSet<String>,
    /// What the live instances report: role → instance → metric → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, BTreeMap<String, BTreeMap<String, Metric>>>,
}

impl Census {
    /// `metric` as each live instance of `role` reports it (an instance not in the census,
    /// its lease gone, does not count, whatever it reported).
    pub fn metric(&self, role: &str, metric: &str) -> Vec<f64> {
        let Some(by_instance) = self.metrics.get(role) else {
            return Vec::new();
        };
        self.instances
            .iter()
            .filter(|i| i.role == role)
            .filter_map(|i| by_instance.get(&i.id)?.get(metric))
            .map(|m| m.0)
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Start,
    Stop,
}

/// Why an action is in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Phase 1: restoring minimum viable.
    Minimum,
    /// Phase 1: a surplus host given to a role below its minimum.
    Repurposed,
    /// Phase 2: growing towards max.
    Growth,
    /// More instances than the role's max.
    AboveMax,
    /// A depender its dependees can no longer serve.
    Orphaned,
    /// Restarted on another version by the role's rollout.
    Rollout,
    /// More instances than the role's load wants (`scale`).
    Load,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub kind: Kind,
    pub role: String,
    /// A start's new instance id (`<role>-<n>`, handed to the hook as `i`); a stop's victim.
    pub instance: String,
    pub host: Option<String>,
    /// The role's image, for the start of an image role (the host's required image).
    pub image: Option<String>,
    pub why: Why,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum Outcome {
    /// Every root is at its max.
    Optimal,
    /// Minimum viable holds; some root could grow with more hosts.
    Viable,
    /// Minimum viable cannot be reached: nothing is done.
    FailStop(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleCount {
    pub current: u64,
    /// Declared, or inferred from the dependers' minimums.
    pub minimum: u64,
    pub max: Option<u32>,
    /// After the plan.
    pub target: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub outcome: Outcome,
    pub actions: Vec<Action>,
    pub roles: BTreeMap<String, RoleCount>,
    /// Things the planner passed over (instances of roles the spec does not name …).
    pub notes: Vec<String>,
}

/// A role's dependers' capacities have no common denominator the engine can count in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the capacities of the roles depending on {role} have no common multiple below 2^40")]
pub struct CapacityError {
    pub role: String,
}

const MAX_LCM: u64 = 1 << 40;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The spec as indexed arrays, roles in topological order (dependers first).
struct Graph<'a> {
    roles: Vec<&'a Role>,
    index: BTreeMap<&'a str, usize>,
    /// r → (s, capacity) for each dependee s.
    dependees: Vec<Vec<(usize, u32)>>,
    /// s → (p, capacity) for each depender p.
    dependers: Vec<Vec<(usize, u32)>>,
    /// Per role: the least common multiple of its dependers' capacities.
    lcm: Vec<u64>,
    /// Per role: the count its load wants (`scale`), if it has one.
    goal: Vec<Option<u64>>,
}

impl<'a> Graph<'a> {
    fn new(spec: &'a Spec) -> Result<Self, CapacityError> {
        let order = spec.order();
        let roles: Vec<&Role> = order.iter().map(|n| &spec.roles[*n]).collect();
        let index: BTreeMap<&str, usize> = roles
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.as_str(), i))
            .collect();
        let mut dependees = vec![Vec::new(); roles.len()];
        let mut dependers = vec![Vec::new(); roles.len()];
        for (i, r) in roles.iter().enumerate() {
            for (d, cap) in &r.depends {
                if let Some(&s) = index.get(d.as_str()) {
                    dependees[i].push((s, *cap));
                    dependers[s].push((i, *cap));
                }
            }
        }
        let mut lcm = vec![1u64; roles.len()];
        for (s, ps) in dependers.iter().enumerate() {
            for &(_, cap) in ps {
                let c = u64::from(cap);
                let l = lcm[s] / gcd(lcm[s], c) * c;
                if l > MAX_LCM {
                    return Err(CapacityError {
                        role: roles[s].name.clone(),
                    });
                }
                lcm[s] = l;
            }
        }
        Ok(Graph {
            goal: vec![None; roles.len()],
            roles,
            index,
            dependees,
            dependers,
            lcm,
        })
    }

    /// `ceil(Σ rep(p) / cap(p,s))`, exactly.
    fn demand(&self, rep: &[u64], s: usize) -> u64 {
        let l = u128::from(self.lcm[s]);
        let num: u128 = self.dependers[s]
            .iter()
            .map(|&(p, cap)| u128::from(rep[p]) * (l / u128::from(cap)))
            .sum();
        u64::try_from(num.div_ceil(l)).unwrap_or(u64::MAX)
    }

    fn needed(&self, rep: &[u64], r: usize) -> u64 {
        u64::from(self.roles[r].min).max(self.demand(rep, r))
    }

    fn minimums(&self) -> Vec<u64> {
        let mut min = vec![0u64; self.roles.len()];
        for r in 0..self.roles.len() {
            min[r] = self.needed(&min, r);
        }
        min
    }

    fn max(&self, r: usize) -> u64 {
        self.roles[r].max.map_or(u64::MAX, u64::from)
    }

    /// How far growth takes the role: its load's count when it scales, else its max.
    fn limit(&self, r: usize) -> u64 {
        self.goal[r].map_or(self.max(r), |g| g.min(self.max(r)))
    }

    /// Roles that grow in phase 2: the roots, and every role its load sizes.
    fn grown(&self, r: usize) -> bool {
        self.dependers[r].is_empty() || self.goal[r].is_some()
    }
}

/// Each role's minimum: declared, or what its dependers' minimums need (topological order).
pub fn minimums(spec: &Spec) -> Result<BTreeMap<String, u64>, CapacityError> {
    let g = Graph::new(spec)?;
    Ok(g.roles
        .iter()
        .zip(g.minimums())
        .map(|(r, m)| (r.name.clone(), m))
        .collect())
}

enum Undo {
    Start {
        role: usize,
        id: String,
        host: Option<usize>,
        was_idle: bool,
    },
    Stop {
        role: usize,
        id: String,
        host: Option<usize>,
        freed: bool,
    },
}

/// The allocation being built, with an undo journal for all-or-nothing steps.
struct Alloc<'g, 'a> {
    g: &'g Graph<'a>,
    rep: Vec<u64>,
    /// Per role: live instance id → host.
    live: Vec<BTreeMap<String, Option<usize>>>,
    /// Per role: ids in the census or started by this plan (never reused within a plan).
    taken: Vec<BTreeSet<String>>,
    next_id: Vec<u64>,
    /// Per role that runs on a host: the hosts it occupies.
    on_hosts: Vec<BTreeSet<usize>>,
    hosts: Vec<String>,
    /// Hosts that are in the census, idle and not quarantined.
    idle: BTreeSet<usize>,
    /// Per host: how many instances occupy it (more than one only when started by hand).
    occupants: Vec<u32>,
    allocatable: Vec<bool>,
    /// Per role: host → eligible (empty for roles that do not run on a host).
    eligible: Vec<Vec<bool>>,
    /// Per role: its eligible hosts, those fewest roles may use first (so a role that only
    /// special hosts suit still finds them), then by name.
    prefer: Vec<Vec<usize>>,
    actions: Vec<Action>,
    undo: Vec<Undo>,
    failure: Option<String>,
}

fn id_key(id: &str) -> (usize, &str) {
    (id.len(), id)
}

impl Alloc<'_, '_> {
    fn start(&mut self, r: usize, host: Option<usize>, why: Why) {
        let role = self.g.roles[r];
        let id = loop {
            let n = self.next_id[r];
            self.next_id[r] += 1;
            let id = format!("{}-{n}", role.name);
            if !self.taken[r].contains(&id) {
                break id;
            }
        };
        self.taken[r].insert(id.clone());
        self.live[r].insert(id.clone(), host);
        self.rep[r] += 1;
        let was_idle = host.is_some_and(|h| self.idle.remove(&h));
        if let Some(h) = host {
            self.on_hosts[r].insert(h);
            self.occupants[h] += 1;
        }
        self.actions.push(Action {
            kind: Kind::Start,
            role: role.name.clone(),
            instance: id.clone(),
            host: host.map(|h| self.hosts[h].clone()),
            image: role.image.clone(),
            why,
        });
        self.undo.push(Undo::Start {
            role: r,
            id,
            host,
            was_idle,
        });
    }

    fn stop(&mut self, r: usize, id: &str, why: Why) {
        let Some(host) = self.live[r].remove(id) else {
            return;
        };
        self.rep[r] -= 1;
        let mut freed = false;
        if let Some(h) = host
            && self.g.roles[r].on_host()
        {
            self.on_hosts[r].remove(&h);
            self.occupants[h] = self.occupants[h].saturating_sub(1);
            if self.allocatable[h] && self.occupants[h] == 0 {
                freed = self.idle.insert(h);
            }
        }
        self.actions.push(Action {
            kind: Kind::Stop,
            role: self.g.roles[r].name.clone(),
            instance: id.to_string(),
            host: host.map(|h| self.hosts[h].clone()),
            image: None,
            why,
        });
        self.undo.push(Undo::Stop {
            role: r,
            id: id.to_string(),
            host,
            freed,
        });
    }

    fn mark(&self) -> usize {
        self.undo.len()
    }

    fn rollback(&mut self, mark: usize) {
        while self.undo.len() > mark {
            self.actions.pop();
            match self.undo.pop() {
                Some(Undo::Start {
                    role,
                    id,
                    host,
                    was_idle,
                }) => {
                    self.live[role].remove(&id);
                    self.taken[role].remove(&id);
                    self.rep[role] -= 1;
                    if let Some(h) = host {
                        self.on_hosts[role].remove(&h);
                        self.occupants[h] -= 1;
                        if was_idle {
                            self.idle.insert(h);
                        }
                    }
                    if let Some(n) = id.rsplit('-').next().and_then(|n| n.parse::<u64>().ok()) {
                        self.next_id[role] = self.next_id[role].min(n);
                    }
                }
                Some(Undo::Stop {
                    role,
                    id,
                    host,
                    freed,
                }) => {
                    self.live[role].insert(id, host);
                    self.rep[role] += 1;
                    if let Some(h) = host
                        && self.g.roles[role].on_host()
                    {
                        self.on_hosts[role].insert(h);
                        self.occupants[h] += 1;
                        if freed {
                            self.idle.remove(&h);
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// The instance to stop first: the highest id (natural order).
    fn victim(&self, r: usize) -> Option<String> {
        self.live[r].keys().max_by_key(|k| id_key(k)).cloned()
    }

    fn fail(&mut self, why: String) -> bool {
        if self.failure.is_none() {
            self.failure = Some(why);
        }
        false
    }

    /// `count` more instances of `r` and whatever its dependees then lack, or `false`
    /// (the caller rolls back).
    fn add(&mut self, r: usize, count: u64, repurpose: bool, why: Why) -> bool {
        let role = self.g.roles[r];
        if self.rep[r].saturating_add(count) > self.g.max(r) {
            return self.fail(format!(
                "{} would need {} instances, above its max {}",
                role.name,
                self.rep[r].saturating_add(count),
                self.g.max(r)
            ));
        }
        if role.on_host() {
            for left in (1..=count).rev() {
                let idle = &self.idle;
                if let Some(h) = self.prefer[r].iter().copied().find(|h| idle.contains(h)) {
                    self.start(r, Some(h), why);
                } else if repurpose && self.repurpose(r) {
                } else {
                    return self.fail(format!(
                        "{} needs {left} more host(s): no idle host it may run on{}",
                        role.name,
                        if repurpose {
                            " and no surplus host of another role to re-purpose"
                        } else {
                            ""
                        }
                    ));
                }
            }
        } else {
            for _ in 0..count {
                self.start(r, None, why);
            }
        }
        for i in 0..self.g.dependees[r].len() {
            let s = self.g.dependees[r][i].0;
            let lack = self.g.needed(&self.rep, s).saturating_sub(self.rep[s]);
            if lack > 0 && !self.add(s, lack, repurpose, why) {
                return false;
            }
        }
        true
    }

    /// Takes a host from a host-bound role with more instances than it needs (lowest
    /// priority first) for `r`: stop there, start `r` there.
    fn repurpose(&mut self, r: usize) -> bool {
        let mut donors: Vec<usize> = (0..self.g.roles.len())
            .filter(|&d| d != r && self.g.roles[d].on_host())
            .collect();
        donors.sort_by_key(|&d| (self.g.roles[d].priority, self.g.roles[d].name.as_str()));
        for d in donors {
            if self.rep[d] <= self.g.needed(&self.rep, d) {
                continue;
            }
            let Some(h) = self.on_hosts[d]
                .iter()
                .copied()
                .find(|&h| self.eligible[r][h] && self.allocatable[h])
            else {
                continue;
            };
            let Some(id) = self.live[d]
                .iter()
                .find(|(_, host)| **host == Some(h))
                .map(|(id, _)| id.clone())
            else {
                continue;
            };
            self.stop(d, &id, Why::Repurposed);
            // The host is idle again; take it back for r.
            self.idle.remove(&h);
            if let Some(Undo::Stop { freed, .. }) = self.undo.last_mut() {
                *freed = false;
            }
            self.start(r, Some(h), Why::Repurposed);
            return true;
        }
        false
    }

    /// Phase 1: every role (roots first) to what it needs.
    fn restore(&mut self) -> bool {
        for r in 0..self.g.roles.len() {
            let lack = self.g.needed(&self.rep, r).saturating_sub(self.rep[r]);
            if lack > 0 && !self.add(r, lack, true, Why::Minimum) {
                return false;
            }
        }
        true
    }

    /// Phase 2: roots (and roles their load sizes) grow by priority, one all-or-nothing
    /// step at a time, idle hosts only, up to their max (a scaled role: its load's count).
    fn grow(&mut self) {
        let mut roots: Vec<usize> = (0..self.g.roles.len())
            .filter(|&r| self.g.grown(r))
            .collect();
        roots.sort_by_key(|&r| (std::cmp::Reverse(self.g.roles[r].priority), r));
        // Every step starts at least one instance on a finite pool of hosts or stops at a
        // finite max, so this ends; the bound only guards against a bug.
        let mut budget = 1_000_000u64;
        for level in roots.chunk_by(|a, b| self.g.roles[*a].priority == self.g.roles[*b].priority) {
            let mut active: Vec<usize> = level.to_vec();
            while !active.is_empty() && budget > 0 {
                active.retain(|&r| {
                    budget = budget.saturating_sub(1);
                    if self.rep[r] >= self.g.limit(r) {
                        return false;
                    }
                    let mark = self.mark();
                    let failure = self.failure.take();
                    let grew = self.add(r, 1, false, Why::Growth);
                    self.failure = failure;
                    if !grew {
                        self.rollback(mark);
                    }
                    grew
                });
            }
        }
    }
}

/// The plan for `spec` given `census`. See the module documentation.
pub fn plan(spec: &Spec, census: &Census) -> Plan {
    plan_with(spec, census, &BTreeMap::new())
}

/// [`plan`], where a role in `goals` (its load's count, from [`crate::scale::desired`]) is
/// kept at that count: instances above it (and above what its dependers need) stop, and
/// phase 2 grows it to it rather than to its max.
pub fn plan_with(spec: &Spec, census: &Census, goals: &BTreeMap<String, u64>) -> Plan {
    let mut g = match Graph::new(spec) {
        Ok(g) => g,
        Err(e) => {
            return Plan {
                outcome: Outcome::FailStop(e.to_string()),
                actions: Vec::new(),
                roles: BTreeMap::new(),
                notes: Vec::new(),
            };
        }
    };
    for (role, goal) in goals {
        if let Some(&r) = g.index.get(role.as_str()) {
            g.goal[r] = Some(*goal);
        }
    }
    let g = g;
    let n = g.roles.len();
    let mut notes = Vec::new();
    // Hosts: the census's, then any an instance names that the census does not list.
    let mut names: BTreeSet<&str> = census.hosts.iter().map(|h| h.name.as_str()).collect();
    for i in &census.instances {
        if let Some(h) = &i.host {
            names.insert(h.as_str());
        }
    }
    let hosts: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let host_index: BTreeMap<&str, usize> =
        names.iter().enumerate().map(|(i, h)| (*h, i)).collect();
    let mut allocatable = vec![false; hosts.len()];
    let mut detail: Vec<Option<&Host>> = vec![None; hosts.len()];
    for h in &census.hosts {
        let i = host_index[h.name.as_str()];
        detail[i] = Some(h);
        allocatable[i] = !census.quarantined.contains(&h.name);
    }
    let eligible: Vec<Vec<bool>> = g
        .roles
        .iter()
        .map(|r| {
            if !r.on_host() {
                return Vec::new();
            }
            detail
                .iter()
                .map(|d| d.is_some_and(|h| r.hosts.matches(h)))
                .collect()
        })
        .collect();
    let mut suitors = vec![0usize; hosts.len()];
    for e in &eligible {
        for (h, ok) in e.iter().enumerate() {
            suitors[h] += usize::from(*ok);
        }
    }
    let prefer: Vec<Vec<usize>> = eligible
        .iter()
        .map(|e| {
            let mut hs: Vec<usize> = (0..e.len()).filter(|&h| e[h]).collect();
            hs.sort_by_key(|&h| (suitors[h], h));
            hs
        })
        .collect();
    let mut a = Alloc {
        g: &g,
        rep: vec![0; n],
        live: vec![BTreeMap::new(); n],
        taken: vec![BTreeSet::new(); n],
        next_id: vec![1; n],
        on_hosts: vec![BTreeSet::new(); n],
        hosts,
        idle: BTreeSet::new(),
        occupants: Vec::new(),
        allocatable,
        eligible,
        prefer,
        actions: Vec::new(),
        undo: Vec::new(),
        failure: None,
    };
    let mut occupied = vec![0u32; a.hosts.len()];
    let mut instances: Vec<&Instance> = census.instances.iter().collect();
    instances.sort();
    instances.dedup();
    for i in instances {
        let host = i.host.as_deref().map(|h| host_index[h]);
        let r = g.index.get(i.role.as_str()).copied();
        // A host is taken by an instance of a role that runs on a host, or of a role the
        // spec does not know (it may be one).
        if let Some(h) = host
            && r.is_none_or(|r| g.roles[r].on_host())
        {
            occupied[h] += 1;
        }
        let Some(r) = r else {
            notes.push(format!(
                "instance {} of role {} (not in the spec) left alone",
                i.id, i.role
            ));
            continue;
        };
        if a.live[r].insert(i.id.clone(), host).is_none() {
            a.rep[r] += 1;
        }
        a.taken[r].insert(i.id.clone());
        if let Some(h) = host
            && g.roles[r].on_host()
        {
            a.on_hosts[r].insert(h);
        }
    }
    a.idle = (0..a.hosts.len())
        .filter(|&h| a.allocatable[h] && occupied[h] == 0)
        .collect();
    a.occupants = occupied;
    let current = a.rep.clone();
    let minimum = g.minimums();

    // Phase 0: above max, or above what its load wants and its dependers need (dependers
    // first).
    for r in 0..n {
        while a.rep[r] > g.max(r) {
            let Some(id) = a.victim(r) else { break };
            a.stop(r, &id, Why::AboveMax);
        }
        if let Some(goal) = g.goal[r] {
            while a.rep[r] > goal.max(g.needed(&a.rep, r)) {
                let Some(id) = a.victim(r) else { break };
                a.stop(r, &id, Why::Load);
            }
        }
    }
    // Phase 1, keeping every current depender; else with the dependers trimmed to their
    // minimums; else fail-stop.
    let base = a.mark();
    if !a.restore() {
        a.rollback(base);
        a.failure = None;
        for (r, &least) in minimum.iter().enumerate() {
            if g.dependees[r].is_empty() {
                continue;
            }
            while a.rep[r] > least {
                let Some(id) = a.victim(r) else { break };
                a.stop(r, &id, Why::Orphaned);
            }
        }
        if !a.restore() {
            let reason = a
                .failure
                .take()
                .unwrap_or_else(|| "minimum viable cannot be reached".into());
            return Plan {
                outcome: Outcome::FailStop(format!("minimum viable cannot be reached: {reason}")),
                actions: Vec::new(),
                roles: counts(&g, &current, &minimum, &current),
                notes,
            };
        }
    }
    a.grow();
    let optimal = (0..n)
        .filter(|&r| g.grown(r))
        .all(|r| a.rep[r] >= g.limit(r));
    let actions = order(&g, net(&g, std::mem::take(&mut a.actions)));
    Plan {
        outcome: if optimal {
            Outcome::Optimal
        } else {
            Outcome::Viable
        },
        actions,
        roles: counts(&g, &current, &minimum, &a.rep),
        notes,
    }
}

/// Every scaled role's decision for a round over `census` at `now_ms`; `states` hold what
/// the last round left, and are updated (a role no longer scaled is forgotten). Its
/// minimum is the engine's (declared, or what its dependers need), its max the declared one.
pub fn decide(
    spec: &Spec,
    census: &Census,
    states: &mut BTreeMap<String, ScaleState>,
    now_ms: i64,
) -> BTreeMap<String, Decision> {
    let minimums = minimums(spec).unwrap_or_default();
    states.retain(|role, _| spec.roles.get(role).is_some_and(|r| r.scale.is_some()));
    let mut out = BTreeMap::new();
    for (name, role) in &spec.roles {
        let Some(scale) = &role.scale else { continue };
        let min = minimums
            .get(name)
            .copied()
            .unwrap_or_else(|| u64::from(role.min));
        let max = role.max.map_or(u64::MAX, u64::from);
        let current = census.instances.iter().filter(|i| i.role == *name).count();
        let current = u64::try_from(current).unwrap_or(u64::MAX);
        let metrics = census.metric(name, &scale.metric);
        let state = states.entry(name.clone()).or_default();
        out.insert(
            name.clone(),
            crate::scale::desired(scale, min, max, current, &metrics, state, now_ms),
        );
    }
    out
}

/// A round's plan: each scaled role's count ([`decide`]), then the engine's plan with those
/// counts. The live round and a replay of its record both come here, so the same spec,
/// census, history and time give the same plan.
pub fn round_plan(
    spec: &Spec,
    census: &Census,
    states: &mut BTreeMap<String, ScaleState>,
    at_ms: i64,
) -> (Plan, BTreeMap<String, Decision>) {
    let decisions = decide(spec, census, states, at_ms);
    let goals = decisions
        .iter()
        .map(|(r, d)| (r.clone(), d.desired))
        .collect();
    (plan_with(spec, census, &goals), decisions)
}

fn counts(
    g: &Graph<'_>,
    current: &[u64],
    minimum: &[u64],
    target: &[u64],
) -> BTreeMap<String, RoleCount> {
    g.roles
        .iter()
        .enumerate()
        .map(|(r, role)| {
            (
                role.name.clone(),
                RoleCount {
                    current: current[r],
                    minimum: minimum[r],
                    max: role.max,
                    target: target[r],
                },
            )
        })
        .collect()
}

/// An orphan stopped and a growth start of the same role (on the same host, for a role that
/// runs on one) cancel out: the orphan stays.
fn net(g: &Graph<'_>, actions: Vec<Action>) -> Vec<Action> {
    let mut drop = vec![false; actions.len()];
    for role in &g.roles {
        let stops: Vec<usize> = (0..actions.len())
            .filter(|&i| {
                actions[i].role == role.name
                    && actions[i].kind == Kind::Stop
                    && actions[i].why == Why::Orphaned
            })
            .collect();
        // The last orphans stopped have the lowest ids, the last starts the highest.
        for &s in stops.iter().rev() {
            let partner = (0..actions.len()).rev().find(|&t| {
                !drop[t]
                    && actions[t].role == role.name
                    && actions[t].kind == Kind::Start
                    && (!role.on_host() || actions[t].host == actions[s].host)
            });
            if let Some(t) = partner {
                drop[s] = true;
                drop[t] = true;
            }
        }
    }
    actions
        .into_iter()
        .zip(drop)
        .filter(|(_, d)| !d)
        .map(|(a, _)| a)
        .collect()
}

/// Stops first, dependers before dependees; then starts, dependees before dependers.
fn order(g: &Graph<'_>, mut actions: Vec<Action>) -> Vec<Action> {
    let n = g.roles.len();
    actions.sort_by_key(|a| {
        let r = g.index.get(a.role.as_str()).copied().unwrap_or(0);
        match a.kind {
            Kind::Stop => (0, r),
            Kind::Start => (1, n - r),
        }
    });
    actions
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Start => "start",
            Kind::Stop => "stop",
        }
    }
}

/// Why an action has no argument vector for its hook.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("role {0} is not in the spec")]
    NoRole(String),
    /// The hook takes `-h`/`--host` (`flag`) and the action names no host.
    #[error("{instance} of {role} has no host for {flag}")]
    NoHost {
        instance: String,
        role: String,
        flag: String,
    },
    #[error("no global argument {0:?}")]
    NoArgument(String),
}

impl Action {
    /// `start db db-1 on h01`.
    pub fn label(&self) -> String {
        match &self.host {
            Some(h) => format!(
                "{} {} {} on {h}",
                self.kind.as_str(),
                self.role,
                self.instance
            ),
            None => format!("{} {} {}", self.kind.as_str(), self.role, self.instance),
        }
    }

    /// The hook's argument vector for this action (BlacKnight's convention: `h` → `-h
    /// <host>`, `host` → `--host <host>`, `i` → `-i <instance>`, `instance` → `--instance
    /// <instance>`, `v`/`version` → the role's version, any other one-letter key `k` → `-k <args[k]>`, a longer one →
    /// `--key <args[key]>`); `None` when the role has no hook for it (an image role). The
    /// first element is the hook's path relative to the hooks directory. The words are
    /// arguments, never shell text.
    pub fn command(&self, spec: &Spec) -> Result<Option<Vec<String>>, CommandError> {
        let Some(role) = spec.roles.get(&self.role) else {
            return Err(CommandError::NoRole(self.role.clone()));
        };
        let hook = match self.kind {
            Kind::Start => &role.start,
            Kind::Stop => &role.stop,
        };
        let Some(hook) = hook else { return Ok(None) };
        hook_argv(hook, spec, role, &self.instance, self.host.as_deref()).map(Some)
    }
}

/// A hook's argument vector for `instance` of `role` on `host` (the convention of
/// [`Action::command`]).
pub fn hook_argv(
    hook: &crate::model::Hook,
    spec: &Spec,
    role: &crate::model::Role,
    instance: &str,
    host: Option<&str>,
) -> Result<Vec<String>, CommandError> {
    let mut argv = vec![hook.path.clone()];
    for key in &hook.args {
        let flag = if key.len() == 1 {
            format!("-{key}")
        } else {
            format!("--{key}")
        };
        let value = match key.as_str() {
            "h" | "host" => host
                .map(str::to_string)
                .ok_or_else(|| CommandError::NoHost {
                    instance: instance.to_string(),
                    role: role.name.clone(),
                    flag: flag.clone(),
                })?,
            "i" | "instance" => instance.to_string(),
            // Checked when the spec was parsed: a role whose hooks take it has one.
            "v" | "version" => role
                .version
                .clone()
                .ok_or_else(|| CommandError::NoArgument(key.clone()))?,
            other => spec
                .args
                .get(other)
                .cloned()
                .ok_or_else(|| CommandError::NoArgument(other.to_string()))?,
        };
        argv.push(flag);
        argv.push(value);
    }
    Ok(argv)
}

/// A census after `plan` was carried out as planned (what the hooks' registrations would
/// give): for tests, the bench and `paddock spec plan --then`.
pub fn applied(census: &Census, plan: &Plan) -> Census {
    let mut next = census.clone();
    for a in &plan.actions {
        match a.kind {
            Kind::Stop => next
                .instances
                .retain(|i| !(i.role == a.role && i.id == a.instance)),
            Kind::Start => next.instances.push(Instance {
                role: a.role.clone(),
                id: a.instance.clone(),
                host: a.host.clone(),
            }),
        }
    }
    next
}
