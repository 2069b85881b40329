//! Raw bindings to the C shim (`shim/pw_video.h`) over pixelwire's static
//! decode-only FFmpeg. The shim owns every FFmpeg struct; Rust sees only
//! these calls. Safe wrappers live in pixelwire's `video` module.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// `pw_pace`: asked between packets whether to go on (nonzero: stop).
pub type pw_pace = unsafe extern "C" fn(opaque: *mut c_void, packets_decoded: i64) -> i32;

pub const PW_OK: i32 = 0;
pub const PW_ERR_FORMAT: i32 = -1;
pub const PW_ERR_NO_VIDEO: i32 = -2;
pub const PW_ERR_NO_DECODER: i32 = -3;
pub const PW_ERR_DECODER: i32 = -4;
pub const PW_ERR_MEMORY: i32 = -5;
pub const PW_ERR_TOO_LARGE: i32 = -6;

pub const PW_DEMUXERS: i32 = 0;
pub const PW_INPUT_PROTOCOLS: i32 = 1;
pub const PW_DECODERS: i32 = 2;

#[repr(C)]
pub struct pw_video {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct pw_video_info {
    pub width: i32,
    pub height: i32,
    pub frame_count: i64,
    pub fps: f64,
    pub duration_sec: f64,
    pub rotation: i32,
    pub threads: i32,
    pub codec: [c_char; 32],
    pub pix_fmt: [c_char; 32],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_video_end {
    pub frame_count: i64,
    pub landing_pts: i64,
    pub landing_number: i64,
}

extern "C" {
    pub fn pw_video_open(
        data: *const u8,
        size: usize,
        threads: i32,
        max_pixels: i64,
        stop: *const i32,
        out: *mut *mut pw_video,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    pub fn pw_video_set_pace(v: *mut pw_video, pace: Option<pw_pace>, opaque: *mut c_void);
    pub fn pw_video_get_info(v: *const pw_video, info: *mut pw_video_info);
    pub fn pw_video_presentable_frames(v: *mut pw_video) -> i64;
    pub fn pw_video_presentable_frames_deferred(v: *mut pw_video, end: *mut pw_video_end) -> i32;
    pub fn pw_video_frame_pts(v: *const pw_video) -> i64;
    pub fn pw_video_grab(v: *mut pw_video) -> i32;
    pub fn pw_video_finished(v: *const pw_video) -> i32;
    pub fn pw_video_stopped(v: *const pw_video) -> i32;
    pub fn pw_video_retrieve(v: *mut pw_video, dst: *mut u8) -> i32;
    pub fn pw_video_retrieve_rgb_direct(v: *mut pw_video, dst: *mut u8) -> i32;
    pub fn pw_video_skip_unwanted(
        v: *mut pw_video,
        wanted: *const i64,
        n: usize,
        through: i64,
        decode_from: i64,
    ) -> i32;
    pub fn pw_video_packets_decoded(v: *const pw_video) -> i64;
    pub fn pw_video_frame_index(v: *const pw_video) -> i64;
    pub fn pw_video_sequence_starts(v: *mut pw_video, starts: *mut i64, cap: usize) -> i64;
    pub fn pw_video_skip_failed(v: *const pw_video) -> i32;
    pub fn pw_video_close(v: *mut pw_video);
    pub fn pw_hevc_pps_output_flag_present(nal: *const u8, len: usize) -> i32;
    pub fn pw_vp9_shown_key_frame(p: *const u8, size: usize) -> i32;
    pub fn pw_component_name(kind: i32, index: usize) -> *const c_char;
}
