//! A generation's audio: its frames grouped for the streaming codec (the first frame alone for
//! the earliest audio, then groups doubling up to [`MAX_CODEC_GROUP`]), decoded here or, with
//! the audio detached, handed out as codes for the codec thread. A long request's later chunks
//! hold their frames undecoded until the chunk ends, so that a chunk the runaway guard cuts can
//! be dropped and generated again without its audio ever reaching the decoder.

use crate::backend::Backend;
use crate::model::codec::{CodecError, CodecModel, StreamingDecoder};

/// Frames decoded per codec call: the first frame alone for the earliest audio, then groups
/// that double up to [`MAX_CODEC_GROUP`] (fewer calls, same samples: streaming is exact).
pub fn codec_group(groups_emitted: usize) -> usize {
    (1usize << groups_emitted.min(3)).min(MAX_CODEC_GROUP)
}

/// The largest group of frames one codec call decodes for a stream.
pub const MAX_CODEC_GROUP: usize = 8;

/// Frames a stream produces until its codec has decoded a group of [`MAX_CODEC_GROUP`] frames
/// (1 + 2 + 4 + 8): a warm-up that runs this long has run every group size.
pub fn frames_to_largest_group() -> usize {
    group_sizes().iter().sum()
}

/// Every group size a stream's codec decodes, each once, up to the largest (1, 2, 4, 8).
pub fn group_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = (0..).map(codec_group).take_while(|&g| g < MAX_CODEC_GROUP).collect();
    sizes.push(MAX_CODEC_GROUP);
    sizes
}

/// Groups a generation's frames for the streaming codec: the first frame alone, then groups
/// of [`codec_group`] frames. Its decoder is `None` when the audio is detached (the caller
/// decodes the groups).
pub(super) struct AudioOut<'m, B: Backend> {
    decoder: Option<StreamingDecoder<'m, B>>,
    pending: Vec<u32>,
    pending_frames: usize,
    groups: usize,
    /// Frames wait in `pending` (none is due) until [`AudioOut::release`] or [`AudioOut::discard`].
    held: bool,
}

impl<'m, B: Backend> AudioOut<'m, B> {
    pub(super) fn new(codec: &'m CodecModel<B>, backend: &'m B) -> Self {
        AudioOut {
            decoder: Some(StreamingDecoder::new(codec, backend)),
            pending: Vec::new(),
            pending_frames: 0,
            groups: 0,
            held: false,
        }
    }

    /// Hands its groups out as codes from now on (the caller decodes them).
    pub(super) fn detach(&mut self) {
        self.decoder = None;
    }

    /// Whether it decodes its own groups.
    pub(super) fn attached(&self) -> bool {
        self.decoder.is_some()
    }

    /// The pending frames' codes, as one group (detached audio).
    pub(super) fn take_codes(&mut self) -> Vec<u32> {
        if self.pending_frames > 0 {
            self.pending_frames = 0;
            self.groups += 1;
        }
        std::mem::take(&mut self.pending)
    }

    /// Adds one frame's codes.
    pub(super) fn add(&mut self, codes: &[u32]) {
        self.pending.extend_from_slice(codes);
        self.pending_frames += 1;
    }

    /// Whether pending frames should be decoded now: a whole group, or any at the end; never
    /// while held.
    pub(super) fn due(&self, at_end: bool) -> bool {
        !self.held && self.pending_frames > 0 && (at_end || self.pending_frames >= codec_group(self.groups))
    }

    /// Holds the frames added from now on undecoded (a chunk the runaway guard may cut).
    pub(super) fn hold(&mut self) {
        assert!(self.pending_frames == 0, "hold with frames pending");
        self.held = true;
    }

    /// Whether frames are held.
    pub(super) fn holding(&self) -> bool {
        self.held
    }

    /// Lets the held frames go to the codec: they are due at once, as one group (decoded in
    /// pieces of at most [`MAX_CODEC_GROUP`] frames), and the caller flushes them.
    pub(super) fn release(&mut self) {
        self.held = false;
    }

    /// Drops the held frames: the decoder never sees them.
    pub(super) fn discard(&mut self) {
        assert!(self.held, "discard of audio that was not held");
        self.pending.clear();
        self.pending_frames = 0;
        self.held = false;
    }

    /// Decodes the pending frames of each of `outs` (all attached) together (one codec pass over
    /// all of them per [`MAX_CODEC_GROUP`] frames: a released chunk's backlog in pieces the
    /// warm-up ran, with the same samples, since streaming is exact); each gets its own PCM
    /// (empty where nothing was pending) or its own error.
    pub(super) fn decode(outs: &mut [&mut AudioOut<'m, B>]) -> Vec<Result<Vec<f32>, CodecError>> {
        let widths: Vec<usize> =
            outs.iter().map(|o| o.pending.len().checked_div(o.pending_frames).unwrap_or(0)).collect();
        let codes: Vec<Vec<u32>> = outs.iter_mut().map(|o| o.take_codes()).collect();
        let mut decoders: Vec<&mut StreamingDecoder<'m, B>> =
            outs.iter_mut().map(|o| o.decoder.as_mut().expect("decode of attached audio")).collect();
        let mut results: Vec<Result<Vec<f32>, CodecError>> = codes.iter().map(|_| Ok(Vec::new())).collect();
        let mut start = vec![0usize; codes.len()];
        loop {
            // Each stream's next piece; none for a stream whose decode failed.
            let pieces: Vec<&[u32]> = (codes.iter().zip(&widths).zip(&start).zip(&results))
                .map(
                    |(((c, &w), &at), r)| if r.is_ok() { &c[at..(at + w * MAX_CODEC_GROUP).min(c.len())] } else { &[] },
                )
                .collect();
            if pieces.iter().all(|p| p.is_empty()) {
                return results;
            }
            let decoded = StreamingDecoder::push_many(&mut decoders, &pieces);
            for (((result, piece), at), len) in
                results.iter_mut().zip(decoded).zip(&mut start).zip(pieces.iter().map(|p| p.len()))
            {
                *at += len;
                match (result.as_mut(), piece) {
                    (Ok(pcm), Ok(more)) => pcm.extend(more),
                    (Ok(_), Err(e)) => *result = Err(e),
                    (Err(_), _) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_frame_alone_then_doubling_groups() {
        let sizes: Vec<usize> = (0..6).map(codec_group).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 8, 8]);
        assert_eq!((group_sizes(), frames_to_largest_group()), (vec![1, 2, 4, 8], 15));
    }
}
