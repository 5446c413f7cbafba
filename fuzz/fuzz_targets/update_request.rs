//! Update requests as subd receives them (`validate` before anything is applied), and the
//! planner on two trees as subd reports and Dominator stores them: `<sub tree JSON> NUL
//! <image tree JSON>` (the byte after the NUL picks the image's filter). No panic; a plan
//! between two valid trees passes subd's own validation.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use paddock_image::plan::{UpdateRequest, plan};
use paddock_image::{FileSystem, Filter, Image};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<UpdateRequest>(data) {
        let _ = paddock_subd::update::validate(&req);
    }
    let Some(nul) = data.iter().position(|b| *b == 0) else {
        return;
    };
    let (a, rest) = (&data[..nul], &data[nul + 1..]);
    let Some((&pick, b)) = rest.split_first() else {
        return;
    };
    let (Ok(sub), Ok(fs)) = (
        serde_json::from_slice::<FileSystem>(a),
        serde_json::from_slice::<FileSystem>(b),
    ) else {
        return;
    };
    if sub.validate().is_err() || fs.validate().is_err() {
        return;
    }
    let filter = match pick % 3 {
        0 => None,
        1 => Some(Filter::empty()),
        _ => Some(Filter::parse("/var/.*\n/etc/keep$\n/x").unwrap()),
    };
    let image = Image::new("fuzz", fs, filter);
    let req = plan(&sub, &BTreeSet::new(), &image);
    if let Err(e) = paddock_subd::update::validate(&req) {
        panic!("the planner made a request subd refuses: {e}\n{req:#?}");
    }
});
