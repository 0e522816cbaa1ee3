//! Whole-file WAV (RIFF, 16-bit PCM, mono) for `limelight say`; the streamed WAV of the server
//! writes its header by hand and lives with the other streaming encoders.

use std::io;
use std::path::Path;

use super::f32_to_i16;

/// Writes `pcm` as a 16-bit mono WAV at `sample_rate`.
pub fn write_wav(path: &Path, pcm: &[f32], sample_rate: u32) -> io::Result<()> {
    let spec =
        hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(path, spec).map_err(io::Error::other)?;
    for &x in pcm {
        w.write_sample(f32_to_i16(x)).map_err(io::Error::other)?;
    }
    w.finalize().map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_hound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        let pcm: Vec<f32> = (0..2048).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
        write_wav(&path, &pcm, 44_100).unwrap();
        let mut r = hound::WavReader::open(&path).unwrap();
        assert_eq!(r.spec().sample_rate, 44_100);
        assert_eq!(r.spec().channels, 1);
        let back: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(back, pcm.iter().map(|&x| f32_to_i16(x)).collect::<Vec<_>>());
    }
}
