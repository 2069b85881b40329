//! One read in pieces decoded at once: a video's latency falls with the
//! cores its decoding is given.
//!
//! A decoder's frame threads overlap only neighbouring frames, so one
//! decoder reading a long video from start to end keeps few cores busy.
//! An H.264 or HEVC stream is a series of coded video sequences, each
//! begun by an IDR picture, and nothing decoded after an IDR picture refers
//! to anything decoded before it: a sequence decodes to the same frames
//! on a fresh decoder as at the end of a read from the start. (The
//! skipper already relies on that: a read cuts every sequence holding no
//! sampled frame, and the frames are tested against a read of every frame.)
//! So the sampled frames are grouped by sequence, the groups are split
//! into contiguous pieces of about equal decoding work, and each piece is
//! read on a capture of its own, on a share of the decoder threads one
//! capture would use. Streams that cannot be numbered so (other codecs,
//! Annex B, open GOPs without IDR pictures) are read as one piece.
//!
//! The pieces take the turn of the read they belong to (one decode's
//! worth of cores), stop with it, and are held to its decoding budget.
//! The capture that was opened reads the last piece, so that a frame
//! count it holds provisionally is confirmed by its read to the end as
//! before.

use std::sync::atomic::Ordering;
use std::thread;

use super::{Capture, FrameFormat};
use crate::errors::{Error, Result};
use crate::publisher::cancelled;

/// Which sampled frames each piece reads, in order, and on how many
/// decoder threads.
pub struct Plan {
    pub pieces: Vec<Vec<usize>>,
    threads: Vec<i32>,
}

/// A plan for reading `wanted` in pieces, or None where one piece it is:
/// a decoder of one thread, a stream that cannot be split, or sampled
/// frames all in one sequence. The pieces share the decoder threads one
/// read would use, so that the piece with the most work per thread has
/// as little as can be (`shares`).
pub(super) fn plan(capture: &mut Capture, wanted: &[usize]) -> Option<Plan> {
    let threads = capture.info().threads as usize;
    if threads < 2 || wanted.len() < 2 {
        return None;
    }
    let starts = capture.sequence_starts()?;
    let mut wanted: Vec<usize> = wanted.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let groups = group_by_sequence(&wanted, &starts);
    let pieces = balanced(groups, threads);
    if pieces.len() < 2 {
        return None;
    }
    let works: Vec<usize> = pieces.iter().map(|(_, work)| *work).collect();
    Some(Plan {
        threads: shares(&works, threads)
            .into_iter()
            .map(|t| i32::try_from(t).unwrap_or(1))
            .collect(),
        pieces: pieces.into_iter().map(|(frames, _)| frames).collect(),
    })
}

/// `threads` shared out so that the piece with the most work per thread
/// has as little as can be: each piece one, then each further thread to
/// the piece with the most work per thread so far. (A floor of one each
/// and the rest in proportion over-serves small pieces: the largest one,
/// whose read ends last, was left with a smaller share than its work.)
fn shares(works: &[usize], threads: usize) -> Vec<usize> {
    let mut given = vec![1usize; works.len()];
    for _ in works.len()..threads {
        // works[i] / given[i] largest, compared without division; the
        // first such piece on a tie.
        let most = (0..works.len()).reduce(|best, i| {
            if works[i] * given[best] > works[best] * given[i] {
                i
            } else {
                best
            }
        });
        match most {
            Some(i) => given[i] += 1,
            None => break,
        }
    }
    given
}

/// The sampled frames of each sequence that holds any, with the frames its
/// read decodes: from the sequence's first frame to its last sampled one.
fn group_by_sequence(wanted: &[usize], starts: &[usize]) -> Vec<(Vec<usize>, usize)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &index in wanted {
        let start = starts[starts.partition_point(|&s| s <= index).saturating_sub(1)];
        match groups.last_mut() {
            Some((at, frames)) if *at == start => frames.push(index),
            _ => groups.push((start, vec![index])),
        }
    }
    groups
        .into_iter()
        .map(|(start, frames)| {
            let work = frames.last().map_or(0, |&last| last + 1 - start);
            (frames, work)
        })
        .collect()
}

/// Contiguous runs of `groups` into at most `most` pieces of about equal
/// work, each with its work: a piece closes before a group that would take
/// it further past its share of what is left than it falls short without it.
fn balanced(groups: Vec<(Vec<usize>, usize)>, most: usize) -> Vec<(Vec<usize>, usize)> {
    let mut left: usize = groups.iter().map(|(_, work)| work).sum();
    let mut pieces_left = most.min(groups.len());
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    let mut work = 0;
    for (frames, group_work) in groups {
        if pieces_left > 1 && !piece.is_empty() {
            // Compared in whole multiples of the share (left / pieces_left).
            let over = (work + group_work) * pieces_left;
            let short = work * pieces_left;
            if over.saturating_sub(left) > left.saturating_sub(short) {
                pieces.push((std::mem::take(&mut piece), work));
                left -= work;
                work = 0;
                pieces_left -= 1;
            }
        }
        piece.extend(frames);
        work += group_work;
    }
    if !piece.is_empty() {
        pieces.push((piece, work));
    }
    pieces
}

/// Reads `plan`'s pieces at once into `out`, each on a capture of its own
/// (the opened capture's decoder stays idle: its threads would only crowd
/// the pieces'), the frames packed in index order as one read packs them.
pub(super) fn read(
    capture: &mut Capture,
    plan: &Plan,
    format: FrameFormat<'_>,
    out: &mut [u8],
    stop: &dyn Fn() -> Option<Error>,
) -> Result<Vec<usize>> {
    let all: Vec<usize> = plan.pieces.iter().flatten().copied().collect();
    let need = capture.sampled_bytes(&all, format.resize)?;
    if out.len() < need {
        return Err(Error::InvalidArgument(format!(
            "{} bytes given for {need} bytes of frames",
            out.len()
        )));
    }
    let frame_bytes = capture.frame_bytes(format.resize);
    let last = plan.pieces.len() - 1;
    let flag = capture.stop_flag();
    let mut places: Vec<&mut [u8]> = Vec::with_capacity(plan.pieces.len());
    let mut rest = &mut out[..need];
    for piece in &plan.pieces {
        let (place, tail) = rest.split_at_mut(piece.len() * frame_bytes);
        places.push(place);
        rest = tail;
    }
    // Each piece opens its capture on its own thread: the opens (the
    // container's headers) run at once, as the reads do.
    let shared: &Capture = capture;
    let results: Vec<Result<(Vec<usize>, Capture)>> = thread::scope(|scope| {
        let mut running: Vec<_> = plan
            .threads
            .iter()
            .zip(&plan.pieces)
            .zip(places)
            .enumerate()
            .map(|(at, ((&threads, frames), place))| {
                let flag = flag.clone();
                scope.spawn(move || {
                    let mut piece_capture = shared.open_piece(threads, at == last)?;
                    let stopped = move || {
                        flag.as_ref()
                            .filter(|flag| flag.load(Ordering::Relaxed) != 0)
                            .map(|_| cancelled())
                    };
                    let indices = piece_capture.read_in_turn(frames, format, place, &stopped)?;
                    Ok((indices, piece_capture))
                })
            })
            .collect();
        running
            .drain(..)
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err(Error::Video("a piece of the read panicked".into())))
            })
            .collect()
    });
    // The caller's stop (its request's) sets the flag the pieces stop on;
    // once it gives an error, that is the read's.
    if let Some(error) = stop() {
        return Err(error);
    }
    let mut indices = Vec::with_capacity(all.len());
    let mut packed = 0;
    let mut packets = 0;
    let mut offset = 0;
    let mut finished = Vec::with_capacity(results.len());
    let mut times = Vec::with_capacity(results.len());
    for (result, piece) in results.into_iter().zip(&plan.pieces) {
        let (got, piece_capture) = result?;
        packets += piece_capture.packets_decoded();
        times.extend(piece_capture.piece_times());
        // Frames that did not decode leave gaps: the frames after them
        // move up, as one read would have packed them.
        let at = offset * frame_bytes;
        if at != packed {
            out.copy_within(at..at + got.len() * frame_bytes, packed);
        }
        packed += got.len() * frame_bytes;
        offset += piece.len();
        indices.extend(got);
        finished.push(piece_capture);
    }
    if let Some(last_capture) = finished.last() {
        capture.adopt_pieces(last_capture, packets, times);
    }
    Ok(indices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_grouped_by_the_sequence_that_holds_them() {
        let groups = group_by_sequence(&[0, 10, 30, 55, 60], &[0, 25, 50]);
        let frames: Vec<_> = groups.iter().map(|(f, w)| (f.clone(), *w)).collect();
        assert_eq!(
            frames,
            vec![(vec![0, 10], 11), (vec![30], 6), (vec![55, 60], 11)]
        );
    }

    #[test]
    fn pieces_are_contiguous_and_about_equal() {
        let groups: Vec<_> = (0..8).map(|g| (vec![g * 10], 10)).collect();
        let pieces: Vec<Vec<usize>> = balanced(groups, 3).into_iter().map(|(f, _)| f).collect();
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.concat(), (0..8).map(|g| g * 10).collect::<Vec<_>>());
        assert!(
            pieces.iter().all(|p| (2..=3).contains(&p.len())),
            "{pieces:?}"
        );
        // Never more pieces than groups.
        assert_eq!(balanced(vec![(vec![1], 5)], 4), vec![(vec![1], 5)]);
    }

    #[test]
    fn threads_follow_the_work_and_each_piece_has_one() {
        assert_eq!(shares(&[243, 121, 50, 50], 16), vec![8, 4, 2, 2]);
        // One long sequence among short ones gets the threads its work
        // needs (a box's 1080p read: 214 of 444 frames in one piece).
        assert_eq!(
            shares(&[55, 214, 36, 32, 36, 38, 33], 16),
            vec![2, 6, 2, 1, 2, 2, 1]
        );
        assert_eq!(shares(&[10, 10], 2), vec![1, 1]);
        assert_eq!(shares(&[1, 1, 1], 3), vec![1, 1, 1]);
        let given = shares(&[5, 300, 7], 16);
        assert_eq!(given.iter().sum::<usize>(), 16);
        assert!(given.iter().all(|&t| t >= 1) && given[1] > 10, "{given:?}");
    }
}
