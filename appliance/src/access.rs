//! Which `Service.Method` every HTTP route is, and who may call it. Pure: a
//! request's method and path in, a decision out; `security.rs` is the shell that applies it.
//!
//! Dominator's RPC routes (`/rpc/Service.Method`) are their own names. The Inspector API,
//! `/api/v1` and the console map to names in the same form (`Introspection.Start`,
//! `Nodes.Patch`, `Provisioning.Reimage` …); a console form is the method it performs. A
//! route not in this table is `Http.Unlisted`, which only `*.*` (admin) matches, so a route
//! added without a line here is closed, never open.

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, on either listener: boot scripts and assets, the CA, health, version
    /// discovery, the console's script and login page.
    Public,
    /// A caller who may call `method`; `mutates` calls are audited.
    Method { method: &'static str, mutates: bool },
    /// The ramdisk agent's routes: a caller who may call `method`, or the agent's per-boot
    /// token (which speaks for its own machine alone); `mutates` calls are audited.
    Agent { method: &'static str, mutates: bool },
}

impl Access {
    /// The `Service.Method` (empty for public routes).
    pub fn method(self) -> &'static str {
        match self {
            Access::Method { method, .. } | Access::Agent { method, .. } => method,
            Access::Public => "",
        }
    }

    /// Whether a call changes something (and is audited).
    pub fn mutates(self) -> bool {
        match self {
            Access::Method { mutates, .. } | Access::Agent { mutates, .. } => mutates,
            Access::Public => false,
        }
    }
}

/// The read-only operator role: every read, named one by one, and never file contents
/// (`ObjectServer.GetObjects`, subd's `GetFiles`), an image's file tree
/// (`ImageServer.GetImage`) or a secret. A new read route is not readable until it is
/// added here.
pub const READ_ONLY: &str = "Metrics.Get,Leases.List,Firewall.Get,Cluster.Get,Audit.List,\
Tokens.List,Nodes.List,Nodes.Get,Provisioning.Get,Provision.Show,Power.Get,Power.GetThrottle,\
Spec.Get,Spec.Plan,Spec.ListRounds,Spec.Replay,Spec.ListShadows,Census.List,Introspection.List,Introspection.Get,\
Introspection.GetData,Rules.List,Rules.Get,Console.View,ImageServer.ListImages,\
ImageServer.ShowImage,Mdb.GetMdb,Mdb.ListMachines,Dominator.ListSubs,Dominator.GetSub,\
Dominator.Status,Dominator.GetSubFiles,Dns.Zone,Dns.Names,Dns.Peers,Rollout.List,Rollout.Status,\
Rollout.History";
/// The admin role: everything.
pub const ADMIN: &str = "*.*";
/// Dominator's image-creator role, in our names.
pub const IMAGE_CREATOR: &str =
    "ImageServer.AddImage,ImageServer.CheckImage,ImageServer.ListImages,ObjectServer.CheckObjects";
/// What the dominator needs on a sub.
pub const DOMINATOR: &str = "Subd.*,ImageServer.GetImage,ObjectServer.GetObjects";
/// What a sub needs on the appliance: its objects.
/// What a sub needs: its objects from the appliance, and (for the ramdisk's progress line)
/// Poll on its own subd.
pub const SUBD: &str = "ObjectServer.GetObjects,Subd.Poll";
/// What an agent token grants (and a certificate for an agent would carry).
pub const AGENT: &str = "Introspection.Continue,Agent.*,Provision.*";

/// A role name → its patterns (`paddock certs issue --role`).
pub fn role(name: &str) -> Option<&'static str> {
    Some(match name {
        "admin" => ADMIN,
        "read-only" => READ_ONLY,
        "image-creator" => IMAGE_CREATOR,
        "dominator" => DOMINATOR,
        "subd" => SUBD,
        "agent" => AGENT,
        _ => return None,
    })
}

const fn read(method: &'static str) -> Access {
    Access::Method {
        method,
        mutates: false,
    }
}

const fn agent(method: &'static str, mutates: bool) -> Access {
    Access::Agent { method, mutates }
}

const fn write(method: &'static str) -> Access {
    Access::Method {
        method,
        mutates: true,
    }
}

/// The access a request needs. `http` is the HTTP method in upper case, `path` the request's
/// path without the query.
pub fn access(http: &str, path: &str) -> Access {
    let get = matches!(http, "GET" | "HEAD");
    let post = http == "POST";
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match seg.as_slice() {
        ["healthz"] | [""] | ["v1"] | ["v1", ""] if get => Access::Public,
        ["boot", ..] if get => Access::Public,
        ["ui", "assets", "console.js"] | ["ui", "login"] if get => Access::Public,
        ["ui", "login"] if post => Access::Public,
        ["metrics"] if get => read("Metrics.Get"),

        // Dominator's services: the path is the name.
        ["rpc", name] => match rpc_method(name) {
            Some(m) => Access::Method {
                method: m,
                mutates: !rpc_reads(m),
            },
            None => write("Http.Unlisted"),
        },

        // The ramdisk agent.
        ["v1", "continue"] if post => agent("Introspection.Continue", true),
        ["api", "v1", "agent", "events"] if post => agent("Agent.Event", false),
        ["api", "v1", "agent", _, "next"] if get => agent("Agent.Next", false),
        // It may start a run and issue the machine's subd certificate.
        ["api", "v1", "provision", "next"] if post => agent("Provision.Next", true),
        ["api", "v1", "provision", _] if get => agent("Provision.Show", false),
        ["api", "v1", "provision", _, "report"] if post => agent("Provision.Report", true),
        ["api", "v1", "provision", _, "register"] if post => agent("Provision.Register", true),

        // Ironic Inspector v1.
        ["v1", "introspection"] if get => read("Introspection.List"),
        ["v1", "introspection", _] if get => read("Introspection.Get"),
        ["v1", "introspection", _] if post => write("Introspection.Start"),
        ["v1", "introspection", _, "abort"] if post => write("Introspection.Abort"),
        ["v1", "introspection", _, "data"] if get => read("Introspection.GetData"),
        ["v1", "introspection", _, "data", "unprocessed"] if get => read("Introspection.GetData"),
        ["v1", "introspection", _, "data", "unprocessed"] if post => write("Introspection.Reapply"),
        ["v1", "rules"] if get => read("Rules.List"),
        ["v1", "rules"] if post => write("Rules.Create"),
        ["v1", "rules"] if http == "DELETE" => write("Rules.DeleteAll"),
        ["v1", "rules", _] if get => read("Rules.Get"),
        ["v1", "rules", _] if http == "DELETE" => write("Rules.Delete"),

        // Paddock's API.
        ["api", "v1", "leases"] if get => read("Leases.List"),
        ["api", "v1", "leases6"] if get => read("Leases.List"),
        ["api", "v1", "firewall"] if get => read("Firewall.Get"),
        ["api", "v1", "cluster"] if get => read("Cluster.Get"),
        ["api", "v1", "audit"] if get => read("Audit.List"),
        ["api", "v1", "tokens"] if get => read("Tokens.List"),
        ["api", "v1", "tokens"] if post => write("Tokens.Create"),
        ["api", "v1", "tokens", "revoke"] if post => write("Tokens.Revoke"),
        ["api", "v1", "agent-tokens", "rotate"] if post => write("Tokens.RotateAgentKey"),
        ["api", "v1", "agent-tokens", "revoke"] if post => write("Tokens.RevokeAgent"),
        ["api", "v1", "nodes"] if get => read("Nodes.List"),
        ["api", "v1", "nodes"] if post => write("Nodes.Create"),
        ["api", "v1", "nodes", _] if get => read("Nodes.Get"),
        ["api", "v1", "nodes", _] if http == "PATCH" => write("Nodes.Patch"),
        ["api", "v1", "nodes", _, "provision"] if post => write("Provisioning.Provision"),
        ["api", "v1", "nodes", _, "reimage"] if post => write("Provisioning.Reimage"),
        ["api", "v1", "nodes", _, "clean"] if post => write("Provisioning.Clean"),
        ["api", "v1", "nodes", _, "provisioning"] if get => read("Provisioning.Get"),
        ["api", "v1", "nodes", _, "power"] if get => read("Power.Get"),
        ["api", "v1", "nodes", _, "power"] if post => write("Power.Act"),
        ["api", "v1", "power"] if get => read("Power.GetThrottle"),
        ["api", "v1", "spec"] if get => read("Spec.Get"),
        ["api", "v1", "spec"] if post => write("Spec.Apply"),
        ["api", "v1", "spec", "plan"] if post => read("Spec.Plan"),
        ["api", "v1", "spec", "rounds"] if get => read("Spec.ListRounds"),
        ["api", "v1", "spec", "replay", _] if post => read("Spec.Replay"),
        ["api", "v1", "spec", "shadow"] if get => read("Spec.ListShadows"),
        ["api", "v1", "spec", "shadow", _] if post => write("Spec.ApplyShadow"),
        ["api", "v1", "spec", "shadow", _] if http == "DELETE" => write("Spec.RemoveShadow"),
        // A machine's computed files' contents: not for the read-only role (a program's
        // output may be a secret).
        ["api", "v1", "spec", "render"] if get => read("Spec.Render"),
        ["api", "v1", "census"] if get => read("Census.List"),
        ["api", "v1", "census", "register"] if post => write("Census.Register"),
        ["api", "v1", "census", "keepalive"] if post => write("Census.KeepAlive"),
        ["api", "v1", "census", "revoke"] if post => write("Census.Revoke"),
        ["api", "v1", "census", "status"] if post => write("Census.Status"),
        ["api", "v1", "dns", "zone"] if get => read("Dns.Zone"),
        ["api", "v1", "dns", "names", _] if get => read("Dns.Names"),
        ["api", "v1", "dns", "peers"] if get => read("Dns.Peers"),
        ["api", "v1", "rollouts"] if get => read("Rollout.List"),
        ["api", "v1", "rollouts", _] if get => read("Rollout.Status"),
        ["api", "v1", "rollouts", _, "history"] if get => read("Rollout.History"),
        ["api", "v1", "rollouts", _, "promote"] if post => write("Rollout.Promote"),
        ["api", "v1", "rollouts", _, "pause"] if post => write("Rollout.Pause"),
        ["api", "v1", "rollouts", _, "resume"] if post => write("Rollout.Resume"),
        ["api", "v1", "rollouts", _, "revert"] if post => write("Rollout.Revert"),

        // The console: pages are Console.View, forms are the methods they perform.
        ["ui", "audit"] if get => read("Audit.List"),
        ["ui", ..] if get => read("Console.View"),
        ["ui", "nodes", _, "provision"] if post => write("Provisioning.Provision"),
        ["ui", "nodes", _, "reimage"] if post => write("Provisioning.Reimage"),
        ["ui", "nodes", _, "clean"] if post => write("Provisioning.Clean"),
        ["ui", "nodes", _, "power"] if post => write("Power.Act"),
        ["ui", "nodes", _, "introspect"] if post => write("Introspection.Start"),
        ["ui", "nodes", _, "abort"] if post => write("Introspection.Abort"),
        // The machines list's bulk actions: each needs what the single-machine form does.
        ["ui", "bulk", "power-on" | "power-off" | "power-cycle"] if post => write("Power.Act"),
        ["ui", "bulk", "introspect"] if post => write("Introspection.Start"),
        ["ui", "bulk", "provision"] if post => write("Provisioning.Provision"),
        ["ui", "bulk", "reimage"] if post => write("Provisioning.Reimage"),
        ["ui", "bulk", "clean"] if post => write("Provisioning.Clean"),
        ["ui", "rules"] if post => write("Rules.Create"),
        ["ui", "rules", _, "delete"] if post => write("Rules.Delete"),
        ["ui", "images"] if post => write("ImageServer.AddImage"),
        ["ui", "images", ..] if post => write("ImageServer.DeleteImage"),
        ["ui", "rollouts", _, "promote"] if post => write("Rollout.Promote"),
        ["ui", "rollouts", _, "pause"] if post => write("Rollout.Pause"),
        ["ui", "rollouts", _, "resume"] if post => write("Rollout.Resume"),
        ["ui", "rollouts", _, "revert"] if post => write("Rollout.Revert"),
        ["ui", "subs"] if post => write("Dominator.Pause"),
        ["ui", "subs", _, "pause"] if post => write("Dominator.PauseSub"),
        ["ui", "subs", _, "image"] if post => write("Mdb.SetMachine"),
        _ if get => read("Http.Unlisted"),
        _ => write("Http.Unlisted"),
    }
}

/// `/rpc/<name>`: a `Service.Method` of ours, or `None`.
fn rpc_method(name: &str) -> Option<&'static str> {
    RPC_METHODS.iter().copied().find(|m| *m == name)
}

/// Every `/rpc/` route the appliance serves.
pub const RPC_METHODS: &[&str] = &[
    "ImageServer.AddImage",
    "ImageServer.ListImages",
    "ImageServer.GetImage",
    "ImageServer.ShowImage",
    "ImageServer.DeleteImage",
    "ImageServer.ChangeImageExpiration",
    "ImageServer.CheckImage",
    "ImageServer.DeleteUnreferencedObjects",
    "ObjectServer.CheckObjects",
    "ObjectServer.GetObjects",
    "Mdb.GetMdb",
    "Mdb.ListMachines",
    "Mdb.SetMachine",
    "Mdb.DeleteMachine",
    "Dominator.ListSubs",
    "Dominator.GetSub",
    "Dominator.Status",
    "Dominator.Pause",
    "Dominator.Resume",
    "Dominator.PauseSub",
    "Dominator.ResumeSub",
    "Dominator.ClearSafety",
    "Dominator.UpdateSub",
    "Dominator.GetSubFiles",
];

/// RPC methods that change nothing (not audited).
fn rpc_reads(m: &str) -> bool {
    let method = m.split_once('.').map_or(m, |(_, m)| m);
    ["Get", "List", "Show", "Check", "Status"]
        .iter()
        .any(|p| method.starts_with(p))
}

/// Who is asking, as far as the decision is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// TLS is off: every call is allowed (Dominator's insecure mode).
    Insecure,
    /// No certificate, no token.
    Anonymous,
    /// A certificate or operator token granting these patterns.
    Granted(&'a paddock_security::Permissions),
    /// A valid agent token (its machine is checked by the route).
    AgentToken,
    /// A presented credential that does not hold: the reason.
    Refused(&'a str),
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: no usable credential for a route that needs one.
    Unauthenticated(String),
    /// 403: the credential does not grant the method.
    Denied(String),
}

/// Decides one call. `noauth_inspector`: Inspector's noauth mode for callers without a
/// certificate (the Inspector v1 API only).
pub fn decide(access: Access, caller: Caller<'_>, path: &str, noauth_inspector: bool) -> Decision {
    let method = match access {
        Access::Public => return Decision::Allow,
        Access::Method { method, .. } | Access::Agent { method, .. } => method,
    };
    match caller {
        Caller::Insecure => Decision::Allow,
        Caller::Granted(p) if p.allows(method) => Decision::Allow,
        Caller::Granted(_) => Decision::Denied(format!("access to method {method} denied")),
        Caller::AgentToken if matches!(access, Access::Agent { .. }) => Decision::Allow,
        Caller::AgentToken => Decision::Denied(format!(
            "access to method {method} denied: an agent token grants only the agent's routes"
        )),
        Caller::Refused(why) => Decision::Unauthenticated(why.to_string()),
        Caller::Anonymous if noauth_inspector && path.starts_with("/v1/") => Decision::Allow,
        Caller::Anonymous => Decision::Unauthenticated(format!(
            "method {method} needs a client certificate or a token (see `paddock certs`)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_security::Permissions;

    #[test]
    fn routes_map_to_methods() {
        for (http, path, want) in [
            ("GET", "/boot/52-54-00-00-00-01.ipxe", Access::Public),
            ("GET", "/boot/assets/vmlinuz", Access::Public),
            ("GET", "/boot/ca.pem", Access::Public),
            ("GET", "/healthz", Access::Public),
            ("GET", "/", Access::Public),
            ("POST", "/boot/x", write("Http.Unlisted")),
            ("POST", "/v1/introspection/n1", write("Introspection.Start")),
            ("GET", "/v1/introspection/n1", read("Introspection.Get")),
            ("DELETE", "/v1/rules", write("Rules.DeleteAll")),
            (
                "POST",
                "/rpc/ImageServer.DeleteImage",
                write("ImageServer.DeleteImage"),
            ),
            (
                "GET",
                "/rpc/ImageServer.GetImage",
                read("ImageServer.GetImage"),
            ),
            (
                "POST",
                "/rpc/ObjectServer.GetObjects",
                read("ObjectServer.GetObjects"),
            ),
            ("POST", "/rpc/Nope.Nope", write("Http.Unlisted")),
            ("PATCH", "/api/v1/nodes/n1", write("Nodes.Patch")),
            (
                "POST",
                "/ui/nodes/n1/reimage",
                write("Provisioning.Reimage"),
            ),
            ("GET", "/ui/nodes/n1", read("Console.View")),
            ("POST", "/ui/bulk/power-off", write("Power.Act")),
            ("POST", "/ui/bulk/clean", write("Provisioning.Clean")),
            ("POST", "/ui/bulk/explode", write("Http.Unlisted")),
            ("PUT", "/api/v1/nodes", write("Http.Unlisted")),
            (
                "POST",
                "/v1/continue",
                agent("Introspection.Continue", true),
            ),
        ] {
            assert_eq!(access(http, path), want, "{http} {path}");
        }
    }

    #[test]
    fn decisions() {
        let admin = Permissions::parse_list(ADMIN).unwrap();
        let ro = Permissions::parse_list(READ_ONLY).unwrap();
        let start = access("POST", "/v1/introspection/n1");
        let get = access("GET", "/v1/introspection/n1");
        let cont = access("POST", "/v1/continue");
        assert_eq!(
            decide(start, Caller::Granted(&admin), "/v1/x", false),
            Decision::Allow
        );
        assert!(matches!(
            decide(start, Caller::Granted(&ro), "/v1/x", false),
            Decision::Denied(m) if m.contains("Introspection.Start")
        ));
        assert_eq!(
            decide(get, Caller::Granted(&ro), "/v1/x", false),
            Decision::Allow
        );
        assert_eq!(
            decide(cont, Caller::AgentToken, "/v1/continue", false),
            Decision::Allow
        );
        assert!(matches!(
            decide(get, Caller::AgentToken, "/v1/x", false),
            Decision::Denied(_)
        ));
        assert!(matches!(
            decide(get, Caller::Anonymous, "/v1/introspection/n1", false),
            Decision::Unauthenticated(_)
        ));
        assert_eq!(
            decide(get, Caller::Anonymous, "/v1/introspection/n1", true),
            Decision::Allow
        );
        assert!(matches!(
            decide(
                access("GET", "/api/v1/nodes"),
                Caller::Anonymous,
                "/api/v1/nodes",
                true
            ),
            Decision::Unauthenticated(_)
        ));
        assert_eq!(
            decide(
                access("GET", "/boot/x.ipxe"),
                Caller::Anonymous,
                "/boot/x.ipxe",
                false
            ),
            Decision::Allow
        );
        assert_eq!(
            decide(start, Caller::Insecure, "/v1/x", false),
            Decision::Allow
        );
        // Every role parses.
        for r in [
            "admin",
            "read-only",
            "image-creator",
            "dominator",
            "subd",
            "agent",
        ] {
            Permissions::parse_list(role(r).unwrap()).unwrap();
        }
    }
}
