/* The skipper of pw_video.c: which H.264 packets need not be decoded, and
 * OpenCV's number of each frame the decoder outputs when some are not. */
#ifndef PW_SKIP_H
#define PW_SKIP_H

#include <libavcodec/avcodec.h>
#include <stddef.h>
#include <stdint.h>

/* Skipping H.264 and HEVC frames that no sampled frame needs
 * (pw_video_skip_unwanted): the packets skipper_plan cuts, and frames
 * nothing refers to. An H.264 packet whose slices all have nal_ref_idc 0,
 * or an HEVC packet of sub-layer non-reference pictures of the highest
 * sub-layer, is never referenced, so when its frame is not sampled it is
 * not sent to the decoder. OpenCV numbers a frame by how many the decoder
 * output before it, which, the decoder output being in presentation
 * order, is its rank among the timestamps of every packet; the skipper
 * keeps those timestamps and checks that rank against what was really
 * output and skipped, and gives up (`failed`) wherever the two could
 * differ, so that the caller reads again without skipping. */
struct skipper {
    int on;
    int failed;
    enum AVCodecID codec; /* AV_CODEC_ID_H264 or AV_CODEC_ID_HEVC */
    int nal_length_size; /* avcC's or hvcC's length prefix size; 0: Annex B start codes */
    int highest_tid;     /* HEVC: the highest TemporalId hvcC declares */
    int irap_seen;       /* HEVC: an IRAP picture has been sent */
    int64_t *wanted;     /* sorted */
    size_t n_wanted;
    int64_t *seen;       /* pts of every packet since skipping began, sorted */
    size_t n_seen, cap_seen;
    int64_t *skipped;    /* pts of the packets not sent, sorted */
    size_t n_skipped, cap_skipped;
    size_t n_checked;    /* skipped[..n_checked] are known not to be sampled */
    int64_t *cut;        /* pts of the packets skipper_plan cuts, sorted */
    size_t n_cut;
    int64_t outputs;     /* frames output since skipping began */
    int64_t last_pts;    /* of the last frame output */
    int64_t index;       /* OpenCV's number of the last frame output */
};

void skipper_free(struct skipper *k);
/* A packet of the video stream, in decoding order, for skipper_plan. */
struct planned_packet {
    int64_t pts;
    int idr;     /* an access unit whose slices are all IDR */
    int discard; /* AV_PKT_FLAG_DISCARD: decoded, never output */
};
/* Reference frames that nothing sampled depends on, planned from every
 * packet of the stream (`p`, `n`, in decoding order) before the read: no
 * picture decoded after an IDR access unit refers to one decoded before
 * it, so the packets of a coded video sequence (an IDR access unit up to
 * the next) that come after the last one whose frame is needed, and all
 * those of a sequence with no needed frame, are cut. A frame is needed
 * when its number (its timestamp's rank, every packet giving a frame) is
 * wanted, is `through` (the last the read grabs) or is at least
 * `decode_from`. No plan where a timestamp is missing or repeated, or a
 * sequence holds a packet that is decoded and never output. What the
 * numbers assume is checked as for the frames nothing refers to. */
void skipper_plan(struct skipper *k, const struct planned_packet *p, size_t n, int64_t through,
                  int64_t decode_from);
/* The numbers of the frames that begin each coded video sequence (an IDR
 * access unit up to the next), from every packet of the stream (`p`, `n`,
 * in decoding order): up to `cap` of them in `starts`, increasing, the
 * first 0. Returns how many there are, or -1 where frames cannot be
 * numbered so (a timestamp missing or repeated, a packet decoded and never
 * output, sequences whose frames are not shown one after the other, a
 * stream that does not begin with an IDR access unit). Decoding may start
 * afresh at each: nothing decoded after an IDR access unit refers to
 * anything decoded before it. */
int64_t sequence_starts(const struct planned_packet *p, size_t n, int64_t *starts, size_t cap);
/* For hvcC's parameter sets: 1 when an HEVC PPS NAL unit lets a slice
 * withhold its picture from output, 0 when not, -1 when unreadable. */
int pw_hevc_pps_output_flag_present(const uint8_t *nal, size_t len);
/* Called with each packet of the video stream before it is sent: 1 when it
 * is not to be decoded (the caller drops it; the packet is unreferenced). */
int skip_packet(struct skipper *k, AVPacket *pkt);
/* After each grab, with the frame output (NULL when none) and whether the
 * stream has ended: sets `index`, or `failed`. */
void skip_after_grab(struct skipper *k, const AVFrame *frame, int finished);
/* 1 when every slice of an H.264 or HEVC access unit belongs to an IDR
 * picture (and there is one), 0 otherwise or when it is malformed. */
int pw_access_unit_is_idr(enum AVCodecID codec, int nal_length_size, const uint8_t *p, size_t size);
/* 1 when a VP9 packet's first frame (a superframe's too) is a key frame
 * that is shown, with the key frame's sync code; 0 otherwise. */
int pw_vp9_shown_key_frame(const uint8_t *p, size_t size);

#endif
