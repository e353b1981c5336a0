//! The libFuzzer binary: runs the target `PODGATE_FUZZ_TARGET` names
//! ([`podgate_fuzz::targets::TARGETS`]); `scripts/fuzz.sh` and `tests/corpus.rs` set
//! it. Every libFuzzer flag works as with a binary per target.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use podgate_fuzz::targets::{TARGETS, Target, by_name};

static TARGET: OnceLock<Target> = OnceLock::new();

fuzz_target!(
    init: {
        let name = std::env::var("PODGATE_FUZZ_TARGET").unwrap_or_default();
        let Some(run) = by_name(&name) else {
            let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "PODGATE_FUZZ_TARGET={name:?} names no fuzz target; one of: {}",
                names.join(", ")
            );
            std::process::exit(2);
        };
        TARGET.get_or_init(|| run);
    },
    |data: &[u8]| {
        let run = TARGET.get().expect("set by init");
        run(data);
    }
);
