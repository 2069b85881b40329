/* See pw_video.h. Line references are to OpenCV 5.1.0's
 * modules/videoio/src/cap_ffmpeg_impl.hpp. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "pw_video.h"
#include "pw_skip.h"

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/mathematics.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* OpenCV's retry budgets (OPENCV_FFMPEG_READ_ATTEMPTS / _DECODE_ATTEMPTS). */
#define MAX_READ_ATTEMPTS 4096
#define MAX_DECODE_ATTEMPTS 64
/* skipper_plan's packets: 16 MiB of them at most. */
#define MAX_PLANNED_PACKETS ((size_t)1 << 20)
/* OpenCV's stream reader buffer. */
#define AVIO_BUFFER_SIZE 4096

struct pw_video {
    const uint8_t *data;
    size_t size;
    int64_t pos;
    AVIOContext *avio;
    AVFormatContext *ic;
    AVCodecContext *ctx;
    const AVCodec *codec;
    int stream;
    AVPacket *packet;
    AVFrame *picture;
    AVFrame *bgr;
    AVFrame *rgb;
    struct SwsContext *sws;
    struct SwsContext *sws_rgb;
    int sws_threads;
    int finished; /* the demuxer is at its end and the decoder drained */
    /* OpenCV's position bookkeeping, which its seek relies on. */
    int64_t picture_pts;
    int64_t frame_number;
    int64_t first_frame_number;
    int64_t ts_offset_avtb;
    int ts_offset_decided;
    int64_t packets_decoded; /* sent to the decoder since open */
    int decoder_errors;      /* reported by the decoder (count_decoder_error), atomic */
    int errors_before_skip;  /* decoder_errors when skipping began */
    struct skipper skip;
    const int *stop;         /* nonzero (set by another thread): stop decoding; may be NULL */
    pw_pace pace;            /* asked between packets whether to go on; may be NULL */
    void *pace_opaque;
    int stopped;             /* a grab or the demuxer found `stop` set, or `pace` said stop */
};

static int stop_asked(pw_video *v) {
    if (v->stop && __atomic_load_n(v->stop, __ATOMIC_RELAXED))
        v->stopped = 1;
    if (!v->stopped && v->pace && v->pace(v->pace_opaque, v->packets_decoded))
        v->stopped = 1;
    return v->stopped;
}

void pw_video_set_pace(pw_video *v, pw_pace pace, void *opaque) {
    v->pace = pace;
    v->pace_opaque = opaque;
}

/* FFmpeg's interrupt callback: avformat_find_stream_info and the demuxers
 * check it while they read. */
static int interrupted(void *opaque) {
    return stop_asked(opaque);
}

static int read_packet(void *opaque, uint8_t *buf, int buf_size) {
    pw_video *v = opaque;
    if (stop_asked(v))
        return AVERROR_EXIT;
    int64_t left = (int64_t)v->size - v->pos;
    if (left <= 0 || buf_size <= 0)
        return buf_size > 0 ? AVERROR_EOF : 0;
    int n = left < buf_size ? (int)left : buf_size;
    memcpy(buf, v->data + v->pos, (size_t)n);
    v->pos += n;
    return n;
}

/* As OpenCV's stream seek: SEEK_SET/CUR/END only, so AVSEEK_SIZE is refused
 * (-1) and FFmpeg does not learn the size that way. */
static int64_t seek(void *opaque, int64_t offset, int whence) {
    pw_video *v = opaque;
    int origin = whence & ~AVSEEK_FORCE;
    int64_t base;
    if (origin == SEEK_SET)
        base = 0;
    else if (origin == SEEK_CUR)
        base = v->pos;
    else if (origin == SEEK_END)
        base = (int64_t)v->size;
    else
        return -1;
    int64_t to = base + offset;
    if (to < 0)
        return -1;
    v->pos = to;
    return to;
}

static void set_error(char *err, size_t err_len, const char *what, int code) {
    if (!err || !err_len)
        return;
    if (code) {
        char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
        av_strerror(code, buf, sizeof buf);
        snprintf(err, err_len, "%s: %s", what, buf);
    } else {
        snprintf(err, err_len, "%s", what);
    }
}

/* The CPUs this process may run on (its affinity mask, which taskset and a
 * container's cpuset narrow), up to 16; the online CPUs where the mask
 * cannot be read. */
static int default_threads(void) {
    long n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
#endif
    if (n < 1)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > 16 ? 16 : (int)n;
}

void pw_video_close(pw_video *v) {
    if (!v)
        return;
    skipper_free(&v->skip);
    sws_freeContext(v->sws);
    sws_freeContext(v->sws_rgb);
    av_frame_free(&v->bgr);
    av_frame_free(&v->rgb);
    av_frame_free(&v->picture);
    av_packet_free(&v->packet);
    avcodec_free_context(&v->ctx);
    avformat_close_input(&v->ic);
    if (v->avio) {
        av_freep(&v->avio->buffer);
        avio_context_free(&v->avio);
    }
    av_free(v);
}

/* FFmpeg's log callback: nothing is printed (as with AV_LOG_QUIET), but an
 * error or warning a video's decoder reports (its context, or a frame
 * thread's copy, names the video in `opaque`) is counted on the video. A
 * read that skips packets gives up on one (pw_video_grab): the decoder's error
 * concealment fills a damaged picture from the last one it decoded, which
 * is another picture when packets were skipped. */
static void count_decoder_error(void *avcl, int level, const char *fmt, va_list vl) {
    (void)fmt;
    (void)vl;
    if (level > AV_LOG_WARNING || !avcl || *(const AVClass **)avcl != avcodec_get_class())
        return;
    pw_video *v = ((AVCodecContext *)avcl)->opaque;
    if (v)
        __atomic_fetch_add(&v->decoder_errors, 1, __ATOMIC_RELAXED);
}

int pw_video_open(const uint8_t *data, size_t size, int threads, int64_t max_pixels,
                  const int *stop, pw_video **out, char *err, size_t err_len) {
    *out = NULL;
    av_log_set_level(AV_LOG_QUIET);
    av_log_set_callback(count_decoder_error);
    pw_video *v = av_mallocz(sizeof *v);
    if (!v)
        return PW_ERR_MEMORY;
    v->data = data;
    v->size = size;
    v->stop = stop;
    v->stream = -1;
    v->picture_pts = AV_NOPTS_VALUE;
    v->first_frame_number = -1;
    v->sws_threads = threads > 0 ? threads : default_threads();
    int code = PW_ERR_MEMORY;
    int ret = 0;
    AVDictionary **probe_opts = NULL;

    uint8_t *buffer = av_malloc(AVIO_BUFFER_SIZE);
    if (!buffer)
        goto fail;
    v->avio = avio_alloc_context(buffer, AVIO_BUFFER_SIZE, 0, v, read_packet, NULL, seek);
    if (!v->avio) {
        av_free(buffer);
        goto fail;
    }
    v->ic = avformat_alloc_context();
    if (!v->ic)
        goto fail;
    v->ic->pb = v->avio;
    v->ic->interrupt_callback.callback = interrupted;
    v->ic->interrupt_callback.opaque = v;
    ret = avformat_open_input(&v->ic, NULL, NULL, NULL);
    if (ret < 0) {
        /* avformat_open_input frees the context on failure. */
        code = PW_ERR_FORMAT;
        set_error(err, err_len, "not a video container pixelwire can read", ret);
        goto fail;
    }

    {
        int seen_video = 0;
        for (unsigned i = 0; i < v->ic->nb_streams; i++) {
            if (v->ic->streams[i]->codecpar->codec_type != AVMEDIA_TYPE_VIDEO)
                continue;
            if (seen_video++)
                v->ic->streams[i]->discard = AVDISCARD_ALL;
        }
    }
    /* The probing decoders get the same frame-size bound as ours. */
    if (max_pixels > 0 && v->ic->nb_streams > 0) {
        probe_opts = av_calloc(v->ic->nb_streams, sizeof *probe_opts);
        if (!probe_opts)
            goto fail;
        for (unsigned i = 0; i < v->ic->nb_streams; i++) {
            av_dict_set_int(&probe_opts[i], "max_pixels", max_pixels, 0);
        }
    }
    ret = avformat_find_stream_info(v->ic, probe_opts);
    if (ret < 0) {
        code = PW_ERR_FORMAT;
        set_error(err, err_len, "cannot read the stream parameters", ret);
        goto fail;
    }

    /* OpenCV takes the first video stream (not av_find_best_stream). */
    int video_seen = 0;
    for (unsigned i = 0; i < v->ic->nb_streams; i++) {
        AVCodecParameters *par = v->ic->streams[i]->codecpar;
        if (par->codec_type != AVMEDIA_TYPE_VIDEO)
            continue;
        video_seen = 1;
        if (max_pixels > 0 && (int64_t)par->width * par->height > max_pixels) {
            code = PW_ERR_TOO_LARGE;
            snprintf(err, err_len, "%dx%d", par->width, par->height);
            goto fail;
        }
        const AVCodec *codec = avcodec_find_decoder(par->codec_id);
        if (!codec) {
            code = PW_ERR_NO_DECODER;
            snprintf(err, err_len, "no decoder for the video codec %s", avcodec_get_name(par->codec_id));
            continue;
        }
        v->ctx = avcodec_alloc_context3(codec);
        if (!v->ctx)
            goto fail;
        v->ctx->thread_count = threads > 0 ? threads : default_threads();
        v->ctx->opaque = v;
        if (avcodec_parameters_to_context(v->ctx, par) < 0)
            goto fail;
        if (max_pixels > 0)
            v->ctx->max_pixels = max_pixels;
        ret = avcodec_open2(v->ctx, codec, NULL);
        if (ret < 0) {
            code = PW_ERR_DECODER;
            set_error(err, err_len, "the decoder refused the stream", ret);
            goto fail;
        }
        /* "decoder can sometimes alter it": OpenCV restores the coded size. */
        if (par->width && v->ctx->width != par->width)
            v->ctx->width = par->width;
        if (par->height && v->ctx->height != par->height)
            v->ctx->height = par->height;
        v->codec = codec;
        v->stream = (int)i;
        break;
    }
    if (v->stream < 0) {
        if (!video_seen) {
            code = PW_ERR_NO_VIDEO;
            snprintf(err, err_len, "no video stream");
        }
        goto fail;
    }
    v->packet = av_packet_alloc();
    v->picture = av_frame_alloc();
    v->bgr = av_frame_alloc();
    v->rgb = av_frame_alloc();
    if (!v->packet || !v->picture || !v->bgr || !v->rgb)
        goto fail;
    if (probe_opts) {
        for (unsigned i = 0; i < v->ic->nb_streams; i++)
            av_dict_free(&probe_opts[i]);
        av_free(probe_opts);
    }
    *out = v;
    return PW_OK;

fail:
    if (probe_opts && v->ic) {
        for (unsigned i = 0; i < v->ic->nb_streams; i++)
            av_dict_free(&probe_opts[i]);
    }
    av_free(probe_opts);
    if (code == PW_ERR_MEMORY && err && err_len)
        snprintf(err, err_len, "out of memory");
    pw_video_close(v);
    return code;
}

static double r2d(AVRational r) {
    return r.num == 0 || r.den == 0 ? 0. : (double)r.num / (double)r.den;
}

/* get_duration_sec (l. 2208). */
static double duration_sec(const pw_video *v) {
    double sec = (double)v->ic->duration / (double)AV_TIME_BASE;
    if (sec < 0.000025) {
        AVStream *st = v->ic->streams[v->stream];
        sec = (double)st->duration * r2d(st->time_base);
    }
    return sec;
}

/* get_fps (l. 2225). */
static double fps(const pw_video *v) {
    AVStream *st = v->ic->streams[v->stream];
    double f = r2d(st->avg_frame_rate);
    if (f < 0.000025)
        f = r2d(av_guess_frame_rate(v->ic, st, NULL));
    if (f < 0.000025)
        f = 1.0 / r2d(st->time_base);
    return f;
}

void pw_video_get_info(const pw_video *v, pw_video_info *info) {
    memset(info, 0, sizeof *info);
    AVStream *st = v->ic->streams[v->stream];
    info->width = v->ctx->width;
    info->height = v->ctx->height;
    info->fps = fps(v);
    info->duration_sec = duration_sec(v);
    /* get_total_frames (l. 2248). */
    info->frame_count = st->nb_frames;
    if (info->frame_count == 0)
        info->frame_count = (int64_t)floor(info->duration_sec * info->fps + 0.5);
    /* get_rotation_angle (l. 2276). */
    const AVPacketSideData *sd = av_packet_side_data_get(
        st->codecpar->coded_side_data, st->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
    if (sd && sd->size >= 9 * sizeof(int32_t)) {
        int angle = -(int)lrint(av_display_rotation_get((const int32_t *)sd->data));
        if (angle < 0)
            angle += 360;
        info->rotation = angle;
    }
    info->threads = v->ctx->thread_count;
    snprintf(info->codec, sizeof info->codec, "%s", v->codec->name);
    const char *fmt = av_get_pix_fmt_name((enum AVPixelFormat)st->codecpar->format);
    snprintf(info->pix_fmt, sizeof info->pix_fmt, "%s", fmt ? fmt : "");
}

static int64_t to_avtb(int64_t ts, AVRational tb) {
    return av_rescale_q(ts, tb, av_make_q(1, AV_TIME_BASE));
}

static int64_t from_avtb(int64_t ts, AVRational tb) {
    return av_rescale_q(ts, av_make_q(1, AV_TIME_BASE), tb);
}

/* dts_to_sec and dts_to_frame_number (l. 2262-2275). */
static double dts_to_sec(const pw_video *v, int64_t dts) {
    const AVStream *st = v->ic->streams[v->stream];
    int64_t ts = dts;
    if (v->ts_offset_avtb == 0 && st->start_time != AV_NOPTS_VALUE)
        ts -= st->start_time;
    return (double)ts * r2d(st->time_base);
}

static int64_t dts_to_frame_number(const pw_video *v, int64_t dts) {
    return (int64_t)(fps(v) * dts_to_sec(v, dts) + 0.5);
}

/* The end of grabFrame (l. 1722-1812): the frame's timestamp, normalised to
 * start at zero, the frame counter and the first frame's number. */
static void track_position(pw_video *v) {
    AVStream *st = v->ic->streams[v->stream];
    AVFrame *pic = v->picture;
    int64_t dts = 0;
    v->picture_pts = pic->pts != AV_NOPTS_VALUE ? pic->pts : pic->pkt_dts;
    if (v->frame_number == 0)
        dts = pic->pkt_dts;
    if (!v->ts_offset_decided) {
        int64_t min_start = INT64_MAX;
        if (v->ic->start_time != AV_NOPTS_VALUE)
            min_start = v->ic->start_time;
        if (st->start_time != AV_NOPTS_VALUE) {
            int64_t t = to_avtb(st->start_time, st->time_base);
            if (t < min_start)
                min_start = t;
        }
        int64_t first = v->picture_pts;
        if (first == AV_NOPTS_VALUE && dts != AV_NOPTS_VALUE)
            first = dts;
        if (first != AV_NOPTS_VALUE) {
            int64_t t = to_avtb(first, st->time_base);
            if (t < min_start)
                min_start = t;
        }
        v->ts_offset_avtb = (min_start != INT64_MAX && min_start < 0) ? -min_start : 0;
        v->ts_offset_decided = 1;
    }
    if (v->picture_pts != AV_NOPTS_VALUE) {
        int64_t t = to_avtb(v->picture_pts, st->time_base) + v->ts_offset_avtb;
        v->picture_pts = from_avtb(t, st->time_base);
    }
    v->frame_number++;
    if (v->first_frame_number < 0)
        v->first_frame_number = dts_to_frame_number(v, v->picture_pts);
}

/* grabFrame (l. 1617), without the raw mode. */
int pw_video_grab(pw_video *v) {
    size_t read_attempts = 0, decode_attempts = 0;
    v->picture_pts = AV_NOPTS_VALUE;
    if (stop_asked(v))
        return 0;
    int valid = avcodec_receive_frame(v->ctx, v->picture) >= 0;
    while (!valid) {
        if (stop_asked(v))
            return 0;
        av_packet_unref(v->packet);
        int ret = av_read_frame(v->ic, v->packet);
        if (ret == AVERROR(EAGAIN))
            continue;
        if (ret == AVERROR_EOF) {
            /* Flush the frames the decoder still holds. */
            v->packet->data = NULL;
            v->packet->size = 0;
            v->packet->stream_index = v->stream;
        }
        if (v->packet->stream_index != v->stream) {
            av_packet_unref(v->packet);
            if (++read_attempts > MAX_READ_ATTEMPTS)
                break;
            continue;
        }
        if (v->skip.on && ret != AVERROR_EOF && skip_packet(&v->skip, v->packet))
            continue;
        if (avcodec_send_packet(v->ctx, v->packet) < 0) {
            if (ret == AVERROR_EOF)
                v->finished = 1;
            break;
        }
        v->packets_decoded += ret != AVERROR_EOF;
        ret = avcodec_receive_frame(v->ctx, v->picture);
        if (ret >= 0)
            valid = 1;
        else if (ret == AVERROR(EAGAIN))
            continue;
        else if (++decode_attempts > MAX_DECODE_ATTEMPTS)
            break;
    }
    if (valid)
        track_position(v);
    if (v->skip.on) {
        /* Damage the decoder met or concealed, in this frame or one
         * decoded before it: decoding every frame may give other pixels. */
        if (__atomic_load_n(&v->decoder_errors, __ATOMIC_RELAXED) != v->errors_before_skip ||
            (valid && (v->picture->decode_error_flags || (v->picture->flags & AV_FRAME_FLAG_CORRUPT))))
            v->skip.failed = 1;
        skip_after_grab(&v->skip, valid ? v->picture : NULL, v->finished);
    }
    return valid;
}

/* retrieveFrame (l. 1823) for swscale >= 8.12.100: a context given only its
 * flags and threads (no size, format or colorspace), a BGR24 frame of the
 * stream's size aligned to 32, the field flags copied, sws_scale_frame. */
static int convert(pw_video *v, struct SwsContext **sws, AVFrame *out, enum AVPixelFormat format) {
    AVFrame *pic = v->picture;
    if (!pic->data[0])
        return 0;
    int w = v->ic->streams[v->stream]->codecpar->width;
    int h = v->ic->streams[v->stream]->codecpar->height;
    if (!*sws || out->width != w || out->height != h || !out->data[0]) {
        sws_freeContext(*sws);
        *sws = sws_alloc_context();
        if (!*sws)
            return 0;
        av_opt_set_int(*sws, "sws_flags", SWS_BICUBIC, 0);
        av_opt_set_int(*sws, "threads", v->sws_threads, 0);
        av_frame_unref(out);
        out->format = format;
        out->width = w;
        out->height = h;
        if (av_frame_get_buffer(out, 32) != 0)
            return 0;
    }
    const int field_flags = AV_FRAME_FLAG_INTERLACED | AV_FRAME_FLAG_TOP_FIELD_FIRST;
    out->flags = (out->flags & ~field_flags) | (pic->flags & field_flags);
    return sws_scale_frame(*sws, out, pic) >= 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <tmmintrin.h>
/* The first bytes of a row of `row` bytes (3 a pixel) with each pixel's
 * first and third bytes swapped, 5 pixels a shuffle: how many were done.
 * Each step reads and writes 16 bytes and keeps 15; the 16th, the next
 * pixel's first byte, is written again by the next step or the caller. */
__attribute__((target("ssse3"))) static size_t swap_pixels_ssse3(const uint8_t *s, uint8_t *d,
                                                                 size_t row) {
    const __m128i order = _mm_setr_epi8(2, 1, 0, 5, 4, 3, 8, 7, 6, 11, 10, 9, 14, 13, 12, 15);
    size_t x = 0;
    for (; x + 16 <= row; x += 15) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + x));
        _mm_storeu_si128((__m128i *)(d + x), _mm_shuffle_epi8(v, order));
    }
    return x;
}

static int have_ssse3(void) {
    return __builtin_cpu_supports("ssse3");
}
#else
static size_t swap_pixels_ssse3(const uint8_t *s, uint8_t *d, size_t row) {
    (void)s;
    (void)d;
    (void)row;
    return 0;
}

static int have_ssse3(void) {
    return 0;
}
#endif

/* The frame's rows, packed, into `dst`; with `swap`, BGR to RGB (what
 * cv2.cvtColor(BGR2RGB) does: each pixel's first and third bytes swapped). */
static void copy_rows(const AVFrame *from, uint8_t *dst, int swap) {
    size_t row = (size_t)from->width * 3;
    int simd = swap && have_ssse3();
    for (int y = 0; y < from->height; y++) {
        const uint8_t *s = from->data[0] + (ptrdiff_t)y * from->linesize[0];
        uint8_t *d = dst + (size_t)y * row;
        if (!swap) {
            memcpy(d, s, row);
            continue;
        }
        size_t x = simd ? swap_pixels_ssse3(s, d, row) : 0;
        for (; x < row; x += 3) {
            d[x] = s[x + 2];
            d[x + 1] = s[x + 1];
            d[x + 2] = s[x];
        }
    }
}

int pw_video_stopped(const pw_video *v) {
    return v->stopped;
}

int pw_video_finished(const pw_video *v) {
    return v->finished;
}

int pw_video_retrieve(pw_video *v, uint8_t *dst) {
    if (!convert(v, &v->sws, v->bgr, AV_PIX_FMT_BGR24))
        return 0;
    copy_rows(v->bgr, dst, 1);
    return 1;
}

int pw_video_retrieve_rgb_direct(pw_video *v, uint8_t *dst) {
    if (!convert(v, &v->sws_rgb, v->rgb, AV_PIX_FMT_RGB24))
        return 0;
    copy_rows(v->rgb, dst, 0);
    return 1;
}

static int64_t total_frames(const pw_video *v) {
    pw_video_info info;
    pw_video_get_info(v, &info);
    return info.frame_count;
}

/* The first half of seek(int64_t) (l. 2309): to the keyframe before the
 * target, one grab there, widening the step back while the landing is past
 * the target. 1 when it landed before the target, with `frame_number` the
 * landing frame's number and frames still to be grabbed forward to it; 0
 * when OpenCV's seek ends here. `*seek_ts` gets the timestamp last sought. */
static int seek_land(pw_video *v, int64_t target, int64_t *seek_ts) {
    AVStream *st = v->ic->streams[v->stream];
    int64_t total = total_frames(v);
    if (target > total)
        target = total;
    int64_t delta = 16;
    if (v->first_frame_number < 0 && total > 1)
        pw_video_grab(v);
    for (;;) {
        int64_t temp = target - delta > 0 ? target - delta : 0;
        double sec = (double)temp / fps(v);
        int64_t time_stamp = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
        int64_t ts_norm = (int64_t)(sec / r2d(st->time_base) + 0.5);
        if (v->ts_offset_avtb != 0)
            time_stamp += ts_norm - from_avtb(v->ts_offset_avtb, st->time_base);
        else
            time_stamp += ts_norm;
        if (total > 1)
            av_seek_frame(v->ic, v->stream, time_stamp, AVSEEK_FLAG_BACKWARD);
        if (seek_ts)
            *seek_ts = total > 1 ? time_stamp : AV_NOPTS_VALUE;
        avcodec_flush_buffers(v->ctx);
        v->finished = 0;
        if (target <= 0) {
            v->frame_number = 0;
            v->picture_pts = AV_NOPTS_VALUE;
            return 0;
        }
        pw_video_grab(v);
        if (target == 1) {
            v->frame_number = 1;
            return 0;
        }
        v->frame_number = dts_to_frame_number(v, v->picture_pts) - v->first_frame_number;
        if (v->frame_number < 0 || v->frame_number > target - 1) {
            if (temp == 0 || delta >= INT_MAX / 4)
                return 0;
            delta = delta < 16 ? delta * 2 : delta * 3 / 2;
            continue;
        }
        return 1;
    }
}

/* seek(int64_t): the landing, then grabs forward to the target. */
static void seek_frame(pw_video *v, int64_t target) {
    int64_t total = total_frames(v);
    if (target > total)
        target = total;
    if (!seek_land(v, target, NULL))
        return;
    while (v->frame_number < target - 1) {
        if (!pw_video_grab(v))
            break;
    }
    v->frame_number++;
}

/* cap.set(CAP_PROP_POS_AVI_RATIO, 1.0): seek((int64_t)(1.0 * duration)),
 * a frame number far past the end, which the seek caps at the count. */
static int64_t end_target(const pw_video *v) {
    return (int64_t)(1.0 * (double)v->ic->duration);
}

int64_t pw_video_presentable_frames(pw_video *v) {
    int64_t total = total_frames(v);
    if (total <= 0)
        return total;
    if (v->ic->duration != AV_NOPTS_VALUE)
        seek_frame(v, end_target(v));
    else
        v->frame_number = 0;
    int64_t visible = v->frame_number;
    int at_end = !pw_video_grab(v);
    seek_frame(v, 0);
    if (at_end && 0 < visible && visible < total - 1)
        return visible;
    return total;
}

/* The length prefix size of the stream's NAL units, from its avcC (H.264)
 * or hvcC (HEVC) configuration record; 0 without one (Annex B start
 * codes, or another codec). */
static int config_nal_length_size(const pw_video *v) {
    const uint8_t *extra = v->ctx->extradata;
    int extra_size = v->ctx->extradata_size;
    if (v->codec->id == AV_CODEC_ID_H264 && extra && extra_size >= 7 && extra[0] == 1)
        return (extra[4] & 3) + 1;
    if (v->codec->id == AV_CODEC_ID_HEVC && extra && extra_size >= 23 && extra[0] == 1)
        return (extra[21] & 3) + 1;
    return 0;
}

/* 1 when an access unit starts an H.264 or HEVC coded video sequence with
 * an IDR picture (no picture after it refers to one before it, none is
 * shown before it), or a VP9 packet with a shown key frame (which resets
 * every reference slot and probability context); 0 also for an H.264 or
 * HEVC stream without avcC or hvcC. */
static int starts_with_idr(const pw_video *v, const AVPacket *pkt) {
    if (v->codec->id == AV_CODEC_ID_VP9)
        return pw_vp9_shown_key_frame(pkt->data, (size_t)pkt->size);
    int nal_length_size = config_nal_length_size(v);
    if (!nal_length_size)
        return 0;
    return pw_access_unit_is_idr(v->codec->id, nal_length_size, pkt->data, (size_t)pkt->size);
}

/* Video packets from where `seek_ts` lands to the end, without decoding
 * them: their count when the first is an IDR access unit whose timestamp
 * is `landing_pts` (the frame the decoder output first there) and none
 * after it is shown before it; -1 otherwise. */
static int64_t packets_from_landing(pw_video *v, int64_t seek_ts, int64_t landing_pts) {
    AVPacket *pkt = av_packet_alloc();
    if (!pkt)
        return -1;
    int64_t count = 0;
    av_seek_frame(v->ic, v->stream, seek_ts, AVSEEK_FLAG_BACKWARD);
    avcodec_flush_buffers(v->ctx);
    for (size_t reads = 0;; reads++) {
        if (stop_asked(v)) {
            count = -1;
            break;
        }
        int ret = av_read_frame(v->ic, pkt);
        if (ret == AVERROR_EOF)
            break;
        if (ret == AVERROR(EAGAIN) && reads < MAX_READ_ATTEMPTS)
            continue;
        if (ret < 0) {
            count = -1;
            break;
        }
        int ours = pkt->stream_index == v->stream && !(pkt->flags & AV_PKT_FLAG_DISCARD);
        if (ours && count == 0 && (pkt->pts != landing_pts || !starts_with_idr(v, pkt))) {
            count = -1;
            av_packet_unref(pkt);
            break;
        }
        if (ours && (pkt->pts == AV_NOPTS_VALUE || (count > 0 && pkt->pts <= landing_pts))) {
            count = -1;
            av_packet_unref(pkt);
            break;
        }
        count += ours;
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    return count;
}

int pw_video_presentable_frames_deferred(pw_video *v, pw_video_end *end) {
    memset(end, 0, sizeof *end);
    int64_t total = total_frames(v);
    end->frame_count = total;
    if (total <= 1 || v->ic->duration == AV_NOPTS_VALUE ||
        (v->codec->id != AV_CODEC_ID_H264 && v->codec->id != AV_CODEC_ID_HEVC &&
         v->codec->id != AV_CODEC_ID_VP9)) {
        end->frame_count = pw_video_presentable_frames(v);
        return 0;
    }
    int64_t seek_ts = AV_NOPTS_VALUE;
    int landed = seek_land(v, end_target(v), &seek_ts);
    int64_t landing_pts = v->picture->pts;
    int64_t landing_number = v->frame_number;
    int64_t packets = -1;
    if (landed && seek_ts != AV_NOPTS_VALUE && landing_pts != AV_NOPTS_VALUE)
        packets = packets_from_landing(v, seek_ts, landing_pts);
    /* With as many frames as packets from the landing on, OpenCV's check
     * would find the header's count (the read confirms that many decode);
     * with fewer, the stream ends early and is decoded here, as OpenCV. */
    if (packets < 0 || landing_number + packets < total - 1) {
        end->frame_count = pw_video_presentable_frames(v);
        return 0;
    }
    seek_frame(v, 0);
    end->landing_pts = landing_pts;
    end->landing_number = landing_number;
    return 1;
}

int64_t pw_video_packets_decoded(const pw_video *v) {
    return v->packets_decoded;
}

int64_t pw_video_frame_pts(const pw_video *v) {
    return v->picture->pts;
}

/* 1 when every PPS in hvcC's arrays is readable and outputs every picture
 * (no pic_output_flag in slices), so skipping counts no picture that the
 * decoder would not output. */
static int hvcc_pps_output_all(const uint8_t *extra, int size) {
    int at = 23;
    for (int arrays = extra[22]; arrays > 0; arrays--) {
        if (at + 3 > size)
            return 0;
        int type = extra[at] & 0x3f, count = (extra[at + 1] << 8) | extra[at + 2];
        at += 3;
        for (; count > 0; count--) {
            if (at + 2 > size)
                return 0;
            int len = (extra[at] << 8) | extra[at + 1];
            at += 2;
            if (len > size - at)
                return 0;
            if (type == 34 && pw_hevc_pps_output_flag_present(extra + at, (size_t)len) != 0)
                return 0;
            at += len;
        }
    }
    return 1;
}

/* Every packet of the video stream from the start, in decoding order, for
 * skipper_plan (NULL when out of memory, unreadable or over
 * MAX_PLANNED_PACKETS); back at the start after. */
static struct planned_packet *planned_packets(pw_video *v, int nal_length_size, size_t *n) {
    struct planned_packet *list = NULL;
    size_t cap = 0;
    AVPacket *pkt = av_packet_alloc();
    int ok = pkt != NULL;
    *n = 0;
    for (size_t reads = 0; ok;) {
        int ret = av_read_frame(v->ic, pkt);
        if (ret == AVERROR_EOF)
            break;
        if (ret == AVERROR(EAGAIN) && ++reads < MAX_READ_ATTEMPTS)
            continue;
        if (ret < 0) {
            ok = 0;
            break;
        }
        if (pkt->stream_index == v->stream) {
            if (*n == cap) {
                size_t grown = cap ? cap * 2 : 1024;
                struct planned_packet *bigger =
                    grown > MAX_PLANNED_PACKETS ? NULL : av_realloc_array(list, grown, sizeof *list);
                if (!bigger) {
                    ok = 0;
                    av_packet_unref(pkt);
                    break;
                }
                list = bigger;
                cap = grown;
            }
            list[(*n)++] = (struct planned_packet){
                .pts = pkt->pts,
                .idr = pw_access_unit_is_idr(v->codec->id, nal_length_size, pkt->data, (size_t)pkt->size),
                .discard = (pkt->flags & AV_PKT_FLAG_DISCARD) != 0,
            };
        }
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    seek_frame(v, 0);
    if (!ok)
        av_freep(&list);
    return list;
}

/* Whether the stream's frames can be skipped (H.264, HEVC with hvcC whose
 * pictures are all output): 1 with `k`'s codec, length prefix size (0:
 * Annex B) and highest sub-layer set. */
static int skippable(const pw_video *v, struct skipper *k) {
    const uint8_t *extra = v->ctx->extradata;
    int extra_size = v->ctx->extradata_size;
    if (v->codec->id == AV_CODEC_ID_H264) {
        k->nal_length_size = config_nal_length_size(v); /* 0: Annex B */
    } else if (v->codec->id == AV_CODEC_ID_HEVC) {
        /* Only with hvcC, whose numTemporalLayers (0: unknown) says which
         * sub-layer is the highest; Annex B HEVC is read without skipping. */
        int layers = extra && extra_size >= 23 && extra[0] == 1 ? (extra[21] >> 3) & 7 : 0;
        if (layers == 0 || !hvcc_pps_output_all(extra, extra_size))
            return 0;
        k->nal_length_size = config_nal_length_size(v);
        k->highest_tid = layers - 1;
    } else {
        return 0;
    }
    k->codec = v->codec->id;
    return 1;
}

int64_t pw_video_sequence_starts(pw_video *v, int64_t *starts, size_t cap) {
    struct skipper k = {0};
    if (v->frame_number != 0 || !skippable(v, &k) || !k.nal_length_size || total_frames(v) <= 1)
        return -1;
    size_t n_packets = 0;
    struct planned_packet *packets = planned_packets(v, k.nal_length_size, &n_packets);
    if (!packets)
        return -1;
    int64_t count = sequence_starts(packets, n_packets, starts, cap);
    av_free(packets);
    return count;
}

int pw_video_skip_unwanted(pw_video *v, const int64_t *wanted, size_t n, int64_t through,
                           int64_t decode_from) {
    skipper_free(&v->skip);
    if (n == 0 || v->frame_number != 0)
        return 0;
    struct skipper *k = &v->skip;
    if (!skippable(v, k))
        return 0;
    k->wanted = av_malloc_array(n, sizeof *k->wanted);
    if (!k->wanted)
        return 0;
    memcpy(k->wanted, wanted, n * sizeof *wanted);
    for (size_t i = 1; i < n; i++) {
        if (k->wanted[i - 1] >= k->wanted[i]) {
            skipper_free(k);
            return 0;
        }
    }
    k->n_wanted = n;
    k->index = -1;
    /* Only with avcC or hvcC, whose packets are whole access units, and
     * where the seek back to the start after reading them really seeks. */
    if (k->nal_length_size && total_frames(v) > 1) {
        size_t n_packets = 0;
        struct planned_packet *packets = planned_packets(v, k->nal_length_size, &n_packets);
        if (packets)
            skipper_plan(k, packets, n_packets, through, decode_from);
        av_free(packets);
    }
    v->errors_before_skip = __atomic_load_n(&v->decoder_errors, __ATOMIC_RELAXED);
    k->on = 1;
    return 1;
}

int64_t pw_video_frame_index(const pw_video *v) {
    return v->skip.on ? v->skip.index : v->frame_number - 1;
}

int pw_video_skip_failed(const pw_video *v) {
    return v->skip.on && v->skip.failed;
}


const char *pw_component_name(int kind, size_t index) {
    void *opaque = NULL;
    size_t seen = 0;
    if (kind == PW_DEMUXERS) {
        const AVInputFormat *format;
        while ((format = av_demuxer_iterate(&opaque)))
            if (seen++ == index)
                return format->name;
    } else if (kind == PW_INPUT_PROTOCOLS) {
        const char *name;
        while ((name = avio_enum_protocols(&opaque, 0)))
            if (seen++ == index)
                return name;
    } else if (kind == PW_DECODERS) {
        const AVCodec *codec;
        while ((codec = av_codec_iterate(&opaque)))
            if (av_codec_is_decoder(codec) && seen++ == index)
                return codec->name;
    }
    return NULL;
}
