//! Streaming sample-rate conversion from the codec's 44.1 kHz to the rate a response wants
//! (`api.md`: 24 kHz `pcm`, `sample_rate` 8000–48000), with rubato's windowed-sinc resampler.
//!
//! rubato works on fixed input blocks, so this keeps the input that has not yet filled a block
//! and feeds blocks of exactly [`BLOCK`] frames whatever the sizes of the pushes: the output
//! depends only on the samples, never on how they were chunked. It also trims the filter's
//! start-up delay exactly (see [`Resampler::new`]) and, at [`Resampler::finish`], flushes the
//! tail, so output sample `j` lies at input time `j · in_rate / out_rate` and there are exactly
//! `ceil(n · out_rate / in_rate)` of them.
//!
//! Building rubato's filter (its oversampled sinc table) takes about 2 ms, paid by every
//! response before its first audio. So a response's filter goes back to a [`FilterPool`] when
//! it ends, and the next response at the same rates takes it, reset: rubato's `reset` restores
//! its state to a new filter's, so the output is the same bits (tested below).

use std::sync::{Mutex, PoisonError};

use rubato::audioadapter_buffers::direct::{InterleavedSlice, SequentialSlice};
use rubato::{Async, FixedAsync, Indexing, Resampler as _, SincInterpolationParameters};

use super::{AudioError, ResponseFormat};

/// Input frames per rubato call: about 23 ms at 44.1 kHz, small enough not to add latency
/// beyond the codec's own 2048-sample chunks.
const BLOCK: usize = 1024;

/// Half the sinc filter's length in input samples (rubato's default filter has 256 taps).
const HALF_SINC: u64 = 128;

/// Idle filters kept per pair of rates: enough for a full decode batch's responses ending at
/// once; more are dropped.
const IDLE_PER_RATES: usize = 128;
/// Pairs of rates whose filters are kept (`sample_rate` may be any rate from 8000 to 48000; the
/// common few are pooled, and a response at a rarer one builds its own).
const POOLED_RATES: usize = 8;

/// An (input rate, output rate) pair's idle filters.
type IdleFilters = ((u32, u32), Vec<Async<f32>>);

/// Filters of ended responses, by (input rate, output rate), for the next responses to reuse.
pub(super) struct FilterPool {
    /// At most [`POOLED_RATES`] entries: a list is as quick as a map.
    idle: Mutex<Vec<IdleFilters>>,
}

/// The pool every response's resampler uses.
static FILTERS: FilterPool = FilterPool::new();

impl FilterPool {
    pub(super) const fn new() -> FilterPool {
        FilterPool { idle: Mutex::new(Vec::new()) }
    }

    /// An idle filter for these rates, reset to a new one's state; `None` if none is idle.
    fn take(&self, rates: (u32, u32)) -> Option<Async<f32>> {
        // A panic while the lock was held cannot leave the map inconsistent: keep using it.
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut filter = idle.iter_mut().find(|(r, _)| *r == rates)?.1.pop()?;
        filter.reset();
        Some(filter)
    }

    /// Keeps `filter` for the next response at these rates, within the pool's bounds.
    fn give(&self, rates: (u32, u32), filter: Async<f32>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let at = match idle.iter().position(|(r, _)| *r == rates) {
            Some(at) => at,
            None if idle.len() < POOLED_RATES => {
                idle.push((rates, Vec::new()));
                idle.len() - 1
            }
            None => return,
        };
        let kept = &mut idle[at].1;
        if kept.len() < IDLE_PER_RATES {
            kept.push(filter);
        }
    }

    /// Filters idle now, over every pair of rates.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().unwrap().iter().map(|(_, kept)| kept.len()).sum()
    }
}

/// Builds one filter from `in_rate` to `out_rate` into the shared pool, so that even the first
/// response at those rates takes a ready one (the server calls it at start for `pcm`'s rate).
pub(super) fn prepare(in_rate: u32, out_rate: u32) {
    if let Ok(filter) = new_filter(in_rate, out_rate) {
        FILTERS.give((in_rate, out_rate), filter);
    }
}

/// A response's filter: goes back to its pool when the response ends.
struct PooledFilter {
    /// Always `Some` until dropped.
    filter: Option<Async<f32>>,
    rates: (u32, u32),
    pool: &'static FilterPool,
}

impl PooledFilter {
    fn get(&mut self) -> &mut Async<f32> {
        self.filter.as_mut().expect("a pooled filter is held until dropped")
    }
}

impl Drop for PooledFilter {
    fn drop(&mut self) {
        if let Some(filter) = self.filter.take() {
            self.pool.give(self.rates, filter);
        }
    }
}

/// A resampler that carries its state across pushes.
pub(super) struct Resampler {
    inner: PooledFilter,
    in_rate: u64,
    out_rate: u64,
    /// Input waiting for a whole block.
    pending: Vec<f32>,
    /// Scratch output, sized for one block.
    scratch: Vec<f32>,
    /// Leading output frames still to drop: the filter's delay.
    to_trim: usize,
    consumed: u64,
    produced: u64,
}

impl Resampler {
    /// A resampler from `in_rate` to `out_rate`. `format` only names the request in errors.
    ///
    /// rubato's sinc resampler puts output `k` at input time `(k + 1) / r − HALF_SINC`, with
    /// `r = out_rate / in_rate` (read from its initial index, `1 − taps`, and checked by the
    /// phase test below). Its `output_delay()` rounds that down to whole output samples, which
    /// would shift the signal by a fraction of a sample. So this first feeds `z` zeros, chosen
    /// so that `(HALF_SINC + z) · r` is a whole number, and then drops exactly
    /// `(HALF_SINC + z) · r − 1` outputs. `z` is below `in_rate / gcd(in_rate, out_rate)`:
    /// 19 for 24 kHz, 313 for 8 kHz, at most a second of silence for a rate sharing no factor
    /// with 44.1 kHz, which costs a few milliseconds once per response.
    pub(super) fn new(in_rate: u32, out_rate: u32, format: ResponseFormat) -> Result<Self, AudioError> {
        Self::from_pool(in_rate, out_rate, format, &FILTERS)
    }

    /// [`Resampler::new`] with its filter from (and back to) `pool`.
    fn from_pool(
        in_rate: u32,
        out_rate: u32,
        format: ResponseFormat,
        pool: &'static FilterPool,
    ) -> Result<Self, AudioError> {
        let rates = (in_rate, out_rate);
        let filter = match pool.take(rates) {
            Some(filter) => filter,
            None => new_filter(in_rate, out_rate).map_err(|e| AudioError::codec(format, format!("resampler: {e}")))?,
        };
        let scratch = vec![0.0; filter.output_frames_max()];
        let inner = PooledFilter { filter: Some(filter), rates, pool };
        let (in_rate, out_rate) = (u64::from(in_rate), u64::from(out_rate));
        let period = in_rate / gcd(in_rate, out_rate);
        let zeros = (period - HALF_SINC % period) % period;
        let lead = HALF_SINC + zeros;
        let mut r = Self {
            scratch,
            inner,
            in_rate,
            out_rate,
            pending: Vec::with_capacity(BLOCK),
            to_trim: (lead * out_rate / in_rate - 1) as usize,
            consumed: 0,
            produced: 0,
        };
        let primed = r.push(&vec![0.0; zeros as usize]);
        debug_assert!(primed.is_empty(), "the lead is trimmed");
        r.consumed = 0;
        Ok(r)
    }

    /// Takes `pcm` and returns the output samples it completes.
    pub(super) fn push(&mut self, pcm: &[f32]) -> Vec<f32> {
        self.consumed += pcm.len() as u64;
        let mut out = Vec::with_capacity(pcm.len() * self.out_rate as usize / self.in_rate as usize + 1);
        let mut rest = pcm;
        while !rest.is_empty() {
            let take = (BLOCK - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() == BLOCK {
                self.run_block(BLOCK, &mut out);
                self.pending.clear();
            }
        }
        out
    }

    /// Flushes the filter and returns the last samples, so that the whole output has exactly
    /// `ceil(consumed · out_rate / in_rate)` samples.
    pub(super) fn finish(mut self) -> Vec<f32> {
        let total = (self.consumed * self.out_rate).div_ceil(self.in_rate);
        let mut out = Vec::new();
        // The partial block, then silence (partial length 0), until the delayed output has
        // caught up with the end of the input.
        let mut partial = self.pending.len();
        self.pending.resize(BLOCK, 0.0);
        while self.produced < total {
            self.run_block(partial, &mut out);
            partial = 0;
        }
        let excess = (self.produced - total) as usize;
        out.truncate(out.len() - excess);
        out
    }

    /// Runs one rubato call on `self.pending`, of which the first `valid` frames are input and
    /// the rest silence, and appends the output that is past the start-up delay.
    fn run_block(&mut self, valid: usize, out: &mut Vec<f32>) {
        let input = SequentialSlice::new(&self.pending, 1, BLOCK).expect("one channel of BLOCK frames");
        let frames = self.scratch.len();
        let mut output = InterleavedSlice::new_mut(&mut self.scratch, 1, frames).expect("scratch is one channel");
        let indexing = (valid < BLOCK).then(|| Indexing::new().partial_len(valid));
        let (_, written) = self
            .inner
            .get()
            .process_into_buffer(&input, &mut output, indexing.as_ref())
            .expect("buffers are sized from the resampler's own maxima");
        let skip = self.to_trim.min(written);
        self.to_trim -= skip;
        out.extend_from_slice(&self.scratch[skip..written]);
        self.produced += (written - skip) as u64;
    }
}

/// A new filter from `in_rate` to `out_rate`: 256 taps, Blackman-Harris window, automatic cutoff,
/// cubic interpolation of an oversampled table (rubato's documented high-quality default, equal
/// in quality to its FFT resampler; unlike the FFT one, its delay does not grow when
/// gcd(in, out) is small).
fn new_filter(in_rate: u32, out_rate: u32) -> Result<Async<f32>, rubato::ResamplerConstructionError> {
    let params = SincInterpolationParameters::default();
    let ratio = f64::from(out_rate) / f64::from(in_rate);
    Async::<f32>::new_sinc(ratio, 1.0, &params, BLOCK, 1, FixedAsync::Input)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(rate: u32, freq: f64, n: usize) -> Vec<f32> {
        (0..n).map(|i| (0.5 * (std::f64::consts::TAU * freq * i as f64 / f64::from(rate)).sin()) as f32).collect()
    }

    fn run(out_rate: u32, pcm: &[f32], chunks: &[usize]) -> Vec<f32> {
        let mut r = Resampler::new(44_100, out_rate, ResponseFormat::Pcm).unwrap();
        let mut out = Vec::new();
        let mut rest = pcm;
        for &c in chunks.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let c = c.min(rest.len());
            out.extend(r.push(&rest[..c]));
            rest = &rest[c..];
        }
        out.extend(r.finish());
        out
    }

    /// Runs `pcm` through a resampler from `pool`, in 2048-sample pushes; `finish` or abandon it.
    fn run_pooled(pool: &'static FilterPool, out_rate: u32, pcm: &[f32], finish: bool) -> Vec<f32> {
        let mut r = Resampler::from_pool(44_100, out_rate, ResponseFormat::Pcm, pool).unwrap();
        let mut out: Vec<f32> = pcm.chunks(2048).flat_map(|c| r.push(c)).collect();
        if finish {
            out.extend(r.finish());
        }
        out
    }

    #[test]
    fn a_reused_filter_gives_a_new_filters_bits() {
        let pool: &'static FilterPool = Box::leak(Box::new(FilterPool::new()));
        let pcm = sine(44_100, 440.0, 30_000);
        let other = sine(44_100, 3_000.0, 12_345);
        let fresh = run_pooled(pool, 24_000, &pcm, true);
        assert_eq!(pool.idle(), 1, "the ended response's filter went back");
        // Reused after a finished response, then after one abandoned mid-stream.
        assert_eq!(run_pooled(pool, 24_000, &pcm, true), fresh);
        let _ = run_pooled(pool, 24_000, &other, false);
        assert_eq!(pool.idle(), 1, "an abandoned response's filter goes back too");
        assert_eq!(run_pooled(pool, 24_000, &pcm, true), fresh);
        // Another pair of rates has filters of its own.
        let at_16k = run_pooled(pool, 16_000, &pcm, true);
        assert_eq!(pool.idle(), 2);
        assert_eq!(run_pooled(pool, 16_000, &pcm, true), at_16k);
        assert_ne!(at_16k.len(), fresh.len());
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_filters() {
        let pool: &'static FilterPool = Box::leak(Box::new(FilterPool::new()));
        let held: Vec<Resampler> = (0..IDLE_PER_RATES + 3)
            .map(|_| Resampler::from_pool(44_100, 24_000, ResponseFormat::Pcm, pool).unwrap())
            .collect();
        drop(held);
        assert_eq!(pool.idle(), IDLE_PER_RATES);
        for rate in 0..POOLED_RATES as u32 + 2 {
            drop(Resampler::from_pool(44_100, 8_000 + 1_000 * rate, ResponseFormat::Pcm, pool).unwrap());
        }
        let rates = pool.idle.lock().unwrap().len();
        assert_eq!(rates, POOLED_RATES, "rarer rates beyond the bound are not kept");
    }

    #[test]
    fn chunking_does_not_change_the_output() {
        let pcm = sine(44_100, 440.0, 30_000);
        let whole = run(24_000, &pcm, &[pcm.len()]);
        for chunks in [&[2048][..], &[1, 1023, 5000, 17], &[4096, 2048, 6144]] {
            assert_eq!(run(24_000, &pcm, chunks), whole, "chunks {chunks:?}");
        }
    }

    #[test]
    fn output_length_is_exact() {
        for (n, rate) in [(0, 24_000), (1, 24_000), (1000, 16_000), (44_100, 24_000), (30_001, 48_000), (7, 8_000)] {
            let out = run(rate, &sine(44_100, 440.0, n), &[2048]);
            assert_eq!(out.len() as u64, (n as u64 * u64::from(rate)).div_ceil(44_100), "n {n} rate {rate}");
        }
    }

    /// A sine comes out as the same sine at the new rate: same amplitude, same phase (so the
    /// start-up delay was trimmed exactly), and little else.
    #[test]
    fn sine_keeps_amplitude_and_phase() {
        for rate in [8_000, 24_000, 48_000, 22_050, 31_234] {
            let out = run(rate, &sine(44_100, 1000.0, 44_100), &[2048]);
            let want = sine(rate, 1000.0, out.len());
            // Skip the edges, where the filter sees the silence around the clip.
            let edge = rate as usize / 50;
            let err = out[edge..out.len() - edge]
                .iter()
                .zip(&want[edge..])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            // About 5.6e-4 at every rate: the filter's gain at 1 kHz is 0.1 % (0.01 dB) off,
            // while a phase error of even a twentieth of a sample would show up as 6e-3 at 24 kHz.
            assert!(err < 1e-3, "rate {rate}: max error {err}");
        }
    }
}
