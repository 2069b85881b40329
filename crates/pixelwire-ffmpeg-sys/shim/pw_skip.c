/* See pw_skip.h. */
#include "pw_skip.h"

#include <libavutil/mem.h>
#include <string.h>

void skipper_free(struct skipper *k) {
    av_freep(&k->wanted);
    av_freep(&k->seen);
    av_freep(&k->skipped);
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

/* 1 when every slice NAL unit of an H.264 access unit has nal_ref_idc 0
 * (and there is one): nothing decoded later refers to it. */
static int h264_unreferenced(const uint8_t *p, size_t size, int nal_length_size) {
    int slices = 0;
    size_t at = 0;
    while (at < size) {
        size_t len;
        if (nal_length_size) {
            if (size - at < (size_t)nal_length_size)
                return 0;
            len = 0;
            for (int i = 0; i < nal_length_size; i++)
                len = (len << 8) | p[at + i];
            at += (size_t)nal_length_size;
            if (len == 0 || len > size - at)
                return 0;
        } else {
            /* Annex B: the NAL unit starts after 00 00 01 and runs to the next one. */
            while (at + 3 <= size && !(p[at] == 0 && p[at + 1] == 0 && p[at + 2] == 1))
                at++;
            if (at + 3 > size)
                break;
            at += 3;
            size_t end = at;
            while (end + 3 <= size && !(p[end] == 0 && p[end + 1] == 0 && (p[end + 2] == 1 || p[end + 2] == 0)))
                end++;
            if (end + 3 > size)
                end = size;
            len = end - at;
            if (len == 0)
                continue;
        }
        int type = p[at] & 0x1f, ref_idc = (p[at] >> 5) & 3;
        if (type >= 1 && type <= 5) {
            if (ref_idc != 0 || type == 5)
                return 0;
            slices++;
        } else if (type == 20 || type == 21) {
            return 0; /* SVC/MVC extensions: not worth the risk */
        }
        at += len;
    }
    return slices > 0;
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
    enum { MARGIN = 1 };
    size_t next = lower_bound(k->wanted, k->n_wanted, lowest);
    if (next < k->n_wanted && k->wanted[next] <= lowest + MARGIN)
        return 0;
    if (!h264_unreferenced(pkt->data, (size_t)pkt->size, k->nal_length_size))
        return 0;
    if (!insert_sorted(&k->skipped, &k->n_skipped, &k->cap_skipped, pkt->pts)) {
        k->failed = 1;
        return 0;
    }
    av_packet_unref(pkt);
    return 1;
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
