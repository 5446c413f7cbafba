//! `paddock-ingest-bench STORE_DIR TARBALL...`: ingests each tarball into the object store
//! at STORE_DIR (created), in order, and prints one line per tarball:
//! `ingest <path> seconds=<s> bytes=<content bytes> input=<tarball bytes> new_bytes=<n> objects=<n> new_objects=<n>`.
//! Used by bench/images.sh, which times `tar -x` + `sha512sum` over the same tarball.

use std::time::Instant;

use paddock_imageserver::ingest::ingest;
use paddock_imageserver::objects::ObjectStore;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: paddock-ingest-bench STORE_DIR TARBALL..."))?;
    let store = ObjectStore::open(&dir)?;
    for tar in args {
        let t = Instant::now();
        let (_, st) = ingest(std::fs::File::open(&tar)?, &store, None, &mut |_| {})?;
        store.sync()?;
        println!(
            "ingest {tar} seconds={:.3} bytes={} input={} new_bytes={} objects={} new_objects={}",
            t.elapsed().as_secs_f64(),
            st.bytes,
            st.input_bytes,
            st.new_bytes,
            st.objects,
            st.new_objects
        );
    }
    Ok(())
}
