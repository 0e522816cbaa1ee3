//! The worker's end of the codec thread (`scheduler::codec`): jobs' frame groups go out as
//! codes, their PCM comes back into the jobs' outboxes.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::IDLE_POLL;
use super::active::Active;
use crate::scheduler::Synthesizer;
use crate::scheduler::codec::{CodecCommand, Decoded};

/// The worker's ends of the codec thread's channels.
pub(super) struct CodecLane {
    pub(super) commands: Sender<CodecCommand>,
    pub(super) decoded: Receiver<Decoded>,
}

impl CodecLane {
    /// Sends `job`'s next frame group to be decoded.
    pub(super) fn send(&self, job: &mut Active, codes: Vec<u32>) {
        // A send fails only once the codec thread is gone, which `collect` reports.
        if self.commands.send(CodecCommand::Decode { key: job.audio_key, codes }).is_ok() {
            job.codec_pending += 1;
            job.awaiting_first_audio = !job.codec_used;
            job.codec_used = true;
        }
    }

    /// `job` is leaving: the codec thread drops its decoder once its groups are decoded.
    pub(super) fn end(&self, job: &Active) {
        if job.codec_used {
            let _ = self.commands.send(CodecCommand::End { key: job.audio_key });
        }
    }

    /// Takes the PCM the codec thread has decoded into its jobs' outboxes. Waits for the first
    /// group of a stream (its first audio goes out before the next step, as with the codec in
    /// the step), and, when `idle` (no stream could step), up to [`IDLE_POLL`] for any.
    /// `Err`: the codec thread is gone.
    pub(super) fn collect(
        &self,
        model: &dyn Synthesizer,
        batch: &mut [Active],
        failed: &mut bool,
        idle: bool,
    ) -> Result<(), String> {
        let gone = || String::from("the codec thread stopped");
        let mut idle_wait = idle && batch.iter().any(|job| job.codec_pending > 0);
        loop {
            let decoded = if batch.iter().any(|job| job.awaiting_first_audio) {
                // The codec thread answers every group it is sent, so this returns.
                self.decoded.recv().map_err(|_| gone())?
            } else if std::mem::take(&mut idle_wait) {
                match self.decoded.recv_timeout(IDLE_POLL) {
                    Ok(decoded) => decoded,
                    Err(RecvTimeoutError::Timeout) => return Ok(()),
                    Err(RecvTimeoutError::Disconnected) => return Err(gone()),
                }
            } else {
                match self.decoded.try_recv() {
                    Ok(decoded) => decoded,
                    Err(TryRecvError::Empty) => return Ok(()),
                    Err(TryRecvError::Disconnected) => return Err(gone()),
                }
            };
            // A job that already left has nothing to take it.
            if let Some(job) = batch.iter_mut().find(|job| job.audio_key == decoded.key) {
                *failed |= job.decoded(model, decoded.pcm);
            }
        }
    }
}
