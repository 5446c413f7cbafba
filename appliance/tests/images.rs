//! The image server and MDB in a running appliance, driven by the real CLI and curl:
//! the Debian minbase images, object streaming, retired names, the watched MDB file,
//! enrolment recorded in the MDB, and the console pages.

mod support;

use std::path::PathBuf;

use support::*;

fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/images")
}

#[test]
fn minbase_images_through_the_cli_and_the_api() {
    require(&["curl", "ip"]);
    let dir = images_dir();
    assert!(
        dir.join("minbase2.tar").exists(),
        "{} is missing: run scripts/test-images.sh (scripts/test.sh does)",
        dir.display()
    );
    let link = Link::new();
    let scratch = Scratch::new(&link.tag);
    let config = base_config(&link, &scratch, "[tftp]\nenabled = false\n");
    let _app = Appliance::start(&link.server, &scratch, &config);
    let filter = scratch.path("filter");
    std::fs::write(
        &filter,
        "# Dominator's defaults\n/tmp/.*\n/var/log/.*\n/var/tmp/.*\n",
    )
    .unwrap();
    let triggers = scratch.path("triggers");
    std::fs::write(
        &triggers,
        "# comment\n[{\"MatchLines\": [\"/etc/ssh/.*\"], \"Service\": \"ssh\", \"DoReload\": true}]\n",
    )
    .unwrap();

    let out = cli_ok(
        &link.server,
        &format!(
            "image add debian/minbase.1 {} --filter {} --triggers {}",
            dir.join("minbase.tar").display(),
            filter.display(),
            triggers.display()
        ),
    );
    assert!(out.contains("image debian/minbase.1 added"), "{out}");
    assert!(out.contains("new objects"), "{out}");
    let first = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.ShowImage?name=debian/minbase.1",
        None,
        &[],
    )
    .json();
    assert!(first["record"]["files"].as_u64().unwrap() > 3000, "{first}");
    assert_eq!(first["missing_objects"], 0);

    // The second image: only what changed is new.
    let add2 = link.server.sh(&format!(
        "PADDOCK_API={PUBLIC_URL} {} image add debian/minbase.2 {} --filter {}",
        env!("CARGO_BIN_EXE_paddock"),
        dir.join("minbase2.tar").display(),
        filter.display()
    ));
    assert!(
        add2.status.success(),
        "{}",
        String::from_utf8_lossy(&add2.stderr)
    );
    let second = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.ShowImage?name=debian/minbase.2",
        None,
        &[],
    )
    .json();
    assert!(
        second["shared_objects"].as_u64().unwrap() > 3000,
        "{second}"
    );
    let changed: u64 = std::fs::read_to_string(dir.join("changed-bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let unique = second["unique_bytes"].as_u64().unwrap();
    assert!(
        unique <= changed,
        "bytes only the second image has ({unique}) exceed the truly changed bytes ({changed})"
    );
    let list = cli_ok(&link.server, "image list");
    assert!(
        list.contains("debian/minbase.1") && list.contains("debian/minbase.2"),
        "{list}"
    );
    let show = cli_ok(&link.server, "image show debian/minbase.2");
    assert!(show.contains("shared"), "{show}");

    // Objects stream back byte for byte; a missing one fails the request.
    let img = http(
        &link.server,
        &scratch,
        "GET",
        "/rpc/ImageServer.GetImage?name=debian/minbase.1",
        None,
        &[],
    )
    .json();
    let ino = img["fs"]["paths"]["/etc/debian_version"]
        .as_u64()
        .unwrap()
        .to_string();
    let id = img["fs"]["inodes"][&ino]["object"]
        .as_str()
        .unwrap()
        .to_string();
    let got = scratch.path("objects.bin");
    link.server.sh_ok(&format!(
        "curl -sf -o {} -X POST -d '{{\"objects\":[\"{id}\"]}}' {PUBLIC_URL}/rpc/ObjectServer.GetObjects",
        got.display()
    ));
    let bytes = std::fs::read(&got).unwrap();
    let want = std::fs::read(dir.join("minbase/etc/debian_version")).unwrap();
    assert_eq!(
        u64::from_be_bytes(bytes[..8].try_into().unwrap()),
        want.len() as u64
    );
    assert_eq!(&bytes[8..], &want[..]);
    let missing = http(
        &link.server,
        &scratch,
        "POST",
        "/rpc/ObjectServer.GetObjects",
        Some(&format!("{{\"objects\":[\"{}\"]}}", "ab".repeat(64))),
        &[],
    );
    assert_eq!(missing.status, 404, "{}", missing.body);
    let sizes = http(
        &link.server,
        &scratch,
        "POST",
        "/rpc/ObjectServer.CheckObjects",
        Some(&format!(
            "{{\"objects\":[\"{id}\",\"{}\"]}}",
            "ab".repeat(64)
        )),
        &[],
    )
    .json();
    assert_eq!(sizes["sizes"], serde_json::json!([want.len(), 0]));

    // Bad input: a clear error, nothing recorded.
    let junk = scratch.path("junk.tar");
    std::fs::write(&junk, b"not a tarball at all").unwrap();
    let bad = cli(&link.server, &format!("image add junk {}", junk.display()));
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("tarball was refused"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let bad_filter = scratch.path("bad-filter");
    std::fs::write(&bad_filter, "/ok\n/bad(\n").unwrap();
    let bad = cli(
        &link.server,
        &format!(
            "image add x {} --filter {}",
            junk.display(),
            bad_filter.display()
        ),
    );
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("filter line 2"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(!cli_ok(&link.server, "image list").contains("junk"));

    // Delete: the name is retired; gc frees what only that image used.
    cli_ok(&link.server, "image delete debian/minbase.1");
    let again = cli(
        &link.server,
        &format!(
            "image add debian/minbase.1 {}",
            dir.join("minbase.tar").display()
        ),
    );
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("cannot be used again"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let gc = cli_ok(&link.server, "image gc");
    assert!(gc.contains("deleted"), "{gc}");
    assert!(cli_ok(&link.server, "image check debian/minbase.2").contains("intact"));

    // The console.
    let page = http(&link.server, &scratch, "GET", "/ui/images", None, &[]);
    assert!(
        page.body.contains("debian/minbase.2")
            && page.body.contains("Retired names")
            && page.body.contains("debian/minbase.1"),
        "{}",
        page.body
    );
    let page = http(
        &link.server,
        &scratch,
        "GET",
        "/ui/images/debian/minbase.2",
        None,
        &[],
    );
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("shared with other images") && page.body.contains("/var/log/.*"),
        "{}",
        page.body
    );
}

#[test]
fn the_mdb_file_is_watched_and_enrolment_is_recorded() {
    let lab = MdbLab::start();
    let (server, mdb) = (&lab.link.server, &lab.mdb);
    let machines = || lab.machines();
    let hostnames = || lab.hostnames();
    // Replaced atomically (write, then rename): loaded.
    let write = |text: &str| replace_file(mdb, text);
    write(
        r#"[ {"Hostname": "mailhost", "RequiredImage": "mail.0", "PlannedImage": "mail.1", "Location": "ignored"},
  {"Hostname": "compute0", "IpAddress": "198.18.0.5", "RequiredImage": "debian/minbase.2", "Tags": {"DisableSafetyCheck": ""}} ]"#,
    );
    wait_for("the MDB file", || hostnames() == ["compute0", "mailhost"]);
    // The API adds a machine of its own.
    cli_ok(
        server,
        "mdb set api0 --ip 198.18.0.6 --required-image debian/minbase.2",
    );
    // A half-written file (an in-place writer caught mid-way) changes nothing and is reported.
    std::fs::write(mdb, r#"[ {"Hostname": "mailhost", "RequiredIm"#).unwrap();
    wait_for("the parse error to be reported", || {
        machines()["file"]["last_error"].is_string()
    });
    assert_eq!(hostnames(), ["api0", "compute0", "mailhost"]);
    // The next good file replaces the file's machines and keeps the API's.
    write(r#"[{"Hostname": "compute0", "IpAddress": "198.18.0.7"}]"#);
    wait_for("the new MDB file", || hostnames() == ["api0", "compute0"]);
    let m = machines();
    assert!(m["file"]["last_error"].is_null(), "{m}");
    let text = lab.call("GET", "/rpc/Mdb.GetMdb", None).body;
    let parsed = paddock_image::Mdb::parse(&text).expect("GetMdb is Dominator's JSON");
    assert_eq!(parsed.machines["compute0"].ip_address, "198.18.0.7");
    // A bad machine through the API: refused.
    let r = lab.call(
        "POST",
        "/rpc/Mdb.SetMachine",
        Some(r#"{"IpAddress": "1.2.3.4"}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    // A machine that enrols is recorded, with its address.
    let inv = inventory(&["52:54:00:12:34:99"], 2, 1024, &[10]);
    let r = lab.call("POST", "/v1/continue", Some(&inv.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let uuid = r.json()["uuid"].as_str().unwrap().to_string();
    let entry = machines()["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["machine"]["Hostname"] == uuid.as_str())
        .cloned();
    let entry =
        entry.unwrap_or_else(|| panic!("enrolled node {uuid} not in the MDB: {}", machines()));
    assert_eq!(entry["source"], "inspector");
    assert_eq!(entry["machine"]["IpAddress"], "198.18.0.150");
    assert_eq!(entry["machine"]["Tags"]["NodeUuid"], uuid.as_str());
    cli_ok(server, "mdb delete api0");
    let page = lab.call("GET", "/ui/mdb", None);
    assert!(
        page.body.contains("compute0") && page.body.contains(&uuid) && !page.body.contains("api0"),
        "{}",
        page.body
    );
}
