//! What the birther reads from the disk before it writes anything: the partition table as
//! `sfdisk --json <disk>` prints it, and the signatures as `blkid -p -o export <partition>…`
//! prints them; and from the two, whether a re-image can keep the root file system
//! ([`reuse`]).
//!
//! The input comes from a disk that may hold anything (a foreign system, a half-written
//! table, a crafted file system label), so the parsers take bytes, bound what they accept,
//! return an error that names the line or field at fault, and never panic (fuzzed:
//! `fuzz/fuzz_targets/birther_probe.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::layout::Layout;

/// More than any real table or probe prints (128 partitions of a few hundred bytes each).
pub const MAX_INPUT_BYTES: usize = 1 << 20;

/// A partition table as `sfdisk --json` prints it (util-linux 2.27 and later; `sectorsize`,
/// `firstlba` and `lastlba` only from later versions, so optional).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionTable {
    /// `gpt`, `dos`, …
    pub label: String,
    /// The disk's GUID (GPT) or `0x…` identifier (MBR).
    pub id: Option<String>,
    pub device: Option<String>,
    pub first_lba: Option<u64>,
    pub last_lba: Option<u64>,
    pub sector_size: Option<u32>,
    pub partitions: Vec<TablePartition>,
}

/// One partition; `start` and `size` in sectors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePartition {
    pub node: String,
    pub start: u64,
    pub size: u64,
    /// A GUID on GPT, a hex byte (`83`) on MBR.
    pub type_guid: String,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub attrs: Option<String>,
    pub bootable: bool,
}

/// Why the bytes are not what the tool prints. Each names where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("{what} output is {0} bytes, more than the {MAX_INPUT_BYTES} any disk gives", what = .1)]
    TooLarge(usize, &'static str),
    #[error("sfdisk --json output is not JSON: {0}")]
    Json(String),
    #[error("sfdisk --json output: {0}")]
    Shape(String),
    #[error("blkid -o export output, line {line}: {message}")]
    Blkid { line: usize, message: String },
}

fn shape(msg: impl Into<String>) -> ProbeError {
    ProbeError::Shape(msg.into())
}

/// A field that must be a string.
fn string(obj: &serde_json::Map<String, Value>, key: &str, at: &str) -> Result<String, ProbeError> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(shape(format!("{at}.{key} is {other}, not a string"))),
        None => Err(shape(format!("{at} has no {key}"))),
    }
}

/// A field that may be missing or null; present, `read` checks it.
fn optional<T>(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    read: impl FnOnce(&Value) -> Result<T, ProbeError>,
) -> Result<Option<T>, ProbeError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v).map(Some),
    }
}

fn opt_string(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<String>, ProbeError> {
    optional(obj, key, |_| string(obj, key, at))
}

fn opt_u64(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<u64>, ProbeError> {
    optional(obj, key, |v| {
        v.as_u64()
            .ok_or_else(|| shape(format!("{at}.{key} is {v}, not a whole number of sectors")))
    })
}

fn u64_field(obj: &serde_json::Map<String, Value>, key: &str, at: &str) -> Result<u64, ProbeError> {
    opt_u64(obj, key, at)?.ok_or_else(|| shape(format!("{at} has no {key}")))
}

/// Parses `sfdisk --json <disk>`. A disk with no partition table makes sfdisk fail (its
/// exit status, not this parser, says so).
pub fn parse_sfdisk_json(input: &[u8]) -> Result<PartitionTable, ProbeError> {
    if input.len() > MAX_INPUT_BYTES {
        return Err(ProbeError::TooLarge(input.len(), "sfdisk --json"));
    }
    let v: Value = serde_json::from_slice(input).map_err(|e| ProbeError::Json(e.to_string()))?;
    let table = v
        .get("partitiontable")
        .and_then(Value::as_object)
        .ok_or_else(|| shape("no \"partitiontable\" object at the top"))?;
    let at = "partitiontable";
    if let Some(unit) = opt_string(table, "unit", at)?
        && unit != "sectors"
    {
        return Err(shape(format!("unit is {unit:?}, not \"sectors\"")));
    }
    let sector_size = match opt_u64(table, "sectorsize", at)? {
        None => None,
        Some(s) => Some(
            u32::try_from(s)
                .ok()
                .filter(|s| s.is_power_of_two() && *s >= 512)
                .ok_or_else(|| shape(format!("sectorsize {s} is not a sector size")))?,
        ),
    };
    let parts = match table.get("partitions") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(shape(format!("partitions is {other}, not a list"))),
    };
    let mut partitions = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let at = format!("partitions[{i}]");
        let p = p
            .as_object()
            .ok_or_else(|| shape(format!("{at} is not an object")))?;
        let start = u64_field(p, "start", &at)?;
        let size = u64_field(p, "size", &at)?;
        if start.checked_add(size).is_none() {
            return Err(shape(format!("{at} ends past the largest sector number")));
        }
        let bootable = match p.get("bootable") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(shape(format!("{at}.bootable is {other}, not true/false"))),
        };
        partitions.push(TablePartition {
            node: string(p, "node", &at)?,
            start,
            size,
            type_guid: string(p, "type", &at)?,
            uuid: opt_string(p, "uuid", &at)?,
            name: opt_string(p, "name", &at)?,
            attrs: opt_string(p, "attrs", &at)?,
            bootable,
        });
    }
    Ok(PartitionTable {
        label: string(table, "label", at)?,
        id: opt_string(table, "id", at)?,
        device: opt_string(table, "device", at)?,
        first_lba: opt_u64(table, "firstlba", at)?,
        last_lba: opt_u64(table, "lastlba", at)?,
        sector_size,
        partitions,
    })
}

/// One device's signatures as `blkid -o export` prints them (`DEVNAME`, `TYPE`, `UUID`,
/// `LABEL`, `PTTYPE`, `PART_ENTRY_*` …), values unescaped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signatures {
    pub tags: BTreeMap<String, String>,
}

impl Signatures {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.tags.get(key).map(String::as_str)
    }

    pub fn device(&self) -> Option<&str> {
        self.get("DEVNAME")
    }

    /// The file system (or other signature: `swap`, `linux_raid_member`, …).
    pub fn fs_type(&self) -> Option<&str> {
        self.get("TYPE")
    }

    pub fn uuid(&self) -> Option<&str> {
        self.get("UUID")
    }
}

/// blkid escapes `" \ ' $ ` < >` and space with a backslash in export output; undoes that.
fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `blkid -o export` for one device or several (blank lines between them; each
/// starts with `DEVNAME=` when blkid was given device names). Bytes that are not UTF-8 are
/// replaced (blkid itself prints `M-` forms for them).
pub fn parse_blkid_export(input: &[u8]) -> Result<Vec<Signatures>, ProbeError> {
    if input.len() > MAX_INPUT_BYTES {
        return Err(ProbeError::TooLarge(input.len(), "blkid -o export"));
    }
    let text = String::from_utf8_lossy(input);
    let mut devices = Vec::new();
    let mut current = Signatures::default();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let err = |message: String| ProbeError::Blkid {
            line: line_no,
            message,
        };
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            if !current.tags.is_empty() {
                devices.push(std::mem::take(&mut current));
            }
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| err(format!("{:?} is not KEY=value", clip(line))))?;
        let key_ok = !key.is_empty()
            && key.len() <= 64
            && key
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !key_ok {
            return Err(err(format!(
                "{:?} is not a blkid tag name (A-Z, 0-9, _)",
                clip(key)
            )));
        }
        if key == "DEVNAME" && !current.tags.is_empty() {
            // A new device even without the blank line.
            devices.push(std::mem::take(&mut current));
        }
        if current
            .tags
            .insert(key.to_string(), unescape(value))
            .is_some()
        {
            return Err(err(format!("{key} given twice for one device")));
        }
    }
    if !current.tags.is_empty() {
        devices.push(current);
    }
    Ok(devices)
}

/// At most 80 characters of untrusted text, for a message.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

/// What a re-image does with the disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reuse", rename_all = "snake_case")]
pub enum Reuse {
    /// The disk holds this very layout with an ext4 root: keep the table and the root file
    /// system, turn it into an object cache (fs2objectcache), make only the EFI system
    /// partition anew.
    Root { device: String },
    /// Lay the disk out from scratch (every object of the image crosses the network); why.
    Fresh { reason: String },
}

/// How `table` (as `sfdisk --json` read it) differs from `layout`'s plan: `None` when it is
/// this very layout (after writing it, or on a disk a previous birth laid out).
pub fn mismatch(layout: &Layout, table: &PartitionTable) -> Option<String> {
    if !table.label.eq_ignore_ascii_case("gpt") {
        return Some(format!("the partition table is {:?}, not gpt", table.label));
    }
    if let Some(s) = table.sector_size
        && s != layout.geometry.logical_sector
    {
        return Some(format!(
            "the table was written with {s}-byte sectors, the disk has {}",
            layout.geometry.logical_sector
        ));
    }
    let ours = layout.partitions();
    if table.partitions.len() != ours.len() {
        return Some(format!(
            "the table has {} partitions, the layout {}",
            table.partitions.len(),
            ours.len()
        ));
    }
    for (have, want) in table.partitions.iter().zip(ours) {
        if have.node != want.device {
            return Some(format!(
                "partition {} is {}, expected {}",
                want.number, have.node, want.device
            ));
        }
        if !have.type_guid.eq_ignore_ascii_case(&want.type_guid)
            || have.start != want.start
            || have.size != want.size
        {
            return Some(format!(
                "{} is type {} at sectors {}+{}, the layout has type {} at {}+{}",
                have.node,
                have.type_guid,
                have.start,
                have.size,
                want.type_guid,
                want.start,
                want.size
            ));
        }
    }
    None
}

/// Whether a re-image can keep the root of `layout`: the disk's table (`None`: sfdisk found
/// none) must be exactly the layout, and blkid must see ext4 on its root partition. Anything
/// else — a foreign system, an older layout, a root that is not ext4 — is laid out afresh,
/// with the reason for the timeline.
pub fn reuse(layout: &Layout, table: Option<&PartitionTable>, signatures: &[Signatures]) -> Reuse {
    let fresh = |reason: String| Reuse::Fresh { reason };
    let Some(table) = table else {
        return fresh("the disk has no partition table".into());
    };
    if let Some(m) = mismatch(layout, table) {
        return fresh(format!(
            "the disk is not laid out as Paddock lays it out: {m}"
        ));
    }
    let root = &layout.root.device;
    match signatures
        .iter()
        .find(|s| s.device() == Some(root.as_str()))
        .and_then(Signatures::fs_type)
    {
        Some("ext4") => Reuse::Root {
            device: root.clone(),
        },
        Some(other) => fresh(format!("{root} holds {}, not ext4", clip(other))),
        None => fresh(format!("{root} holds no file system")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Firmware, Geometry, plan};

    /// What `sfdisk --json` (util-linux 2.38) prints for a 2 GiB disk (512-byte sectors) after
    /// `sfdisk` ran the plan's script: the same starts, sizes and types as planned.
    const PADDOCK_TABLE: &str = r#"{
   "partitiontable": {
      "label": "gpt",
      "id": "6F3C2E1A-9B0D-4C8E-A1F2-3D4E5F607182",
      "device": "/dev/vda",
      "unit": "sectors",
      "firstlba": 2048,
      "lastlba": 4194270,
      "sectorsize": 512,
      "partitions": [
         {
            "node": "/dev/vda1",
            "start": 2048,
            "size": 2048,
            "type": "21686148-6449-6E6F-744E-656564454649",
            "uuid": "0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0",
            "name": "paddock-bios"
         },{
            "node": "/dev/vda2",
            "start": 4096,
            "size": 532480,
            "type": "C12A7328-F81F-11D2-BA4B-00A0C93EC93B",
            "uuid": "1B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0",
            "name": "paddock-esp"
         },{
            "node": "/dev/vda3",
            "start": 536576,
            "size": 3655680,
            "type": "0FC63DAF-8483-4772-8E79-3D69D8477DE4",
            "uuid": "2B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0",
            "name": "paddock-root"
         }
      ]
   }
}"#;

    /// An old MBR disk, as older sfdisk prints it (no sectorsize, no first/last LBA).
    const DOS_TABLE: &str = r#"{"partitiontable": {"label": "dos", "id": "0x8e2a7c1d",
        "device": "/dev/sda", "unit": "sectors", "partitions": [
        {"node": "/dev/sda1", "start": 2048, "size": 997376, "type": "83", "bootable": true},
        {"node": "/dev/sda2", "start": 999424, "size": 40943616, "type": "8e"}]}}"#;

    const BLKID: &str = "DEVNAME=/dev/vda2\n\
        UUID=4A1B-2C3D\n\
        BLOCK_SIZE=512\n\
        TYPE=vfat\n\
        PARTLABEL=paddock-esp\n\
        \n\
        DEVNAME=/dev/vda3\n\
        LABEL=my\\ root\\ \\$HOME\n\
        UUID=5d3f2a10-6b7c-4e8d-9f01-a2b3c4d5e6f7\n\
        BLOCK_SIZE=4096\n\
        TYPE=ext4\n\
        PARTLABEL=paddock-root\n";

    fn layout() -> Layout {
        plan(
            "/dev/vda",
            Geometry {
                size_bytes: 2 << 30,
                logical_sector: 512,
                physical_sector: 512,
            },
            Firmware::Bios,
        )
        .unwrap()
    }

    #[test]
    fn parses_sfdisk_json() {
        let t = parse_sfdisk_json(PADDOCK_TABLE.as_bytes()).unwrap();
        assert_eq!(t.label, "gpt");
        assert_eq!(t.sector_size, Some(512));
        assert_eq!((t.first_lba, t.last_lba), (Some(2048), Some(4194270)));
        assert_eq!(t.partitions.len(), 3);
        assert_eq!(t.partitions[2].node, "/dev/vda3");
        assert_eq!(t.partitions[2].name.as_deref(), Some("paddock-root"));
        assert!(!t.partitions[0].bootable);
        let d = parse_sfdisk_json(DOS_TABLE.as_bytes()).unwrap();
        assert_eq!((d.label.as_str(), d.sector_size), ("dos", None));
        assert_eq!(d.partitions[0].type_guid, "83");
        assert!(d.partitions[0].bootable);
        assert_eq!(d.partitions[1].uuid, None);
        let empty = parse_sfdisk_json(br#"{"partitiontable": {"label": "gpt"}}"#).unwrap();
        assert!(empty.partitions.is_empty());
    }

    /// Garbage in: an error that says where, never a panic.
    #[test]
    fn sfdisk_garbage_table() {
        let big = vec![b' '; MAX_INPUT_BYTES + 1];
        let deep = "[".repeat(100_000);
        let cases: Vec<(&[u8], &str)> = vec![
            (b"", "sfdisk --json output is not JSON"),
            (b"\xff\xfe", "is not JSON"),
            (deep.as_bytes(), "is not JSON"),
            (b"[]", "no \"partitiontable\" object"),
            (br#"{"partitiontable": 3}"#, "no \"partitiontable\" object"),
            (br#"{"partitiontable": {}}"#, "partitiontable has no label"),
            (br#"{"partitiontable": {"label": 7}}"#, "partitiontable.label is 7, not a string"),
            (
                br#"{"partitiontable": {"label": "gpt", "unit": "cylinders"}}"#,
                "unit is \"cylinders\"",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "sectorsize": 1000}}"#,
                "sectorsize 1000 is not a sector size",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "sectorsize": 99999999999}}"#,
                "sectorsize 99999999999",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": {}}}"#,
                "partitions is {}, not a list",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [1]}}"#,
                "partitions[0] is not an object",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "size": 1, "type": "83"}]}}"#,
                "partitions[0] has no start",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "start": -1, "size": 1, "type": "83"}]}}"#,
                "partitions[0].start is -1, not a whole number",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "start": 1.5, "size": 1, "type": "83"}]}}"#,
                "partitions[0].start is 1.5",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "start": 18446744073709551615, "size": 1, "type": "83"}]}}"#,
                "partitions[0] ends past the largest sector number",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "start": 1, "size": 1}]}}"#,
                "partitions[0] has no type",
            ),
            (
                br#"{"partitiontable": {"label": "gpt", "partitions": [{"node": "/dev/a1", "start": 1, "size": 1, "type": "83", "bootable": "yes"}]}}"#,
                "partitions[0].bootable is \"yes\"",
            ),
            (&big, "sfdisk --json output is 1048577 bytes"),
        ];
        for (input, want) in cases {
            let e = parse_sfdisk_json(input).unwrap_err().to_string();
            assert!(
                e.contains(want),
                "{:?}: {e}",
                String::from_utf8_lossy(&input[..input.len().min(60)])
            );
        }
    }

    #[test]
    fn parses_blkid_export() {
        let s = parse_blkid_export(BLKID.as_bytes()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].device(), Some("/dev/vda2"));
        assert_eq!(s[0].fs_type(), Some("vfat"));
        assert_eq!(s[1].fs_type(), Some("ext4"));
        assert_eq!(s[1].uuid(), Some("5d3f2a10-6b7c-4e8d-9f01-a2b3c4d5e6f7"));
        assert_eq!(s[1].get("LABEL"), Some("my root $HOME"), "unescaped");
        // No blank line between devices, CRLF, trailing blank lines: the same devices.
        let squeezed = BLKID.replace("\n\n", "\n").replace('\n', "\r\n") + "\r\n\r\n";
        assert_eq!(parse_blkid_export(squeezed.as_bytes()).unwrap(), s);
        // One device probed by name (no DEVNAME), and nothing at all.
        let one = parse_blkid_export(b"PTUUID=abc\nPTTYPE=gpt\n").unwrap();
        assert_eq!((one.len(), one[0].get("PTTYPE")), (1, Some("gpt")));
        assert_eq!(one[0].device(), None);
        assert!(parse_blkid_export(b"").unwrap().is_empty());
        assert!(parse_blkid_export(b"\n\n").unwrap().is_empty());
        // A value may hold '=' and non-UTF-8 bytes.
        let odd = parse_blkid_export(b"LABEL=a=b\xff\\\n").unwrap();
        assert_eq!(odd[0].get("LABEL"), Some("a=b\u{fffd}"));
    }

    #[test]
    fn blkid_garbage() {
        let big = vec![b'A'; MAX_INPUT_BYTES + 1];
        let cases: Vec<(&[u8], &str)> = vec![
            (
                b"TYPE=ext4\ngarbage\n",
                "line 2: \"garbage\" is not KEY=value",
            ),
            (b"=ext4\n", "line 1: \"\" is not a blkid tag name"),
            (b"type=ext4\n", "line 1: \"type\" is not a blkid tag name"),
            (b"TY PE=ext4\n", "\"TY PE\" is not a blkid tag name"),
            (
                b"TYPE=ext4\nTYPE=xfs\n",
                "line 2: TYPE given twice for one device",
            ),
            (&big, "blkid -o export output is 1048577 bytes"),
        ];
        for (input, want) in cases {
            let e = parse_blkid_export(input).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    /// Table and signatures → what a re-image does.
    #[test]
    fn reuse_table() {
        let l = layout();
        let ours = parse_sfdisk_json(PADDOCK_TABLE.as_bytes()).unwrap();
        let sigs = parse_blkid_export(BLKID.as_bytes()).unwrap();
        let with = |f: &dyn Fn(&mut PartitionTable)| {
            let mut t = ours.clone();
            f(&mut t);
            t
        };
        let xfs = parse_blkid_export(b"DEVNAME=/dev/vda3\nTYPE=xfs\n").unwrap();
        type Row<'a> = (
            &'static str,
            Option<PartitionTable>,
            &'a [Signatures],
            Result<&'static str, &'static str>,
        );
        let rows: Vec<Row> = vec![
            (
                "ours, ext4 root",
                Some(ours.clone()),
                &sigs,
                Ok("/dev/vda3"),
            ),
            (
                "type GUIDs in lower case",
                Some(with(&|t| {
                    for p in &mut t.partitions {
                        p.type_guid = p.type_guid.to_lowercase();
                    }
                })),
                &sigs,
                Ok("/dev/vda3"),
            ),
            (
                "no table",
                None,
                &sigs,
                Err("the disk has no partition table"),
            ),
            (
                "MBR",
                Some(parse_sfdisk_json(DOS_TABLE.as_bytes()).unwrap()),
                &sigs,
                Err(
                    "the disk is not laid out as Paddock lays it out: the partition table is \"dos\", not gpt",
                ),
            ),
            (
                "written with other sectors",
                Some(with(&|t| t.sector_size = Some(4096))),
                &sigs,
                Err("the table was written with 4096-byte sectors, the disk has 512"),
            ),
            (
                "a fourth partition",
                Some(with(&|t| {
                    let mut p = t.partitions[2].clone();
                    p.node = "/dev/vda4".into();
                    t.partitions.push(p);
                })),
                &sigs,
                Err("the table has 4 partitions, the layout 3"),
            ),
            (
                "root elsewhere",
                Some(with(&|t| t.partitions[2].start += 2048)),
                &sigs,
                Err(
                    "/dev/vda3 is type 0FC63DAF-8483-4772-8E79-3D69D8477DE4 at sectors 538624+3655680",
                ),
            ),
            (
                "swapped types",
                Some(with(&|t| t.partitions.swap(0, 1))),
                &sigs,
                Err("partition 1 is /dev/vda2, expected /dev/vda1"),
            ),
            (
                "no signatures",
                Some(ours.clone()),
                &[],
                Err("/dev/vda3 holds no file system"),
            ),
            (
                "xfs root",
                Some(ours.clone()),
                &xfs,
                Err("/dev/vda3 holds xfs, not ext4"),
            ),
        ];
        for (what, table, sigs, want) in rows {
            match (reuse(&l, table.as_ref(), sigs), want) {
                (Reuse::Root { device }, Ok(d)) => assert_eq!(device, d, "{what}"),
                (Reuse::Fresh { reason }, Err(r)) => {
                    assert!(reason.contains(r), "{what}: {reason}")
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
        // The table Paddock reads back after writing matches the plan (the check after sfdisk).
        assert_eq!(mismatch(&l, &ours), None);
    }
}
