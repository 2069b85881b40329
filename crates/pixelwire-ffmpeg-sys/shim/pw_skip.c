/* See pw_skip.h. */
#include "pw_skip.h"

#include <libavutil/mem.h>
#include <string.h>

void skipper_free(struct skipper *k) {
    av_freep(&k->wanted);
    av_freep(&k->seen);
    av_freep(&k->skipped);
    av_freep(&k->cut);
    memset(k, 0, sizeof *k);
}

static size_t lower_bound(const int64_t *a, size_t n, int64_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int is_wanted(const struct skipper *k, int64_t index) {
    size_t at = lower_bound(k->wanted, k->n_wanted, index);
    return at < k->n_wanted && k->wanted[at] == index;
}

static int is_cut(const struct skipper *k, int64_t pts) {
    size_t at = lower_bound(k->cut, k->n_cut, pts);
    return at < k->n_cut && k->cut[at] == pts;
}

static int compare_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The timestamps of the packets that give a frame, sorted: a frame's
 * number is its timestamp's rank. NULL where a timestamp is missing or
 * repeated (or out of memory). */
static int64_t *display_ranks(const struct planned_packet *p, size_t n, size_t *n_ranks) {
    int64_t *ranks = av_malloc_array(n ? n : 1, sizeof *ranks);
    *n_ranks = 0;
    int ok = ranks != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        if (p[i].pts == AV_NOPTS_VALUE)
            ok = 0;
        else if (!p[i].discard)
            ranks[(*n_ranks)++] = p[i].pts;
    }
    if (ok)
        qsort(ranks, *n_ranks, sizeof *ranks, compare_int64);
    for (size_t i = 1; ok && i < *n_ranks; i++)
        ok = ranks[i - 1] != ranks[i];
    if (!ok)
        av_freep(&ranks);
    return ranks;
}

int64_t sequence_starts(const struct planned_packet *p, size_t n, int64_t *starts, size_t cap) {
    size_t n_ranks = 0;
    int64_t *ranks = display_ranks(p, n, &n_ranks);
    if (!ranks)
        return -1;
    int64_t count = 0;
    for (size_t i = 0; i < n && count >= 0; i++) {
        if (p[i].discard) {
            count = -1; /* a packet decoded and never output: numbers need every packet */
        } else if (p[i].idr) {
            int64_t number = (int64_t)lower_bound(ranks, n_ranks, p[i].pts);
            if ((size_t)count < cap) {
                /* Each sequence shows its frames after the one before's. */
                if (count > 0 && starts[count - 1] >= number)
                    count = -1;
                else
                    starts[count++] = number;
            } else {
                count++;
            }
        }
    }
    av_free(ranks);
    if (count == 0 || (cap > 0 && starts[0] != 0))
        return -1; /* the stream does not start with an IDR access unit */
    return count;
}

void skipper_plan(struct skipper *k, const struct planned_packet *p, size_t n, int64_t through,
                  int64_t decode_from) {
    av_freep(&k->cut);
    k->n_cut = 0;
    size_t n_ranks = 0, n_cut = 0;
    int64_t *ranks = display_ranks(p, n, &n_ranks);
    int64_t *cut = av_malloc_array(n ? n : 1, sizeof *cut);
    int ok = ranks && cut;
    /* Each coded video sequence [start, end): the packets after its last
     * needed one are cut, unless one of them is decoded and never output
     * (its number is not its rank). */
    for (size_t start = 0, end; ok && start < n; start = end) {
        int discard = p[start].discard;
        for (end = start + 1; end < n && !p[end].idr; end++)
            discard |= p[end].discard;
        if (discard)
            continue;
        size_t keep = start; /* packets [start, keep) are decoded */
        for (size_t i = start; i < end; i++) {
            int64_t number = (int64_t)lower_bound(ranks, n_ranks, p[i].pts);
            if (number == through || number >= decode_from || is_wanted(k, number))
                keep = i + 1;
        }
        for (size_t i = keep; i < end; i++)
            cut[n_cut++] = p[i].pts;
    }
    av_free(ranks);
    if (!ok || n_cut == 0) {
        av_free(cut);
        return;
    }
    qsort(cut, n_cut, sizeof *cut, compare_int64);
    k->cut = cut;
    k->n_cut = n_cut;
}

/* Inserts into a sorted array; timestamps come nearly in order, so the
 * place is searched from the end. 0 when out of memory. */
static int insert_sorted(int64_t **a, size_t *n, size_t *cap, int64_t x) {
    if (*n == *cap) {
        size_t grown = *cap ? *cap * 2 : 256;
        int64_t *bigger = av_realloc_array(*a, grown, sizeof **a);
        if (!bigger)
            return 0;
        *a = bigger;
        *cap = grown;
    }
    size_t at = *n;
    while (at > 0 && (*a)[at - 1] > x)
        at--;
    memmove(*a + at + 1, *a + at, (*n - at) * sizeof **a);
    (*a)[at] = x;
    (*n)++;
    return 1;
}

/* The NAL units of an access unit, one at a time: length-prefixed
 * (`nal_length_size` bytes, from avcC or hvcC) or Annex B start codes.
 * Returns 1 with the unit in [*nal, *nal + *len), 0 at the end, -1 when
 * the packet is malformed. */
static int next_nal(const uint8_t *p, size_t size, int nal_length_size, size_t *at,
                    const uint8_t **nal, size_t *len) {
    for (;;) {
        if (*at >= size)
            return 0;
        if (nal_length_size) {
            if (size - *at < (size_t)nal_length_size)
                return -1;
            size_t n = 0;
            for (int i = 0; i < nal_length_size; i++)
                n = (n << 8) | p[*at + i];
            *at += (size_t)nal_length_size;
            if (n == 0 || n > size - *at)
                return -1;
            *nal = p + *at;
            *len = n;
            *at += n;
            return 1;
        }
        /* Annex B: the NAL unit starts after 00 00 01 and runs to the next one. */
        size_t i = *at;
        while (i + 3 <= size && !(p[i] == 0 && p[i + 1] == 0 && p[i + 2] == 1))
            i++;
        if (i + 3 > size) {
            *at = size;
            return 0;
        }
        i += 3;
        size_t end = i;
        while (end + 3 <= size && !(p[end] == 0 && p[end + 1] == 0 && (p[end + 2] == 1 || p[end + 2] == 0)))
            end++;
        if (end + 3 > size)
            end = size;
        *at = end;
        if (end > i) {
            *nal = p + i;
            *len = end - i;
            return 1;
        }
    }
}

/* 1 when every slice NAL unit of an H.264 access unit has nal_ref_idc 0
 * (and there is one): nothing decoded later refers to it. A unit that
 * changes the decoder's state beyond its own picture (a parameter set, an
 * end of sequence or stream) keeps the packet, as do SVC/MVC units. */
static int h264_unreferenced(const uint8_t *p, size_t size, int nal_length_size) {
    int slices = 0, more;
    size_t at = 0, len;
    const uint8_t *nal;
    while ((more = next_nal(p, size, nal_length_size, &at, &nal, &len)) > 0) {
        int type = nal[0] & 0x1f, ref_idc = (nal[0] >> 5) & 3;
        if (type >= 1 && type <= 5) {
            if (ref_idc != 0 || type == 5)
                return 0;
            slices++;
        } else if (type == 7 || type == 8 || type == 10 || type == 11 || type == 13 || type == 14 ||
                   type == 15 || type == 20 || type == 21) {
            return 0;
        }
    }
    return more == 0 && slices > 0;
}

/* Whether an HEVC picture parameter set lets slices say pic_output_flag
 * (output_flag_present_flag): 1 when it does, 0 when not, -1 when it cannot
 * be read. Its RBSP starts pps_pic_parameter_set_id and
 * pps_seq_parameter_set_id (ue(v)), dependent_slice_segments_enabled_flag,
 * output_flag_present_flag; emulation prevention bytes are dropped. */
int pw_hevc_pps_output_flag_present(const uint8_t *nal, size_t len) {
    uint8_t rbsp[16];
    size_t n = 0, zeros = 0;
    for (size_t i = 2; i < len && n < sizeof rbsp; i++) {
        if (zeros >= 2 && nal[i] == 3) {
            zeros = 0;
            continue;
        }
        zeros = nal[i] == 0 ? zeros + 1 : 0;
        rbsp[n++] = nal[i];
    }
    size_t bit = 0, bits = n * 8;
#define PW_BIT() (bit < bits ? (rbsp[bit / 8] >> (7 - bit % 8)) & 1 : -1)
    for (int field = 0; field < 2; field++) { /* two ue(v) */
        int leading = 0, b;
        while ((b = PW_BIT()) == 0) {
            bit++;
            if (++leading > 31)
                return -1;
        }
        if (b < 0)
            return -1;
        bit += 1 + (size_t)leading;
    }
    bit++; /* dependent_slice_segments_enabled_flag */
    int flag = PW_BIT();
#undef PW_BIT
    return flag;
}

/* For an HEVC access unit: 1 when every VCL NAL unit is a sub-layer
 * non-reference picture that the decoder outputs (TRAIL_N, TSA_N, STSA_N,
 * RADL_N; not RASL_N, which a decoder drops after a CRA it starts at, nor
 * reserved types, which it ignores) of the highest sub-layer the stream
 * declares, so no picture of its own or a higher sub-layer (the only ones
 * that may refer to it) exists; 0 when it is kept; -1 when the stream
 * breaks what skipping relies on (a unit above the declared highest
 * sub-layer or of another layer, or a picture parameter set that lets a
 * picture go unoutput), so the skipper gives up. Parameter sets and end of
 * sequence or bitstream keep the packet. `irap` is set when the access unit
 * is an IRAP picture. */
static int hevc_unreferenced(const uint8_t *p, size_t size, int nal_length_size, int highest_tid, int *irap) {
    int slices = 0, referenced = 0, more;
    size_t at = 0, len;
    const uint8_t *nal;
    while ((more = next_nal(p, size, nal_length_size, &at, &nal, &len)) > 0) {
        if (len < 2)
            return 0;
        int type = (nal[0] >> 1) & 0x3f;
        int layer = ((nal[0] & 1) << 5) | (nal[1] >> 3);
        int tid = (nal[1] & 7) - 1;
        if (layer != 0 || tid < 0 || tid > highest_tid)
            return -1;
        if (type <= 31) {
            if (type >= 16 && type <= 23)
                *irap = 1;
            if (!(type == 0 || type == 2 || type == 4 || type == 6) || tid != highest_tid)
                referenced = 1;
            slices++;
        } else if (type >= 32 && type <= 37) {
            if (type == 34 && pw_hevc_pps_output_flag_present(nal, len) != 0)
                return -1;
            referenced = 1; /* VPS, SPS, PPS, AUD, EOS, EOB */
        }
    }
    return more == 0 && slices > 0 && !referenced;
}

/* Notes a packet not sent as skipped and unreferences it: 1, or 0 (not
 * skipped, the skipper failed) when out of memory. */
static int drop(struct skipper *k, AVPacket *pkt) {
    if (!insert_sorted(&k->skipped, &k->n_skipped, &k->cap_skipped, pkt->pts)) {
        k->failed = 1;
        return 0;
    }
    av_packet_unref(pkt);
    return 1;
}

/* Called with each packet of the video stream before it is sent: 1 when it
 * is not to be decoded (the caller drops it). */
int skip_packet(struct skipper *k, AVPacket *pkt) {
    if (k->failed)
        return 0;
    if (pkt->flags & AV_PKT_FLAG_DISCARD)
        return 0; /* decoded, never output (an edit list's lead-in): not counted */
    if (pkt->pts == AV_NOPTS_VALUE || (k->outputs > 0 && pkt->pts <= k->last_pts)) {
        k->failed = 1;
        return 0;
    }
    /* Its number is at least the count of earlier timestamps seen so far.
     * A packet still to come with an earlier one would raise it (none does
     * for x264's non-reference B-frames; the margin allows one), and
     * check_skipped_below catches a rise onto a sampled number. */
    int64_t lowest = (int64_t)lower_bound(k->seen, k->n_seen, pkt->pts);
    if (!insert_sorted(&k->seen, &k->n_seen, &k->cap_seen, pkt->pts)) {
        k->failed = 1;
        return 0;
    }
    /* Every HEVC packet is looked at, sampled or not: one above the highest
     * sub-layer declared could refer to a picture skipped before it. */
    int unreferenced = -2; /* not looked at yet */
    if (k->codec == AV_CODEC_ID_HEVC) {
        int irap = 0;
        unreferenced = hevc_unreferenced(pkt->data, (size_t)pkt->size, k->nal_length_size, k->highest_tid, &irap);
        if (unreferenced < 0) {
            k->failed = 1;
            return 0;
        }
        /* Before the first IRAP picture the decoder may be recovering (a
         * recovery point SEI), when it takes a missing reference quietly:
         * nothing is skipped there. After it, a picture that refers to a
         * skipped one fails to decode, and the skipper sees it. */
        k->irap_seen |= irap;
        if (!k->irap_seen)
            unreferenced = 0;
    }
    /* Nothing decoded from now on refers to a cut packet, and its number
     * (its rank among every packet's timestamp) is not wanted. */
    if (is_cut(k, pkt->pts))
        return drop(k, pkt);
    enum { MARGIN = 1 };
    size_t next = lower_bound(k->wanted, k->n_wanted, lowest);
    if (next < k->n_wanted && k->wanted[next] <= lowest + MARGIN)
        return 0;
    if (unreferenced == -2)
        unreferenced = h264_unreferenced(pkt->data, (size_t)pkt->size, k->nal_length_size);
    if (!unreferenced)
        return 0;
    return drop(k, pkt);
}

/* Skipped frames whose timestamp is below `pts` now have their final
 * number (every earlier timestamp has been seen): none may be sampled. */
static void check_skipped_below(struct skipper *k, int64_t pts) {
    while (k->n_checked < k->n_skipped && k->skipped[k->n_checked] < pts) {
        int64_t number = (int64_t)lower_bound(k->seen, k->n_seen, k->skipped[k->n_checked]);
        if (is_wanted(k, number))
            k->failed = 1;
        k->n_checked++;
    }
}

/* After each grab: the number of the frame output, checked against what
 * was output and skipped before it. */
void skip_after_grab(struct skipper *k, const AVFrame *frame, int finished) {
    if (k->failed)
        return;
    if (!frame) {
        if (finished)
            check_skipped_below(k, INT64_MAX);
        else
            k->failed = 1; /* a frame that did not decode: OpenCV's count is not ours */
        return;
    }
    int64_t pts = frame->pts;
    if (pts == AV_NOPTS_VALUE || (k->outputs > 0 && pts <= k->last_pts)) {
        k->failed = 1;
        return;
    }
    int64_t number = (int64_t)lower_bound(k->seen, k->n_seen, pts);
    size_t skipped_before = lower_bound(k->skipped, k->n_skipped, pts);
    if (number != k->outputs + (int64_t)skipped_before) {
        k->failed = 1; /* a frame before it is missing or still in the decoder */
        return;
    }
    check_skipped_below(k, pts);
    k->index = number;
    k->outputs++;
    k->last_pts = pts;
}

int pw_access_unit_is_idr(enum AVCodecID codec, int nal_length_size, const uint8_t *p, size_t size) {
    int idr = 0, more;
    size_t at = 0, len;
    const uint8_t *nal;
    while ((more = next_nal(p, size, nal_length_size, &at, &nal, &len)) > 0) {
        if (codec == AV_CODEC_ID_H264) {
            int type = nal[0] & 0x1f;
            if (type >= 1 && type <= 4)
                return 0;
            idr |= type == 5;
        } else {
            int type = (nal[0] >> 1) & 0x3f;
            if (type <= 31 && type != 19 && type != 20)
                return 0;
            idr |= type == 19 || type == 20;
        }
    }
    return more == 0 && idr;
}

int pw_vp9_shown_key_frame(const uint8_t *p, size_t size) {
    /* uncompressed_header(): frame_marker f(2), profile_low_bit,
     * profile_high_bit, reserved_zero when the profile is 3,
     * show_existing_frame, frame_type (0: KEY_FRAME), show_frame,
     * error_resilient_mode, then a key frame's sync code 0x49 0x83 0x42. */
    if (size < 5 || (p[0] >> 6) != 2)
        return 0;
    int profile = ((p[0] >> 5) & 1) | (((p[0] >> 4) & 1) << 1);
    int at = 4; /* bits read so far */
    if (profile == 3 && ((p[0] >> 3) & 1))
        return 0;
    at += profile == 3;
    int show_existing = (p[0] >> (7 - at)) & 1;
    int key = !((p[0] >> (6 - at)) & 1);
    int shown = (p[0] >> (5 - at)) & 1;
    if (show_existing || !key || !shown)
        return 0;
    at += 4; /* past error_resilient_mode: 8 bits, or 9 for profile 3 */
    uint32_t bits = ((uint32_t)p[1] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 8) | p[4];
    uint32_t sync = (bits << (at - 8)) >> 8;
    return sync == 0x498342;
}
