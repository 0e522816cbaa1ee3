//! The codec on its own thread (and, on the GPU, its own stream): the worker's step hands each
//! stream's due frame groups over as codes ([`Stepped::codes`](crate::engine::generate::Stepped))
//! and goes on to the next step while they are decoded, so the codec never runs in series with
//! the step.
//!
//! Each stream's groups are decoded in the order they were sent, by that stream's own streaming
//! decoder, so its PCM is what the step's own decode gives, bit for bit (`push_many`: a stream's
//! samples never depend on the others decoded beside it). Every round decodes the next group of
//! each stream that has one, oldest stream first, up to the warm-up's stream count, so the
//! round's shapes are ones the warm-up ran. A longer group (a held chunk's frames, released at
//! once) is decoded in pieces of at most [`MAX_CODEC_GROUP`] frames over successive rounds, and
//! answered once, with all its PCM: streaming is exact, so the pieces give the same samples.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use crate::backend::codec::CodecOps;
use crate::engine::audio::{MAX_CODEC_GROUP, group_sizes};
use crate::model::codec::{CodecModel, StreamingDecoder};

/// What the worker sends the codec thread.
#[derive(Debug)]
pub enum CodecCommand {
    /// The next frames of stream `key`, row-major `[n, codes_per_frame]`.
    Decode { key: u64, codes: Vec<u32> },
    /// Stream `key` is over: drop its decoder once its queued groups are decoded.
    End { key: u64 },
}

/// One group's PCM (or why it failed), for stream `key`.
#[derive(Debug)]
pub struct Decoded {
    pub key: u64,
    pub pcm: Result<Vec<f32>, String>,
}

/// The codec thread's ends of its two channels.
pub struct CodecLink {
    pub commands: Receiver<CodecCommand>,
    pub decoded: Sender<Decoded>,
}

/// A codec the worker can run on a thread of its own.
pub trait AudioCodec: Sync {
    /// Runs the codec thread's loop on the calling thread until the worker drops its sender.
    fn run(&self, link: CodecLink);
}

/// Runs on the thread before its first decode (e.g. makes the GPU context current there).
pub type ThreadSetup<'a> = Box<dyn Fn() -> Result<(), String> + Sync + 'a>;

/// [`AudioCodec`] over any backend: `model` decoded on `backend` (on the GPU a handle with its
/// own stream and pool, `Cuda::fork_stream`).
pub struct CodecThread<'m, B: CodecOps> {
    model: &'m CodecModel<B>,
    backend: &'m B,
    /// Streams one round decodes at most: the count [`CodecThread::warm_up`] ran.
    max_streams: usize,
    setup: Option<ThreadSetup<'m>>,
}

impl<'m, B: CodecOps> CodecThread<'m, B> {
    pub fn new(model: &'m CodecModel<B>, backend: &'m B, max_streams: usize) -> Self {
        assert!(max_streams > 0, "a codec thread that decodes no stream");
        CodecThread { model, backend, max_streams, setup: None }
    }

    /// Calls `setup` on the codec thread before it decodes anything.
    pub fn with_thread_setup(mut self, setup: ThreadSetup<'m>) -> Self {
        self.setup = Some(setup);
        self
    }

    /// Decodes the largest rounds serving makes once, on the calling thread: `max_streams`
    /// streams together through every group size (1, 2, 4, 8 frames), so the backend's pool
    /// then holds what any round needs.
    pub fn warm_up(&self) -> Result<(), String> {
        let mut decoders: Vec<StreamingDecoder<'m, B>> =
            (0..self.max_streams).map(|_| StreamingDecoder::new(self.model, self.backend)).collect();
        for group in group_sizes() {
            let codes = vec![0u32; group * self.model.codes_per_frame()];
            let codes: Vec<&[u32]> = (0..decoders.len()).map(|_| codes.as_slice()).collect();
            let mut refs: Vec<&mut StreamingDecoder<'m, B>> = decoders.iter_mut().collect();
            for result in StreamingDecoder::push_many(&mut refs, &codes) {
                result.map_err(|e| format!("codec warm-up: {e}"))?;
            }
        }
        Ok(())
    }
}

impl<B: CodecOps + Sync> AudioCodec for CodecThread<'_, B>
where
    CodecModel<B>: Sync,
{
    fn run(&self, link: CodecLink) {
        if let Some(setup) = &self.setup
            && let Err(why) = setup()
        {
            // Nothing can be decoded: every group fails with the reason, so its job does.
            tracing::error!(reason = %why, "the codec thread could not start");
            while let Ok(command) = link.commands.recv() {
                if let CodecCommand::Decode { key, .. } = command {
                    let _ = link.decoded.send(Decoded { key, pcm: Err(why.clone()) });
                }
            }
            return;
        }
        let piece = MAX_CODEC_GROUP * self.model.codes_per_frame();
        let mut rounds = Rounds { queues: BTreeMap::new(), decoders: HashMap::new(), partial: HashMap::new(), piece };
        loop {
            if rounds.queues.is_empty() {
                match link.commands.recv() {
                    Ok(command) => rounds.queue(command),
                    Err(_) => return, // the worker is gone
                }
            }
            loop {
                match link.commands.try_recv() {
                    Ok(command) => rounds.queue(command),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            for decoded in rounds.decode_round(self) {
                if link.decoded.send(decoded).is_err() {
                    return;
                }
            }
        }
    }
}

/// One queued piece of a group: its codes, and whether it ends the group the worker sent.
struct Piece {
    codes: Vec<u32>,
    last: bool,
}

/// The codec thread's state: queued pieces per stream (keys rise with arrival, so the map's
/// order is oldest first), each stream's decoder, and the PCM of groups decoded in part.
struct Rounds<'m, B: CodecOps> {
    /// `Some(piece)`: codes to decode; `None`: the stream's end.
    queues: BTreeMap<u64, VecDeque<Option<Piece>>>,
    decoders: HashMap<u64, StreamingDecoder<'m, B>>,
    /// A group's PCM so far, while its pieces are decoded (or the first piece's error).
    partial: HashMap<u64, Result<Vec<f32>, String>>,
    /// Codes of [`MAX_CODEC_GROUP`] frames: the largest piece a round decodes per stream.
    piece: usize,
}

impl<'m, B: CodecOps> Rounds<'m, B> {
    fn queue(&mut self, command: CodecCommand) {
        match command {
            CodecCommand::Decode { key, codes } => {
                let queue = self.queues.entry(key).or_default();
                // Groups the step sends fit one piece and move whole; a released chunk is cut.
                if codes.len() <= self.piece {
                    queue.push_back(Some(Piece { codes, last: true }));
                    return;
                }
                let pieces = codes.len().div_ceil(self.piece);
                for (i, part) in codes.chunks(self.piece).enumerate() {
                    queue.push_back(Some(Piece { codes: part.to_vec(), last: i + 1 == pieces }));
                }
            }
            CodecCommand::End { key } => self.queues.entry(key).or_default().push_back(None),
        }
    }

    /// Decodes the next group of each stream that has one (oldest first, at most
    /// `codec.max_streams`), all together; drops the decoders of streams that ended.
    fn decode_round(&mut self, codec: &CodecThread<'m, B>) -> Vec<Decoded> {
        let mut keys: Vec<u64> = Vec::new();
        let mut groups: Vec<Vec<u32>> = Vec::new();
        let mut lasts: Vec<bool> = Vec::new();
        for (&key, queue) in &mut self.queues {
            while let Some(None) = queue.front() {
                queue.pop_front();
                self.decoders.remove(&key);
                self.partial.remove(&key);
            }
            if keys.len() < codec.max_streams
                && let Some(Some(_)) = queue.front()
            {
                let piece = queue.pop_front().flatten().expect("a piece at the front");
                groups.push(piece.codes);
                lasts.push(piece.last);
                keys.push(key);
            }
        }
        self.queues.retain(|_, queue| !queue.is_empty());
        if keys.is_empty() {
            return Vec::new();
        }
        for key in &keys {
            self.decoders.entry(*key).or_insert_with(|| StreamingDecoder::new(codec.model, codec.backend));
        }
        let decoded = catch_unwind(AssertUnwindSafe(|| {
            let mut picked: Vec<(u64, &mut StreamingDecoder<'m, B>)> =
                self.decoders.iter_mut().filter(|(k, _)| keys.contains(k)).map(|(k, d)| (*k, d)).collect();
            // In the round's order (the map's is arbitrary).
            picked.sort_by_key(|(k, _)| keys.iter().position(|x| x == k));
            let mut decoders: Vec<&mut StreamingDecoder<'m, B>> = picked.into_iter().map(|(_, d)| d).collect();
            let codes: Vec<&[u32]> = groups.iter().map(Vec::as_slice).collect();
            StreamingDecoder::push_many(&mut decoders, &codes)
        }));
        let results: Vec<Result<Vec<f32>, String>> = match decoded {
            Ok(results) => results.into_iter().map(|pcm| pcm.map_err(|e| format!("codec: {e}"))).collect(),
            Err(panic) => {
                let message = format!("the codec panicked: {}", crate::backend::panic_message(&*panic));
                keys.iter().map(|_| Err(message.clone())).collect()
            }
        };
        // A group's pieces add up; it is answered with its last piece (an error once, at its end).
        let mut answers = Vec::new();
        for ((key, pcm), last) in keys.into_iter().zip(results).zip(lasts) {
            let so_far = self.partial.remove(&key).unwrap_or(Ok(Vec::new()));
            let joined = match (so_far, pcm) {
                (Ok(mut all), Ok(more)) => {
                    all.extend(more);
                    Ok(all)
                }
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            };
            if last {
                answers.push(Decoded { key, pcm: joined });
            } else {
                self.partial.insert(key, joined);
            }
        }
        answers
    }
}
