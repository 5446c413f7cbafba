//! The pure core of computed files, table by table.

use std::collections::BTreeMap;

use paddock_clock::UnixMs;
use paddock_computed::{
    FileDecl, Generated, HostVars, Machine, MakeError, Site, Source, Templates, VarSources, Vars,
    make_host, merge, render, stale,
};
use serde_json::{Value, json};

fn vars(v: Value) -> Vars {
    v.as_object().cloned().unwrap()
}

#[test]
fn variables_merge_spec_then_role_then_host_then_host_role_two_levels_deep() {
    let sources = VarSources {
        spec: vars(
            json!({"port": 1, "db": {"host": "a", "pool": 5}, "deep": {"x": {"a": 1, "b": 2}}, "only_spec": true}),
        ),
        roles: [(
            "etcd".to_string(),
            vars(json!({"port": 2, "db": {"host": "b"}})),
        )]
        .into(),
        hosts: [(
            "h1".to_string(),
            HostVars {
                vars: vars(json!({"port": 3, "deep": {"x": {"a": 9}}})),
                roles: [("etcd".to_string(), vars(json!({"db": {"pool": 7}})))].into(),
            },
        )]
        .into(),
    };
    let cases = [
        // host-role beats host beats role beats spec; tables merge one level down.
        (
            "h1",
            Some("etcd"),
            json!({"port": 3, "db": {"host": "b", "pool": 7}, "deep": {"x": {"a": 9}}, "only_spec": true}),
        ),
        // Another role: no role or host-role layer.
        (
            "h1",
            Some("web"),
            json!({"port": 3, "db": {"host": "a", "pool": 5}, "deep": {"x": {"a": 9}}, "only_spec": true}),
        ),
        // Another host: no host layers.
        (
            "h2",
            Some("etcd"),
            json!({"port": 2, "db": {"host": "b", "pool": 5}, "deep": {"x": {"a": 1, "b": 2}}, "only_spec": true}),
        ),
        // The machine's own files: spec and host only.
        (
            "h1",
            None,
            json!({"port": 3, "db": {"host": "a", "pool": 5}, "deep": {"x": {"a": 9}}, "only_spec": true}),
        ),
    ];
    for (host, role, want) in cases {
        assert_eq!(
            Value::Object(sources.for_file(host, role)),
            want,
            "{host} {role:?}"
        );
    }
    // A value of another kind replaces a table, and a table a value.
    let a = vars(json!({"k": {"a": 1}, "v": 1}));
    let b = vars(json!({"k": 2, "v": {"b": 2}}));
    assert_eq!(
        Value::Object(merge(&[&a, &b])),
        json!({"k": 2, "v": {"b": 2}})
    );
}

#[test]
fn an_undefined_variable_is_an_error_naming_template_line_and_variable() {
    let data = json!({"machine": {"name": "h1"}, "vars": {"port": 2379}});
    let ok = render(
        "t.j2",
        "name={{ machine.name }}\nport={{ vars.port }}\n",
        &data,
    )
    .unwrap();
    assert_eq!(ok, "name=h1\nport=2379\n", "the trailing newline is kept");
    let cases = [
        (
            "a\nb={{ vars.nope }}\n",
            Some(2),
            "undefined variable vars.nope",
        ),
        (
            "{{ machine.name }} {{ missing }}",
            Some(1),
            "undefined variable missing",
        ),
        (
            "x\ny\n{% for p in peers.etcd %}{{ p }}{% endfor %}",
            Some(3),
            "undefined variable peers.etcd",
        ),
    ];
    for (source, line, message) in cases {
        let e = render("etcd/members.j2", source, &data).unwrap_err();
        assert_eq!(
            (e.template.as_str(), e.line, e.message.as_str()),
            ("etcd/members.j2", line, message),
            "{source:?}"
        );
    }
    let e = render("bad.j2", "{% if %}", &data).unwrap_err();
    assert_eq!((e.template.as_str(), e.line), ("bad.j2", Some(1)));
    assert!(e.to_string().starts_with("bad.j2:1: "), "{e}");
    // Nothing is escaped: a configuration file, not HTML.
    let raw = render("x.html", "{{ v }}", &json!({"v": "<a&b>"})).unwrap();
    assert_eq!(raw, "<a&b>");
}

fn site() -> Site {
    let machine = |name: &str, ip: &str| {
        (
            name.to_string(),
            Machine {
                name: name.into(),
                addresses: vec![ip.into()],
                ..Machine::default()
            },
        )
    };
    let inst =
        |r: &str, i: &str, h: Option<&str>| (r.to_string(), i.to_string(), h.map(str::to_string));
    Site {
        machines: [
            machine("h1", "198.18.0.11"),
            machine("h2", "198.18.0.12"),
            machine("h3", "198.18.0.13"),
        ]
        .into(),
        instances: vec![
            inst("etcd", "etcd-2", Some("h2")),
            inst("etcd", "etcd-1", Some("h1")),
            inst("web", "web-1", Some("h3")),
            inst("app", "app-1", None),
        ],
        dns_names: [(
            ("etcd".to_string(), "etcd-1".to_string()),
            "etcd-1.etcd.paddock.test".to_string(),
        )]
        .into(),
        vars: VarSources::default(),
        roles: ["etcd", "web", "app", "cache"].map(String::from).into(),
    }
}

#[test]
fn a_role_s_peers_are_its_members_with_their_hosts_addresses() {
    let s = site();
    let d = s.data("h1", Some("etcd"));
    assert_eq!(
        d["peers"]["etcd"],
        json!([
            {"instance": "etcd-1", "host": "h1", "addresses": ["198.18.0.11"], "dns_name": "etcd-1.etcd.paddock.test"},
            {"instance": "etcd-2", "host": "h2", "addresses": ["198.18.0.12"], "dns_name": null},
        ])
    );
    // Every role's members, a hostless instance too.
    assert_eq!(
        d["peers"]["app"],
        json!([{"instance": "app-1", "host": null, "addresses": [], "dns_name": null}])
    );
    // A declared role with no instance yet has no members, not an undefined name.
    assert_eq!(d["peers"]["cache"], json!([]));
    assert_eq!(
        render("n.j2", "{{ peers.cache | length }}", &d).unwrap(),
        "0"
    );
    assert_eq!(d["roles"], json!(["etcd"]));
    assert_eq!(
        d["instances"],
        json!([{"role": "etcd", "instance": "etcd-1"}])
    );
    assert_eq!(d["machine"]["name"], "h1");
    assert_eq!(d["role"], "etcd");
    let members = "{% for p in peers.etcd %}{{ p.instance }}=http://{{ p.addresses[0] }}:2380{% if not loop.last %},{% endif %}{% endfor %}";
    assert_eq!(
        render("members.j2", members, &d).unwrap(),
        "etcd-1=http://198.18.0.11:2380,etcd-2=http://198.18.0.12:2380"
    );
}

#[test]
fn a_program_s_output_is_made_again_when_its_inputs_change_or_its_validity_ends() {
    let g = Generated {
        content: b"x".to_vec(),
        inputs: "d1".into(),
        at: UnixMs(10_000),
        valid_secs: Some(60),
    };
    let cases = [
        (None, "d1", 10_000, true),
        (Some(&g), "d1", 10_000, false),
        (Some(&g), "d2", 10_000, true),
        (Some(&g), "d1", 69_999, false),
        (Some(&g), "d1", 70_000, true),
    ];
    for (i, (g, inputs, now, want)) in cases.into_iter().enumerate() {
        assert_eq!(stale(g, inputs, UnixMs(now)), want, "case {i}");
    }
    let forever = Generated {
        valid_secs: None,
        ..g.clone()
    };
    assert!(!stale(Some(&forever), "d1", UnixMs(i64::MAX)));
}

#[test]
fn a_template_change_concerns_only_the_hosts_that_have_its_file() {
    let s = site();
    let decls = vec![
        FileDecl {
            path: "/etc/hostname".into(),
            role: None,
            source: Source::Template("hostname.j2".into()),
        },
        FileDecl {
            path: "/etc/etcd/members".into(),
            role: Some("etcd".into()),
            source: Source::Template("members.j2".into()),
        },
    ];
    let mut templates: BTreeMap<String, String> = [
        (
            "hostname.j2".to_string(),
            "{{ machine.name }}\n".to_string(),
        ),
        (
            "members.j2".to_string(),
            "{{ peers.etcd | length }} members\n".to_string(),
        ),
    ]
    .into();
    let all = |t: &BTreeMap<String, String>| -> BTreeMap<String, BTreeMap<String, String>> {
        ["h1", "h2", "h3"]
            .iter()
            .map(|h| {
                let files = host_files(&s, &decls, t, h)
                    .into_iter()
                    .map(|(p, r)| (p, r.unwrap()))
                    .collect();
                (h.to_string(), files)
            })
            .collect()
    };
    let before = all(&templates);
    assert_eq!(before["h1"]["/etc/hostname"], "h1\n");
    assert_eq!(before["h1"]["/etc/etcd/members"], "2 members\n");
    assert!(
        !before["h3"].contains_key("/etc/etcd/members"),
        "h3 runs no etcd"
    );
    templates.insert(
        "members.j2".into(),
        "members: {{ peers.etcd | map(attribute='instance') | join(' ') }}\n".into(),
    );
    let after = all(&templates);
    let changed: Vec<&str> = ["h1", "h2", "h3"]
        .into_iter()
        .filter(|h| before[*h] != after[*h])
        .collect();
    assert_eq!(changed, ["h1", "h2"]);
    assert_eq!(after["h2"]["/etc/etcd/members"], "members: etcd-1 etcd-2\n");
    // A missing template is an error for the files that use it, not for the rest.
    templates.remove("members.j2");
    let out = host_files(&s, &decls, &templates, "h1");
    assert_eq!(out["/etc/hostname"].as_deref(), Ok("h1\n"));
    let e = out["/etc/etcd/members"].as_ref().unwrap_err();
    assert_eq!(e.to_string(), "members.j2: no such template");
}

/// `host`'s files by path, programs answering with their name and the machine's name.
fn host_files(
    s: &Site,
    decls: &[FileDecl],
    t: &BTreeMap<String, String>,
    host: &str,
) -> BTreeMap<String, Result<String, MakeError>> {
    let templates = Templates::new(t).unwrap();
    let mut run = |name: &str, _: Option<u64>, data: &Value| {
        Ok(format!(
            "{name} for {}\n",
            data["machine"]["name"].as_str().unwrap()
        ))
    };
    make_host(s, decls, &templates, &s.peers(), host, &mut run)
        .into_iter()
        .collect()
}

#[test]
fn the_mdb_and_program_sources_and_a_template_that_does_not_compile() {
    let mut s = site();
    s.machines.get_mut("h1").unwrap().mdb = Some(json!({"hostname": "h1", "tags": {"rack": "r7"}}));
    let decls = vec![
        FileDecl {
            path: "/etc/mdb.json".into(),
            role: None,
            source: Source::Mdb,
        },
        FileDecl {
            path: "/etc/web/token".into(),
            role: Some("web".into()),
            source: Source::Program {
                name: "token".into(),
                valid_secs: Some(60),
            },
        },
    ];
    let h1 = host_files(&s, &decls, &BTreeMap::new(), "h1");
    let mdb: Value = serde_json::from_str(h1["/etc/mdb.json"].as_ref().unwrap()).unwrap();
    assert_eq!(mdb["tags"]["rack"], "r7");
    assert!(!h1.contains_key("/etc/web/token"), "h1 runs no web");
    let h3 = host_files(&s, &decls, &BTreeMap::new(), "h3");
    assert_eq!(h3["/etc/web/token"].as_deref(), Ok("token for h3\n"));
    let bad: BTreeMap<String, String> = [("t.j2".to_string(), "a\n{% for %}".to_string())].into();
    let e = Templates::new(&bad).err().unwrap();
    assert_eq!((e.template.as_str(), e.line), ("t.j2", Some(2)));
}
