//! Voice cloning's input side: a reference clip becomes the codec encoder's input (mono, the
//! codec's 44.1 kHz) as the reference encode hook prepares it (`codec.md` §5.3).

pub mod clip;
pub mod flac_metadata;
pub mod isolated;
pub mod resample;
pub mod store;

/// A clip of one or more channels (`channels[c]` all of one length) mixed down to mono: the mean
/// of the channels per sample, summed in channel order in f32 as `audio.mean(0)` does.
pub fn mono(channels: &[Vec<f32>]) -> Vec<f32> {
    let Some(first) = channels.first() else { return Vec::new() };
    if channels.len() == 1 {
        return first.clone();
    }
    let n = channels.len() as f32;
    (0..first.len()).map(|i| channels.iter().map(|c| c[i]).sum::<f32>() / n).collect()
}
