//! Workflow validation never panics on arbitrary text: it returns a workflow
//! or a list of problems; a workflow it accepts round-trips through its blob.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uwf_db::workflow::{Workflow, parse_workflow};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(wf) = parse_workflow(text, None, &|_| true) {
        let blob = wf.to_blob().expect("a valid workflow encodes");
        let enc = blob.encode().expect("canonical");
        let back = Workflow::from_blob(enc.hash(), &blob).expect("decodes");
        assert_eq!(back, wf);
    }
});
