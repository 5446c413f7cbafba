//! `spec/appliance.toml`'s computed files, rendered as the appliance renders them: the etcd
//! role's member settings come from the census (its live members), not from a hook's
//! command line.

use std::collections::BTreeMap;

use paddock_computed::{Machine, Site, Source, Templates, make_host};
use paddock_roles::Spec;

fn spec_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec")
}

#[test]
fn the_etcd_members_settings_list_every_live_member() {
    let text = std::fs::read_to_string(spec_dir().join("appliance.toml")).unwrap();
    let spec = Spec::parse("spec/appliance.toml", &text).unwrap();
    let templates: BTreeMap<String, String> = spec
        .templates()
        .into_iter()
        .map(|t| {
            let body = std::fs::read_to_string(spec_dir().join("templates").join(&t)).unwrap();
            (t, body)
        })
        .collect();
    assert!(templates.contains_key("etcd/etcd.env.j2"), "{templates:?}");
    let templates = Templates::new(&templates).unwrap();
    let machine = |name: &str, ip: &str| {
        let m = Machine {
            name: name.into(),
            addresses: vec![ip.into()],
            ..Machine::default()
        };
        (name.to_string(), m)
    };
    let member = |i: &str, h: &str| ("etcd".to_string(), i.to_string(), Some(h.to_string()));
    let mut site = Site {
        machines: [
            machine("ctl1", "198.18.0.2"),
            machine("ctl2", "198.18.0.3"),
            machine("ctl3", "198.18.0.4"),
            machine("w1", "198.18.0.10"),
        ]
        .into(),
        instances: vec![member("etcd-1", "ctl1"), member("etcd-2", "ctl2")],
        vars: spec.var_sources(),
        ..Site::default()
    };
    let decls = spec.file_decls();
    assert!(
        decls
            .iter()
            .any(|d| d.source == Source::Template("etcd/etcd.env.j2".into())),
        "{decls:?}"
    );
    let mut run = |_: &str, _: Option<u64>, _: &serde_json::Value| {
        Err(paddock_computed::MakeError::program("p", "none"))
    };
    let env = |site: &Site, host: &str| -> BTreeMap<String, String> {
        let mut run = |_: &str, _: Option<u64>, _: &serde_json::Value| {
            Err(paddock_computed::MakeError::program("p", "none"))
        };
        let made = make_host(site, &decls, &templates, &site.peers(), host, &mut run);
        let (_, content) = made
            .into_iter()
            .find(|(p, _)| p == "/etc/paddock/etcd.env")
            .unwrap_or_else(|| panic!("{host} has no etcd.env"));
        content
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let e = env(&site, "ctl2");
    assert_eq!(e["ETCD_NAME"], "etcd-2");
    assert_eq!(e["ETCD_INITIAL_CLUSTER_TOKEN"], "paddock");
    assert_eq!(
        e["ETCD_INITIAL_CLUSTER"],
        "etcd-1=http://198.18.0.2:2380,etcd-2=http://198.18.0.3:2380"
    );
    assert_eq!(
        e["ETCD_LISTEN_CLIENT_URLS"],
        "http://198.18.0.3:2379,http://127.0.0.1:2379"
    );
    // A member added: every member's list has it; a machine without etcd has no file.
    site.instances.push(member("etcd-3", "ctl3"));
    assert!(env(&site, "ctl1")["ETCD_INITIAL_CLUSTER"].ends_with(",etcd-3=http://198.18.0.4:2380"));
    let w1 = make_host(&site, &decls, &templates, &site.peers(), "w1", &mut run);
    assert!(
        w1.iter().all(|(p, _)| p != "/etc/paddock/etcd.env"),
        "{w1:?}"
    );
}
