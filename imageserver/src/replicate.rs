//! Image replication between the hosts of a cluster (Dominator's imageserver replicating
//! from another imageserver): the image index lives in the shared store, but each host keeps
//! objects in its own object store. Every host runs a [`Replicator`] that, at start and
//! whenever an `images/` record changes (and every [`RESYNC`] besides), makes sure it holds
//! the tree object and every object of every live image, fetching what it lacks from its
//! peers' `ObjectServer.GetObjects`. So whichever host leads, its image server can serve
//! every image, and the dominator on a new leader carries on.
//!
//! Every object is checked against its SHA-512 id before it is linked into place
//! ([`ObjectStore::put_reader`]); a peer that lacks an object (or sends other bytes) is
//! skipped for the rest of that batch and the next peer asked. Until an image is complete on
//! a host, `paddock image show` there counts its missing objects, and a sub told to fetch
//! from that host gets a clear "missing object" error and retries.

use std::collections::BTreeSet;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_image::ObjectId;
use paddock_store::Store;
use paddock_wire::{error_message, frames};

use crate::images::{ImageRecord, ImageServer};
use crate::objects::{ObjectError, ObjectStore};

/// A full pass even when nothing changed (a peer that was down may be back).
pub const RESYNC: Duration = Duration::from_secs(30);
/// Objects per GetObjects request, and bytes (sizes are known from the tree).
const BATCH_OBJECTS: usize = 512;
const BATCH_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReplicateError {
    #[error("image {image:?}: {missing} objects could not be had from any peer ({last})")]
    Incomplete {
        image: String,
        missing: usize,
        last: String,
    },
    #[error(transparent)]
    Image(#[from] crate::images::ImageError),
    #[error("image {image:?}: making its objects durable: {source}")]
    Sync {
        image: String,
        source: crate::objects::ObjectError,
    },
}

/// Why one GetObjects request to one peer did not bring its batch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Request(#[from] ureq::Error),
    /// The peer answered with another status; `message` is its error text.
    #[error("{status}: {message}")]
    Status { status: u16, message: String },
    #[error("reading the length of {}: {source}", id.short())]
    Length {
        id: ObjectId,
        source: std::io::Error,
    },
    #[error("object {}: {source}", id.short())]
    Store { id: ObjectId, source: ObjectError },
    #[error("object {}: the peer sent other bytes", id.short())]
    OtherBytes { id: ObjectId },
    #[error("the fetch task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What one pass fetched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub images: usize,
    pub objects: u64,
    pub bytes: u64,
}

pub struct Replicator {
    images: Arc<ImageServer>,
    /// The other hosts' base URLs (`http://host:port`).
    peers: Vec<String>,
    agent: ureq::Agent,
    /// Trees whose every object this host holds: not walked again (objects an image uses
    /// are never collected while it lives).
    complete: std::sync::Mutex<BTreeSet<ObjectId>>,
}

impl Replicator {
    pub fn new(images: Arc<ImageServer>, peers: Vec<String>) -> Self {
        Self::with_tls(images, peers, None)
    }

    /// Over TLS to the peers (`https://` URLs) when `tls` is given: the CA as the only root,
    /// this host's certificate presented (it needs `ObjectServer.GetObjects`).
    pub fn with_tls(
        images: Arc<ImageServer>,
        peers: Vec<String>,
        tls: Option<ureq::tls::TlsConfig>,
    ) -> Self {
        let agent = paddock_client::Builder::new()
            .tls(tls)
            .connect_timeout(Duration::from_secs(5))
            .agent();
        Replicator {
            images,
            peers,
            agent,
            complete: std::sync::Mutex::default(),
        }
    }

    /// Runs until the store shuts down: a pass at start, after every change under
    /// `images/`, and every [`RESYNC`].
    pub async fn run(self, store: Arc<dyn Store>) {
        if self.peers.is_empty() {
            return;
        }
        loop {
            // Watch before the pass so that a record written during it wakes the next one.
            let mut watch = match store.watch("images/", 0).await {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "image replication: cannot watch images/");
                    None
                }
            };
            match self.pass().await {
                Ok(p) if p.objects > 0 => tracing::info!(
                    images = p.images,
                    objects = p.objects,
                    bytes = p.bytes,
                    "image replication: fetched from peers"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "image replication"),
            }
            let changed = async {
                match watch.as_mut() {
                    Some(w) => w.next().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                up = changed => if !up {
                    return;
                },
                () = tokio::time::sleep(RESYNC) => {}
            }
        }
    }

    /// One pass over every live image; the first error is returned after every image was
    /// tried.
    pub async fn pass(&self) -> Result<Pass, ReplicateError> {
        let mut out = Pass::default();
        let mut first_err = None;
        for rec in self.images.list().await? {
            if rec.deleted || rec.tree.is_none() {
                continue;
            }
            match self.image(&rec).await {
                Ok((objects, bytes)) => {
                    if objects > 0 {
                        out.images += 1;
                        out.objects += objects;
                        out.bytes += bytes;
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Makes the objects fetched so far durable before the image is called complete: after
    /// a crash, an object renamed into place but never written back is an empty file that
    /// `contains` would accept, and this host would serve it for good.
    async fn sync(&self, image: &str) -> Result<(), ReplicateError> {
        let store = self.images.objects().clone();
        let done = tokio::task::spawn_blocking(move || store.sync()).await;
        match done {
            Ok(r) => r.map_err(|source| ReplicateError::Sync {
                image: image.to_string(),
                source,
            }),
            Err(e) => Err(ReplicateError::Sync {
                image: image.to_string(),
                source: crate::objects::ObjectError::Io {
                    path: "the sync task".into(),
                    source: std::io::Error::other(e.to_string()),
                },
            }),
        }
    }

    /// Makes this host hold `rec`'s tree object and every object of its tree.
    async fn image(&self, rec: &ImageRecord) -> Result<(u64, u64), ReplicateError> {
        let Some(tree) = rec.tree else {
            return Ok((0, 0));
        };
        if self.is_complete(&tree) {
            return Ok((0, 0));
        }
        let store = self.images.objects().clone();
        let (mut objects, mut bytes) = (0, 0);
        if !store.contains(&tree) {
            // The tree's size is not known until it is here: a batch of one.
            let (o, b) = self.fetch(&rec.name, vec![(tree, 0)]).await?;
            objects += o;
            bytes += b;
        }
        let fs = self.images.get(&rec.name).await?.fs;
        let started = Instant::now();
        let missing: Vec<(ObjectId, u64)> = fs
            .objects()
            .into_iter()
            .filter(|(id, _)| !store.contains(id))
            .collect();
        if missing.is_empty() {
            if objects > 0 {
                self.sync(&rec.name).await?;
            }
            self.mark_complete(tree);
            return Ok((objects, bytes));
        }
        tracing::info!(
            image = %rec.name,
            objects = missing.len(),
            bytes = missing.iter().map(|(_, s)| s).sum::<u64>(),
            "image replication: fetching what this host lacks"
        );
        let (o, b) = self.fetch(&rec.name, missing).await?;
        self.sync(&rec.name).await?;
        self.mark_complete(tree);
        tracing::info!(
            image = %rec.name,
            objects = o,
            bytes = b,
            seconds = started.elapsed().as_secs_f64(),
            "image replication: image complete on this host"
        );
        Ok((objects + o, bytes + b))
    }

    fn is_complete(&self, tree: &ObjectId) -> bool {
        self.complete
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(tree)
    }

    fn mark_complete(&self, tree: ObjectId) {
        self.complete
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tree);
    }

    /// Fetches `wanted` (id, size) in batches, each from the first peer that serves it.
    async fn fetch(
        &self,
        image: &str,
        wanted: Vec<(ObjectId, u64)>,
    ) -> Result<(u64, u64), ReplicateError> {
        let (mut objects, mut bytes) = (0u64, 0u64);
        for batch in batches(&wanted) {
            let mut last = String::from("no peers");
            let mut done = false;
            for peer in &self.peers {
                let (agent, store, url) = (
                    self.agent.clone(),
                    self.images.objects().clone(),
                    format!("{}/rpc/ObjectServer.GetObjects", peer.trim_end_matches('/')),
                );
                let ids = batch.clone();
                let got =
                    tokio::task::spawn_blocking(move || get_objects(&agent, &url, &ids, &store))
                        .await
                        .unwrap_or_else(|e| Err(e.into()));
                match got {
                    Ok(b) => {
                        objects += batch.len() as u64;
                        bytes += b;
                        done = true;
                        break;
                    }
                    Err(e) => last = format!("{peer}: {e}"),
                }
            }
            if !done {
                return Err(ReplicateError::Incomplete {
                    image: image.to_string(),
                    missing: batch.len(),
                    last,
                });
            }
        }
        Ok((objects, bytes))
    }
}

/// Splits (id, size) into GetObjects batches of at most [`BATCH_OBJECTS`] objects and,
/// past the first object, [`BATCH_BYTES`] bytes.
fn batches(wanted: &[(ObjectId, u64)]) -> Vec<Vec<ObjectId>> {
    let mut out: Vec<Vec<ObjectId>> = Vec::new();
    let mut size = 0u64;
    let mut seen = BTreeSet::new();
    for (id, len) in wanted {
        if !seen.insert(*id) {
            continue;
        }
        match out.last_mut() {
            Some(b) if b.len() < BATCH_OBJECTS && size.saturating_add(*len) <= BATCH_BYTES => {
                b.push(*id);
                size = size.saturating_add(*len);
            }
            _ => {
                out.push(vec![*id]);
                size = *len;
            }
        }
    }
    out
}

/// One GetObjects request; every object verified and stored. The bytes fetched.
fn get_objects(
    agent: &ureq::Agent,
    url: &str,
    ids: &[ObjectId],
    store: &ObjectStore,
) -> Result<u64, FetchError> {
    let body = serde_json::json!({ "objects": ids });
    let resp = agent.post(url).send_json(&body)?;
    let status = resp.status().as_u16();
    let mut reader = resp.into_body().into_reader();
    if status != 200 {
        let mut text = Vec::new();
        let _ = (&mut reader).take(64 << 10).read_to_end(&mut text);
        return Err(FetchError::Status {
            status,
            message: error_message(&text).trim().to_string(),
        });
    }
    let mut bytes = 0u64;
    for id in ids {
        let len = frames::read_header(&mut reader)
            .map_err(|source| FetchError::Length { id: *id, source })?;
        let (got, size, _) = store
            .put_reader((&mut reader).take(len), Some(*id))
            .map_err(|source| FetchError::Store { id: *id, source })?;
        if got != *id || size != len {
            return Err(FetchError::OtherBytes { id: *id });
        }
        bytes += len;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId::of(&[n])
    }

    #[test]
    fn batches_respect_counts_bytes_and_duplicates() {
        let many: Vec<(ObjectId, u64)> = (0..=255u8).chain(0..=255u8).map(|n| (id(n), 1)).collect();
        let b = batches(&many);
        assert_eq!(
            b.iter().map(Vec::len).sum::<usize>(),
            256,
            "duplicates once"
        );
        let big = vec![(id(1), BATCH_BYTES), (id(2), 1), (id(3), BATCH_BYTES - 1)];
        let b = batches(&big);
        assert_eq!(b, vec![vec![id(1)], vec![id(2), id(3)]]);
        let over: Vec<(ObjectId, u64)> = (0..=255u8)
            .map(|n| (ObjectId::of(&[n, 1]), 1))
            .chain((0..=255u8).map(|n| (ObjectId::of(&[n, 2]), 1)))
            .chain((0..=9u8).map(|n| (ObjectId::of(&[n, 3]), 1)))
            .collect();
        let b = batches(&over);
        assert_eq!(
            b.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![BATCH_OBJECTS, 10]
        );
    }
}
