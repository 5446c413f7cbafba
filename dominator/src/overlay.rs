//! Computed files (Dominator's computed files): the files of one machine that its image does
//! not hold the same for every machine — its hostname, its role's peers — laid over the
//! image, so the sub's required tree is its image plus them and the planner, the fetch and
//! the drift check treat them like any other file. Pure: the appliance renders the content,
//! stores it as objects and hands each sub its [`Overlay`].

use std::collections::BTreeMap;

use paddock_image::tree::{normalize, parent};
use paddock_image::{Filter, Image, Inode, Mtime, ObjectId};
use serde::{Deserialize, Serialize};

/// One computed file of a machine: its content (an object in the object store) and metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputedFile {
    pub object: ObjectId,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Run by subd against the new content before it replaces the old (the program and its
    /// arguments; the new content's path is appended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Vec<String>>,
}

/// A machine's computed files, by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlay {
    pub files: BTreeMap<String, ComputedFile>,
    /// A file that could not be made, and why: the sub is held (Dominator's "missing
    /// computed file") and the rest of its update waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

/// Why an overlay cannot be laid over an image.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    #[error("{path} is not a normalised absolute path")]
    Path { path: String },
    #[error("{path} is filtered by image {image}'s filter line {line:?}, which names more than it")]
    Filtered {
        path: String,
        image: String,
        line: String,
    },
    #[error("{path} would replace a directory of image {image}")]
    Directory { path: String, image: String },
    #[error("{path}: {parent} is not a directory in image {image}")]
    Parent {
        path: String,
        parent: String,
        image: String,
    },
}

/// `image` with `overlay`'s files in it: each replaces whatever file the image has at its
/// path (its other hard-linked names keep the image's content), missing parent directories
/// are added (0755, root), and a filter line that names exactly one computed path
/// (`/etc/hostname$`) is dropped, so the path is kept rather than left alone. A computed
/// path matched by a broader line (`/etc/.*`) is an error: the machine's subd would not see
/// it. The files' mtimes are the epoch: the content, not the time it was rendered, is what
/// the file is.
pub fn lay(image: &Image, overlay: &Overlay) -> Result<Image, OverlayError> {
    let mut out = image.clone();
    if overlay.files.is_empty() {
        return Ok(out);
    }
    if let Some(filter) = &image.filter {
        out.filter = Some(unfiltered(filter, overlay, &image.name)?);
    }
    for (path, f) in &overlay.files {
        match normalize(path) {
            Ok(n) if n == *path && n != "/" => {}
            _ => return Err(OverlayError::Path { path: path.clone() }),
        }
        if out.fs.get(path).is_some_and(Inode::is_dir) {
            return Err(OverlayError::Directory {
                path: path.clone(),
                image: image.name.clone(),
            });
        }
        make_parents(&mut out, path)?;
        out.fs.paths.remove(path);
        let inode = Inode::Regular {
            mode: f.mode & 0o7777,
            uid: f.uid,
            gid: f.gid,
            mtime: Mtime { sec: 0, nsec: 0 },
            size: f.size,
            object: (f.size > 0).then_some(f.object),
        };
        out.fs
            .insert(path, inode)
            .map_err(|_| OverlayError::Path { path: path.clone() })?;
    }
    // Inodes no path names any more (a replaced file's) go, so their objects are not
    // fetched.
    let named: std::collections::BTreeSet<u64> = out.fs.paths.values().copied().collect();
    out.fs.inodes.retain(|ino, _| named.contains(ino));
    Ok(out)
}

fn make_parents(out: &mut Image, path: &str) -> Result<(), OverlayError> {
    let mut missing = Vec::new();
    let mut p = parent(path);
    while let Some(dir) = p {
        match out.fs.get(dir) {
            Some(i) if i.is_dir() => break,
            Some(_) => {
                return Err(OverlayError::Parent {
                    path: path.into(),
                    parent: dir.into(),
                    image: out.name.clone(),
                });
            }
            None => missing.push(dir.to_string()),
        }
        p = parent(dir);
    }
    for dir in missing.into_iter().rev() {
        let d = Inode::Directory {
            mode: 0o755,
            uid: 0,
            gid: 0,
        };
        out.fs
            .insert(&dir, d)
            .map_err(|_| OverlayError::Path { path: path.into() })?;
    }
    Ok(())
}

/// A filter's `lines` without those that name exactly one of `paths` (`/etc/hostname$`): the
/// exclusions of a machine whose computed files include those paths.
pub fn without_lines_naming(lines: &[String], paths: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| literal(l).is_none_or(|p| !paths.contains(&p)))
        .cloned()
        .collect()
}

/// `filter` without the lines that name exactly one computed path; an error when a computed
/// path is still filtered.
fn unfiltered(filter: &Filter, overlay: &Overlay, image: &str) -> Result<Filter, OverlayError> {
    let kept: Vec<String> = filter
        .lines()
        .iter()
        .filter(|l| literal(l).is_none_or(|p| !overlay.files.contains_key(&p)))
        .cloned()
        .collect();
    if kept.len() == filter.lines().len() && !overlay.files.keys().any(|p| filter.matches(p)) {
        return Ok(filter.clone());
    }
    let f = Filter::from_lines(kept.iter().cloned()).unwrap_or_else(|_| filter.clone());
    if let Some(path) = overlay.files.keys().find(|p| f.matches(p)) {
        let line = kept
            .iter()
            .find(|l| Filter::from_lines([l.to_string()]).is_ok_and(|one| one.matches(path)))
            .cloned()
            .unwrap_or_else(|| "!".into());
        return Err(OverlayError::Filtered {
            path: path.clone(),
            image: image.into(),
            line,
        });
    }
    Ok(f)
}

/// The one path a filter line names (`/etc/hostname$`, `^/etc/resolv\.conf$`), if it names
/// exactly one: anchored at the end, and no regular-expression syntax but escapes.
fn literal(line: &str) -> Option<String> {
    let body = line.strip_prefix('^').unwrap_or(line).strip_suffix('$')?;
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let e = chars.next()?;
                if e.is_ascii_alphanumeric() {
                    return None;
                }
                out.push(e);
            }
            '.' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => {
                return None;
            }
            c => out.push(c),
        }
    }
    out.starts_with('/').then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_image::FileSystem;

    fn image(filter: Option<&[&str]>) -> Image {
        let mut fs = FileSystem::with_root(0o755, 0, 0);
        fs.insert(
            "/etc",
            Inode::Directory {
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        let file = |s: &[u8]| Inode::Regular {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: Mtime { sec: 5, nsec: 0 },
            size: s.len() as u64,
            object: Some(ObjectId::of(s)),
        };
        fs.insert("/etc/motd", file(b"hi\n")).unwrap();
        fs.link("/etc/motd.link", "/etc/motd").unwrap();
        fs.insert("/etc/hosts", file(b"h\n")).unwrap();
        let filter = filter.map(|l| Filter::from_lines(l.iter().map(|s| s.to_string())).unwrap());
        Image::new("base", fs, filter)
    }

    fn file(content: &[u8]) -> ComputedFile {
        ComputedFile {
            object: ObjectId::of(content),
            size: content.len() as u64,
            mode: 0o640,
            uid: 0,
            gid: 4,
            check: None,
        }
    }

    fn overlay(files: &[(&str, &[u8])]) -> Overlay {
        Overlay {
            files: files
                .iter()
                .map(|(p, c)| (p.to_string(), file(c)))
                .collect(),
            missing: None,
        }
    }

    #[test]
    fn files_replace_the_images_and_add_their_directories() {
        let base = image(None);
        let got = lay(
            &base,
            &overlay(&[("/etc/motd", b"mine\n"), ("/srv/app/peers", b"a\n")]),
        )
        .unwrap();
        assert_eq!(
            got.fs.get("/etc/motd").unwrap().object(),
            Some(ObjectId::of(b"mine\n"))
        );
        // The other name keeps the image's content.
        assert_eq!(
            got.fs.get("/etc/motd.link").unwrap().object(),
            Some(ObjectId::of(b"hi\n"))
        );
        assert!(got.fs.get("/srv").unwrap().is_dir());
        assert!(got.fs.get("/srv/app").unwrap().is_dir());
        assert_eq!(got.fs.get("/etc/hosts"), base.fs.get("/etc/hosts"));
        got.fs.validate().unwrap();
        // An unnamed inode is dropped: the one /etc/hosts had, replaced.
        let got = lay(&base, &overlay(&[("/etc/hosts", b"x\n")])).unwrap();
        assert!(!got.fs.objects().contains_key(&ObjectId::of(b"h\n")));
    }

    #[test]
    fn a_filter_line_naming_only_the_path_is_dropped_a_broader_one_refuses() {
        let base = image(Some(&[
            "/etc/hostname$",
            "/var/log/.*",
            "^/etc/resolv\\.conf$",
        ]));
        let got = lay(
            &base,
            &overlay(&[("/etc/hostname", b"n1\n"), ("/etc/resolv.conf", b"r\n")]),
        )
        .unwrap();
        assert_eq!(got.filter.unwrap().lines(), ["/var/log/.*"]);
        let err = lay(&base, &overlay(&[("/var/log/app", b"x")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/var/log/app is filtered by image base's filter line \"/var/log/.*\", which names more than it"
        );
        assert_eq!(literal("/etc/a.b$"), None);
        assert_eq!(literal("/etc/a\\.b$").as_deref(), Some("/etc/a.b"));
        assert_eq!(literal("/etc/hostname"), None);
        let lines: Vec<String> = ["/etc/hostname$", "/tmp/.*"].map(String::from).into();
        assert_eq!(
            without_lines_naming(&lines, &["/etc/hostname".into()]),
            ["/tmp/.*"]
        );
        assert_eq!(without_lines_naming(&lines, &["/tmp/x".into()]), lines);
    }

    #[test]
    fn a_directory_or_a_file_parent_is_refused() {
        let base = image(None);
        assert!(matches!(
            lay(&base, &overlay(&[("/etc", b"x")])),
            Err(OverlayError::Directory { .. })
        ));
        assert!(matches!(
            lay(&base, &overlay(&[("/etc/motd/x", b"x")])),
            Err(OverlayError::Parent { .. })
        ));
        assert!(matches!(
            lay(&base, &overlay(&[("etc/x", b"x")])),
            Err(OverlayError::Path { .. })
        ));
    }
}
