/* pixelwire's video shim: the only code that touches FFmpeg structs. It
 * repeats the steps of OpenCV 5.1's FFmpeg capture (cap_ffmpeg_impl.hpp,
 * CvCapture_FFMPEG: open from a stream, grabFrame, retrieveFrame) so that
 * the frames and numbers are the ones vLLM's `opencv` loader sees. */
#ifndef PW_VIDEO_H
#define PW_VIDEO_H

#include <stddef.h>
#include <stdint.h>

typedef struct pw_video pw_video;

/* Failure classes of pw_video_open; Rust maps each onto an error variant. */
enum {
    PW_OK = 0,
    PW_ERR_FORMAT = -1,       /* not a container we demux, or its headers are broken */
    PW_ERR_NO_VIDEO = -2,     /* no video stream (audio only, empty) */
    PW_ERR_NO_DECODER = -3,   /* a video stream in a codec this build does not decode */
    PW_ERR_DECODER = -4,      /* the decoder refused the stream's parameters */
    PW_ERR_MEMORY = -5,
    PW_ERR_TOO_LARGE = -6,    /* frame size over the caller's max_pixels */
};

typedef struct {
    int32_t width;          /* CAP_PROP_FRAME_WIDTH: the stream's coded picture size */
    int32_t height;         /* CAP_PROP_FRAME_HEIGHT */
    int64_t frame_count;    /* CAP_PROP_FRAME_COUNT */
    double fps;             /* CAP_PROP_FPS */
    double duration_sec;    /* the container's duration, else the stream's */
    int32_t rotation;       /* CAP_PROP_ORIENTATION_META (degrees, not applied) */
    int32_t threads;        /* the decoder's thread_count */
    char codec[32];         /* the decoder's name */
    char pix_fmt[32];       /* the stream's pixel format ("" when unknown) */
} pw_video_info;

/* Opens an in-memory file. `data` (and `stop`, when not NULL) must outlive the handle. `threads` <= 0
 * means min(cores, 16), as OpenCV. `max_pixels` (> 0) bounds the frame size
 * FFmpeg's decoders accept, also while probing the stream. */
int pw_video_open(const uint8_t *data, size_t size, int threads, int64_t max_pixels,
                  const int *stop, pw_video **out, char *err, size_t err_len);
/* Asked between packets (and by the demuxer as it reads) with the count
 * of packets decoded so far: nonzero stops the work as `stop` does. It may
 * block (the caller waits for its turn at decoding). */
typedef int (*pw_pace)(void *opaque, int64_t packets_decoded);
/* Sets (or, with NULL, clears) `pace`; `opaque` must outlive the handle. */
void pw_video_set_pace(pw_video *v, pw_pace pace, void *opaque);
/* Whether work stopped because `*stop` (pw_video_open's, set to nonzero by
 * another thread) asked it to: every grab from then on returns no frame,
 * the seeks and the end-of-stream check included. */
int pw_video_stopped(const pw_video *v);
void pw_video_get_info(const pw_video *v, pw_video_info *info);
/* The frame count vLLM's loader samples over: CAP_PROP_FRAME_COUNT, unless
 * OpenCV's seek to the end (CAP_PROP_POS_AVI_RATIO = 1) lands at the real
 * end of the stream more than one frame earlier (an edit list hiding a
 * lead-in, a count the header overstates), as vLLM's get_video_metadata
 * checks. Seeks back to the start afterwards, as vLLM does. */
int64_t pw_video_presentable_frames(pw_video *v);
/* The same count with the decoding shared with the read, where that can
 * give OpenCV's answer: an H.264 or HEVC stream whose seek to the end lands
 * on an IDR picture, or a VP9 stream whose seek lands on a shown key frame,
 * with at least as many packets after it as the header's count leaves
 * there. Then it returns 1 with `frame_count` the header's
 * count, provisional: it holds when a read from the start finds the frame
 * shown at `landing_pts` numbered at most `landing_number` + 1 and every
 * frame from there to `frame_count` - 1 decoding (frames the check would
 * decode). Otherwise it decodes the end as pw_video_presentable_frames and
 * returns 0 with the settled `frame_count`. Back at the start either way. */
typedef struct {
    int64_t frame_count;
    int64_t landing_pts;    /* the raw timestamp of the frame the seek lands on */
    int64_t landing_number; /* OpenCV's number for it after the seek */
} pw_video_end;
int pw_video_presentable_frames_deferred(pw_video *v, pw_video_end *end);
/* How many packets the decoder has been given since open (seeks included). */
int64_t pw_video_packets_decoded(const pw_video *v);
/* The raw timestamp of the last grabbed frame. */
int64_t pw_video_frame_pts(const pw_video *v);
/* Decodes the next frame: 1 when there is one (OpenCV's grab() == true). */
int pw_video_grab(pw_video *v);
/* 1 once every later grab must fail too (end of stream, decoder drained),
 * so a caller can stop instead of asking for frames a header promised. */
int pw_video_finished(const pw_video *v);
/* Converts the last grabbed frame into `dst` (width * height * 3 bytes, RGB,
 * rows packed): 1 on success, 0 where OpenCV's retrieve() fails. */
int pw_video_retrieve(pw_video *v, uint8_t *dst);
/* Same, but asks swscale for RGB24 directly instead of BGR24 then a swap
 * (kept to check that the two are byte-identical). */
int pw_video_retrieve_rgb_direct(pw_video *v, uint8_t *dst);
/* Reading only some frames, from the start (frame_number 0): for H.264 and
 * HEVC (with hvcC), packets of frames nobody references are not decoded
 * unless their frame is among `wanted` (sorted, distinct, OpenCV's frame
 * numbers), nor (with avcC or hvcC) those of reference frames that no
 * frame needed depends on (skipper_plan: `through` is the last frame the
 * read grabs, frames from `decode_from` on are all decoded). 1 when
 * skipping is on; then pw_video_frame_index names each grabbed frame, and
 * once pw_video_skip_failed says so the numbers, or (the decoder reported
 * an error) the pixels, can no longer be trusted: the caller reads again
 * without skipping, from a fresh handle. */
int pw_video_skip_unwanted(pw_video *v, const int64_t *wanted, size_t n, int64_t through,
                           int64_t decode_from);
/* Where decoding may start afresh and give the same frames: the numbers
 * (OpenCV's) of the frames that begin each coded video sequence of an H.264
 * or HEVC stream the skipper can number (avcC or hvcC), up to `cap` of them
 * in `starts`, increasing from 0. Returns how many there are, or -1 where
 * the stream cannot be split so (another codec, Annex B, timestamps
 * missing or repeated, a packet decoded and never output). Reads the
 * packets once (no decoding); call before any grab. */
int64_t pw_video_sequence_starts(pw_video *v, int64_t *starts, size_t cap);
/* OpenCV's number of the last grabbed frame. */
int64_t pw_video_frame_index(const pw_video *v);
int pw_video_skip_failed(const pw_video *v);
void pw_video_close(pw_video *v);

/* What this build of FFmpeg holds, for a test to list: the name of the
 * `index`-th component of `kind`, or NULL past the last one. */
enum { PW_DEMUXERS = 0, PW_INPUT_PROTOCOLS = 1, PW_DECODERS = 2 };
const char *pw_component_name(int kind, size_t index);

#endif
