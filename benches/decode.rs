//! Decode throughput of the pure-Rust API, `pixelwire::decode::decode`.
//!
//! Inputs are built at start-up from a real photograph of the test corpus
//! (`../shared/corpus/pillow/exif_gps_typeerror.jpg`, 800x531), scaled with
//! Lanczos3 and centre-cropped to each benchmark size, then encoded with the
//! `image` crate: JPEG at quality 90, PNG at the default compression and
//! lossless WebP (the only WebP the `image` encoder writes). Photographic
//! content matters: flat colour compresses and decodes unrealistically fast.
//!
//! The `image` JPEG encoder writes 4:4:4 (no chroma subsampling), which has
//! twice the chroma data of the 4:2:0 that cameras, browsers and Pillow write
//! by default, so these JPEG figures are lower per pixel than for typical web
//! photos. `benches/decode_vs_peers.py` measures 4:2:0 JPEGs from Pillow.
//!
//! Throughput is in elements, one element a pixel, so criterion's Melem/s
//! reads as megapixels a second.
//!
//! Run with `cargo bench --bench decode`.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::webp::WebPEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ExtendedColorType, ImageEncoder, RgbImage};
use pixelwire::decode::{decode, DecodeOptions};

/// The source photograph, relative to the crate root.
const SOURCE: &str = "../shared/corpus/pillow/exif_gps_typeerror.jpg";

/// Benchmark sizes, width by height.
const SIZES: [(u32, u32); 3] = [(512, 512), (1920, 1080), (3840, 2160)];

const JPEG_QUALITY: u8 = 90;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Codec {
    Jpeg,
    Png,
    WebpLossless,
}

impl Codec {
    const ALL: [Codec; 3] = [Codec::Jpeg, Codec::Png, Codec::WebpLossless];

    fn name(self) -> &'static str {
        match self {
            Codec::Jpeg => "jpeg",
            Codec::Png => "png",
            Codec::WebpLossless => "webp_lossless",
        }
    }

    fn encode(self, img: &RgbImage) -> Vec<u8> {
        let (w, h) = img.dimensions();
        let mut out = Vec::new();
        let result = match self {
            Codec::Jpeg => JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY).write_image(
                img.as_raw(),
                w,
                h,
                ExtendedColorType::Rgb8,
            ),
            Codec::Png => {
                PngEncoder::new(&mut out).write_image(img.as_raw(), w, h, ExtendedColorType::Rgb8)
            }
            Codec::WebpLossless => WebPEncoder::new_lossless(&mut out).write_image(
                img.as_raw(),
                w,
                h,
                ExtendedColorType::Rgb8,
            ),
        };
        result.unwrap_or_else(|e| panic!("encoding {} {w}x{h}: {e}", self.name()));
        out
    }
}

fn load_source() -> DynamicImage {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SOURCE);
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("reading the source photo {}: {e}", path.display()));
    image::load_from_memory(&bytes)
        .unwrap_or_else(|e| panic!("decoding the source photo {}: {e}", path.display()))
}

/// Scales to cover `w`x`h` (aspect ratio kept) and crops the centre.
fn scaled(source: &DynamicImage, w: u32, h: u32) -> RgbImage {
    source.resize_to_fill(w, h, FilterType::Lanczos3).to_rgb8()
}

/// Checks once, outside the timed loop, that pixelwire decodes the input to
/// the right shape and (for the lossless codecs) to the exact source pixels.
fn check(codec: Codec, data: &[u8], reference: &RgbImage) {
    let (info, pixels) = decode(data, &DecodeOptions::default())
        .unwrap_or_else(|e| panic!("pixelwire failed on {}: {e}", codec.name()));
    let (w, h) = reference.dimensions();
    assert_eq!((info.width, info.height), (w, h), "{}", codec.name());
    assert_eq!(pixels.len(), reference.as_raw().len(), "{}", codec.name());
    match codec {
        Codec::Png | Codec::WebpLossless => assert!(
            pixels == *reference.as_raw(),
            "{} {w}x{h}: lossless decode differs from the encoded pixels",
            codec.name()
        ),
        Codec::Jpeg => {
            let total: u64 = pixels
                .iter()
                .zip(reference.as_raw())
                .map(|(&a, &b)| u64::from(a.abs_diff(b)))
                .sum();
            let mean = total as f64 / pixels.len() as f64;
            assert!(
                mean < 4.0,
                "jpeg {w}x{h}: mean absolute error {mean:.2} vs the source is implausible"
            );
        }
    }
}

fn bench_decode(c: &mut Criterion) {
    let source = load_source();
    let opts = DecodeOptions::default();

    // Encode every input first so that the groups below only time decoding.
    let mut inputs: Vec<(Codec, u32, u32, Vec<u8>)> = Vec::new();
    for &(w, h) in &SIZES {
        let img = scaled(&source, w, h);
        for codec in Codec::ALL {
            let data = codec.encode(&img);
            check(codec, &data, &img);
            eprintln!(
                "input {:>13} {w}x{h}: {} bytes ({:.2} bits/pixel)",
                codec.name(),
                data.len(),
                data.len() as f64 * 8.0 / (f64::from(w) * f64::from(h))
            );
            inputs.push((codec, w, h, data));
        }
    }

    for codec in Codec::ALL {
        let mut group = c.benchmark_group(format!("decode/{}", codec.name()));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(2));
        for (_, w, h, data) in inputs.iter().filter(|(k, ..)| *k == codec) {
            group.throughput(Throughput::Elements(u64::from(*w) * u64::from(*h)));
            group.bench_with_input(
                BenchmarkId::from_parameter(format!("{w}x{h}")),
                data,
                |b, data| b.iter(|| decode(black_box(data), &opts).expect("decode")),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
