//! Builds dav1d 1.5.4 (meson + ninja) and a decode-only static FFmpeg 9.0.2
//! from the tarballs in `vendor/` into `OUT_DIR`, then the C shim against
//! them. Nothing is downloaded. The built prefix is kept in `OUT_DIR` with a
//! stamp naming what made it, so a rerun (a changed shim) reuses it, and
//! copied to `<target dir>/pixelwire-ffmpeg/<key hash>` for the other
//! cargo profiles.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const FFMPEG: &str = "ffmpeg-9.0.2";
const FFMPEG_TARBALL: &str = "ffmpeg_9.0.2.orig.tar.xz";
const DAV1D: &str = "dav1d-1.5.4";
const DAV1D_TARBALL: &str = "dav1d_1.5.4.orig.tar.xz";

/// The FFmpeg configuration: decode only, what OpenCV 5.1 decodes with
/// (native h264/hevc/vp8/vp9/mpeg4, libdav1d for AV1), LGPL (no --enable-gpl,
/// nothing nonfree), nothing found on the build host (--disable-autodetect).
const FFMPEG_CONFIGURE: &[&str] = &[
    "--disable-everything",
    "--disable-programs",
    "--disable-doc",
    "--disable-network",
    "--disable-autodetect",
    "--enable-static",
    "--disable-shared",
    "--enable-pic",
    "--disable-debug",
    "--disable-avdevice",
    "--disable-avfilter",
    "--disable-swresample",
    "--enable-swscale",
    "--enable-libdav1d",
    "--enable-decoder=h264,hevc,vp8,vp9,mpeg4,libdav1d,av1",
    "--enable-demuxer=mov,matroska,avi",
    "--enable-parser=h264,hevc,vp8,vp9,mpeg4video,av1",
    "--enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,vp9_superframe_split,av1_frame_split",
];

const DAV1D_MESON: &[&str] = &[
    "--buildtype=release",
    "--default-library=static",
    "--libdir=lib",
    "-Denable_tools=false",
    "-Denable_tests=false",
    "-Denable_examples=false",
    "-Db_pie=true",
    "-Db_staticpic=true",
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let vendor = manifest.join("vendor");
    let prefix = out.join("prefix");
    for file in ["build.rs", "glibc_compat.h", "shim"] {
        println!("cargo:rerun-if-changed={file}");
    }
    for tarball in [FFMPEG_TARBALL, DAV1D_TARBALL] {
        println!("cargo:rerun-if-changed=vendor/{tarball}");
    }
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");

    let key = format!(
        "{FFMPEG_TARBALL} {DAV1D_TARBALL}\n{}\n{}\n{}\n",
        FFMPEG_CONFIGURE.join(" "),
        DAV1D_MESON.join(" "),
        std::fs::read_to_string(manifest.join("glibc_compat.h")).unwrap()
    );
    let built = |dir: &Path| {
        std::fs::read_to_string(dir.join(".built")).ok().as_deref() == Some(key.as_str())
    };
    // The libraries do not depend on cargo's profile, so the dev profile
    // (cargo test, clippy) and the release build share one prefix, kept
    // next to cargo's profile folders.
    let shared = shared_prefix(&out, &key);
    let prefix = match shared {
        Some(ref dir) if built(dir) => dir.clone(),
        _ => {
            if !built(&prefix) {
                let _ = std::fs::remove_dir_all(&prefix);
                build_libraries(&manifest, &vendor, &out, &prefix);
                std::fs::write(prefix.join(".built"), &key).unwrap();
            }
            if let Some(dir) = shared {
                publish(&prefix, &dir);
            }
            prefix
        }
    };

    cc::Build::new()
        .file("shim/pw_video.c")
        .file("shim/pw_skip.c")
        .include(prefix.join("include"))
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-std=c11")
        .compile("pw_video");

    let lib = prefix.join("lib");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for name in ["avformat", "avcodec", "swscale", "avutil", "dav1d"] {
        println!("cargo:rustc-link-lib=static={name}");
    }
    println!("cargo:rustc-link-lib=dylib=m");
    println!("cargo:rustc-link-lib=dylib=pthread");
}

/// `<target dir>/pixelwire-ffmpeg/<hash of the build's key>`. The target
/// dir is the folder above OUT_DIR where cargo keeps its `CACHEDIR.TAG`
/// (OUT_DIR = `<target dir>[/<triple>]/<profile>/build/<package>/out`).
fn shared_prefix(out: &Path, key: &str) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    let target = out
        .ancestors()
        .skip(4)
        .take(2)
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .or_else(|| out.ancestors().nth(4))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    Some(
        target
            .join("pixelwire-ffmpeg")
            .join(format!("{:016x}", hasher.finish())),
    )
}

/// Copies a built prefix to the shared place, atomically (a rename), so a
/// concurrent build sees it whole or not at all.
fn publish(prefix: &Path, shared: &Path) {
    let parent = shared.parent().unwrap();
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    let staging = parent.join(format!(".staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(prefix)
        .arg(&staging)
        .status()
        .is_ok_and(|s| s.success());
    if !copied || std::fs::rename(&staging, shared).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
}

fn jobs() -> String {
    env::var("NUM_JOBS").unwrap_or_else(|_| "1".into())
}

fn run(cmd: &mut Command, what: &str) {
    eprintln!("running {cmd:?}");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", cmd.get_program()));
    assert!(status.success(), "{what} failed: {status}");
}

/// A tool from PATH, else from the active virtualenv (maturin sets
/// VIRTUAL_ENV; pip's build isolation puts `[build-system].requires` on PATH).
fn find_tool(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(venv) = env::var_os("VIRTUAL_ENV") {
        dirs.push(PathBuf::from(venv).join("bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is needed to build dav1d: `pip install meson ninja` (pyproject's build requirements)")
        })
}

fn unpack(tarball: &Path, into: &Path) {
    run(
        Command::new("tar")
            .arg("-xJf")
            .arg(tarball)
            .arg("-C")
            .arg(into),
        "unpacking",
    );
}

fn build_libraries(manifest: &Path, vendor: &Path, out: &Path, prefix: &Path) {
    let src = out.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    unpack(&vendor.join(DAV1D_TARBALL), &src);
    unpack(&vendor.join(FFMPEG_TARBALL), &src);

    let meson = find_tool("meson");
    let ninja = find_tool("ninja");
    // meson finds ninja on PATH.
    let mut path = vec![ninja.parent().unwrap().to_path_buf()];
    path.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let path = env::join_paths(path).unwrap();

    let dav1d = src.join(DAV1D);
    run(
        Command::new(&meson)
            .current_dir(&dav1d)
            .env("PATH", &path)
            .args(["setup", "build"])
            .arg(format!("--prefix={}", prefix.display()))
            .args(DAV1D_MESON),
        "meson setup (dav1d)",
    );
    run(
        Command::new(&ninja)
            .current_dir(&dav1d)
            .env("PATH", &path)
            .args(["-C", "build", "-j", &jobs(), "install"]),
        "ninja (dav1d)",
    );

    let ffmpeg = src.join(FFMPEG);
    let compat = manifest.join("glibc_compat.h");
    run(
        Command::new("./configure")
            .current_dir(&ffmpeg)
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .arg(format!("--prefix={}", prefix.display()))
            .arg("--pkg-config-flags=--static")
            .arg(format!("--extra-cflags=-include {}", compat.display()))
            .args(FFMPEG_CONFIGURE),
        "FFmpeg configure",
    );
    run(
        Command::new("make")
            .current_dir(&ffmpeg)
            .args(["-j", &jobs()]),
        "FFmpeg make",
    );
    run(
        Command::new("make").current_dir(&ffmpeg).arg("install"),
        "FFmpeg make install",
    );
    // The sources are 300 MB once built; the prefix is all that is needed.
    let _ = std::fs::remove_dir_all(&src);
}
