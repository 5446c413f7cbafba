//! The length-prefixed stream that `ObjectServer.GetObjects` and `Subd.GetFiles` answer
//! with: for each item, an 8-byte big-endian length then exactly that many bytes. The
//! sender reads files on a blocking thread and streams them as they are read; the receiver
//! reads a header with [`read_header`] and then the bytes it announces.

#[cfg(feature = "server")]
use std::fs::File;
use std::io::{self, Read};

#[cfg(feature = "server")]
use axum::body::{Body, Bytes};

/// The header announcing `len` bytes.
pub fn header(len: u64) -> [u8; 8] {
    len.to_be_bytes()
}

/// Reads one header; an end of stream here is an error (the caller knows how many items it
/// asked for).
pub fn read_header(r: &mut impl Read) -> io::Result<u64> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    Ok(u64::from_be_bytes(len))
}

/// Bytes per chunk of a framed body.
#[cfg(feature = "server")]
const CHUNK: usize = 256 << 10;

/// A response body carrying each item's file, framed. `open` opens an item's file and
/// `name` says which item it was in errors. A file that cannot be opened or that shrinks
/// while it is sent ends the stream with an error, so the receiver sees a short stream
/// rather than wrong bytes.
#[cfg(feature = "server")]
pub fn body<T, O, N>(items: Vec<T>, open: O, name: N) -> Body
where
    T: Send + 'static,
    O: Fn(&T) -> io::Result<File> + Send + 'static,
    N: Fn(&T) -> String + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let gone = || io::Error::other("client went away");
        for item in items {
            let res = (|| -> io::Result<()> {
                let mut f = open(&item)?;
                let len = f.metadata()?.len();
                tx.blocking_send(Ok(Bytes::copy_from_slice(&header(len))))
                    .map_err(|_| gone())?;
                let mut left = len;
                while left > 0 {
                    // Each chunk is read into a buffer of its own size that then becomes the
                    // chunk: no copy, and a small object costs its size, not a whole chunk.
                    let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
                    let mut chunk = vec![0u8; want];
                    let n = f.read(&mut chunk)?;
                    if n == 0 {
                        return Err(io::Error::other(format!(
                            "{} shrank while it was sent",
                            name(&item)
                        )));
                    }
                    chunk.truncate(n);
                    left -= n as u64;
                    tx.blocking_send(Ok(Bytes::from(chunk)))
                        .map_err(|_| gone())?;
                }
                Ok(())
            })();
            if let Err(e) = res {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn files_arrive_framed_and_a_missing_one_ends_the_stream() {
        let dir = std::env::temp_dir().join(format!("paddock-wire-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), b"hello").unwrap();
        std::fs::write(dir.join("b"), vec![7u8; 300_000]).unwrap();
        let names = vec!["a".to_string(), "missing".to_string(), "b".to_string()];
        let d = dir.clone();
        let names_ok = vec!["a".to_string(), "b".to_string()];
        let body = super::body(names_ok, move |n| File::open(d.join(n)), |n| n.clone());
        let mut bytes = Vec::new();
        let mut s = body.into_data_stream();
        while let Some(chunk) = s.next().await {
            bytes.extend_from_slice(&chunk.unwrap());
        }
        let mut r = &bytes[..];
        assert_eq!(read_header(&mut r).unwrap(), 5);
        let mut a = [0u8; 5];
        r.read_exact(&mut a).unwrap();
        assert_eq!(&a, b"hello");
        assert_eq!(read_header(&mut r).unwrap(), 300_000);
        assert_eq!(r.len(), 300_000);
        assert!(r.iter().all(|&b| b == 7));

        // The second item cannot be opened: the first arrives whole, then an error.
        let d = dir.clone();
        let body = super::body(names, move |n| File::open(d.join(n)), |n| n.clone());
        let mut s = body.into_data_stream();
        let mut got = Vec::new();
        let mut failed = false;
        while let Some(chunk) = s.next().await {
            match chunk {
                Ok(c) => got.extend_from_slice(&c),
                Err(_) => failed = true,
            }
        }
        assert!(failed);
        assert_eq!(got.len(), 8 + 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
