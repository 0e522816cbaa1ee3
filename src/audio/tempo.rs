//! Pitch-preserving speed change for `speed` 0.25–4.0 (`api.md`), as a stream: WSOLA from the
//! `wsola` crate, whose streamed output is bit-identical to its one-shot output.
//!
//! At the end of the stream the stretcher would drop the input that does not fill a last
//! analysis frame, so [`Tempo::finish`] feeds it silence first and then cuts the output to
//! exactly `round(n / speed)` samples: the duration a client expects from `speed`. Above about
//! 2.8× the stretcher's output can run up to a hop (15 ms) past `n / speed` before the end is
//! known, so output is only released up to `consumed / speed`, which the final length can
//! never be below.

use std::num::{NonZeroU16, NonZeroU32};

use wsola::TimeStretch;

/// A time stretcher that carries its state across pushes.
pub(super) struct Tempo {
    inner: TimeStretch,
    speed: f32,
    /// Scratch output; a multiple of the stretcher's hop, as `pull` requires.
    scratch: Vec<f32>,
    /// Stretched output not yet released.
    held: Vec<f32>,
    consumed: u64,
    /// Samples released so far.
    released: u64,
    /// Silence that lets the last real samples through a whole analysis frame and search.
    tail_pad: usize,
}

impl Tempo {
    /// A stretcher for mono audio at `sample_rate`; `speed` 2.0 halves the duration.
    pub(super) fn new(sample_rate: u32, speed: f32) -> Self {
        let rate = NonZeroU32::new(sample_rate).expect("sample rate is positive");
        let mut inner = TimeStretch::new(rate, NonZeroU16::MIN).expect("wsola construction cannot fail");
        inner.set_tempo(speed);
        let hop = inner.min_output_buff_size();
        // The default configuration's frame is two hops (15 ms each) and its search ±12 ms;
        // four hops plus 50 ms covers both with room to spare.
        let tail_pad = 4 * hop + sample_rate as usize / 20;
        Self { inner, speed, scratch: vec![0.0; 16 * hop], held: Vec::new(), consumed: 0, released: 0, tail_pad }
    }

    /// Takes `pcm` and returns the stretched samples it completes.
    pub(super) fn push(&mut self, pcm: &[f32]) -> Vec<f32> {
        self.consumed += pcm.len() as u64;
        self.inner.push(pcm);
        self.pull();
        // However the stream ends, it has at least this many output samples.
        let sure = (self.consumed as f64 / f64::from(self.speed)).floor() as u64;
        self.release(sure)
    }

    /// Flushes the stretcher; the whole output then has `round(consumed / speed)` samples.
    pub(super) fn finish(mut self) -> Vec<f32> {
        let total = (self.consumed as f64 / f64::from(self.speed)).round() as u64;
        self.inner.push(&vec![0.0; self.tail_pad]);
        self.inner.set_draining();
        self.pull();
        // The padding makes the stretcher overshoot; if it ever fell short, silence fills in.
        let missing = (total - self.released).saturating_sub(self.held.len() as u64);
        self.held.resize(self.held.len() + missing as usize, 0.0);
        self.release(total)
    }

    /// Moves everything the stretcher can make now into `held`.
    fn pull(&mut self) {
        // `pull` fills the scratch as far as the buffered input allows and errs when it has
        // nothing at all; a short fill means the input is used up.
        while let Ok(n) = self.inner.pull(&mut self.scratch) {
            self.held.extend_from_slice(&self.scratch[..n]);
            if n < self.scratch.len() {
                break;
            }
        }
    }

    /// Returns held output up to a total of `limit` released samples.
    fn release(&mut self, limit: u64) -> Vec<f32> {
        let n = (limit.saturating_sub(self.released) as usize).min(self.held.len());
        self.released += n as u64;
        self.held.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 44_100;

    fn sine(freq: f64, n: usize) -> Vec<f32> {
        (0..n).map(|i| (0.5 * (std::f64::consts::TAU * freq * i as f64 / f64::from(RATE)).sin()) as f32).collect()
    }

    fn run(speed: f32, pcm: &[f32], chunks: &[usize]) -> Vec<f32> {
        let mut t = Tempo::new(RATE, speed);
        let mut out = Vec::new();
        let mut rest = pcm;
        for &c in chunks.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let c = c.min(rest.len());
            out.extend(t.push(&rest[..c]));
            rest = &rest[c..];
        }
        out.extend(t.finish());
        out
    }

    /// Zero crossings per second, a pitch estimate for a pure tone.
    fn crossings_per_second(x: &[f32]) -> f64 {
        let n = x.windows(2).filter(|w| (w[0] < 0.0) != (w[1] < 0.0)).count();
        n as f64 * f64::from(RATE) / x.len() as f64
    }

    #[test]
    fn length_is_the_input_over_speed() {
        for speed in [0.25, 0.5, 0.8, 1.5, 2.0, 4.0] {
            for n in [0, 100, 4410, 66_150] {
                let out = run(speed, &sine(300.0, n), &[2048]);
                assert_eq!(out.len(), (n as f64 / f64::from(speed)).round() as usize, "speed {speed} n {n}");
            }
        }
    }

    #[test]
    fn chunking_does_not_change_the_output() {
        let pcm = sine(300.0, 50_000);
        for speed in [0.5, 1.7] {
            let whole = run(speed, &pcm, &[pcm.len()]);
            assert_eq!(run(speed, &pcm, &[2048]), whole);
            assert_eq!(run(speed, &pcm, &[1, 999, 4096, 13]), whole);
        }
    }

    #[test]
    fn pitch_is_kept() {
        let pcm = sine(440.0, 88_200);
        let want = crossings_per_second(&pcm);
        for speed in [0.5, 2.0] {
            let out = run(speed, &pcm, &[2048]);
            // Away from the fade-in at the start and the padded end.
            let mid = &out[out.len() / 8..out.len() * 7 / 8];
            let got = crossings_per_second(mid);
            assert!((got / want - 1.0).abs() < 0.02, "speed {speed}: {got} vs {want} crossings/s");
        }
    }
}
