//! Replays every input under fuzz/regressions/<target>/ (crashes the fuzzers
//! found, kept as tests) through the same harness the fuzzer runs, on
//! stable Rust: `cargo test --manifest-path fuzz/Cargo.toml`.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let mut n = 0;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if !path.is_file()
                || path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            eprintln!("replaying {}", path.display());
            run(&data);
            n += 1;
        }
    }
    eprintln!("{target}: {n} regression inputs replayed");
}

#[test]
fn decode_regressions() {
    replay("decode", pixelwire_fuzz::decode_one);
}

#[test]
fn wire_regressions() {
    replay("wire", pixelwire_fuzz::wire_one);
}

#[test]
fn resize_regressions() {
    replay("resize", pixelwire_fuzz::resize_one);
}

#[test]
fn video_regressions() {
    replay("video", pixelwire_fuzz::video_one);
}
