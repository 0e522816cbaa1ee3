//! Band-limited resampling of a reference clip to the codec's 44.1 kHz, as the reference encode
//! hook does it (`torchaudio.functional.resample`, its defaults: a Hann-windowed sinc, 6 zero
//! crossings, roll-off 0.99).
//!
//! With `g = gcd(from, to)`, `from = F·g` and `to = T·g`, output `j = b·T + p` is the dot product
//! of input rows `b·F − w .. b·F + F + w` (zeros outside the clip) with phase `p`'s filter, where
//! `w = ⌈6·F / (0.99·min(F, T))⌉`; the clip of `n` samples gives `⌈n·T / F⌉` of them. The filter
//! taps are computed in f64 here (torchaudio computes them in the waveform's f32) and each output
//! is an f64 sum rounded once, so outputs agree with torchaudio's to about 1e-6 relative, not bit
//! for bit: the codes they lead to differ only at near-ties (`model::codec::encode`).

/// Zero crossings of the sinc on each side (`lowpass_filter_width`).
const ZERO_CROSSINGS: f64 = 6.0;
/// The filter's cut-off as a fraction of the lower rate's Nyquist frequency (`rolloff`).
const ROLLOFF: f64 = 0.99;

/// The most phases a resampling filter may have. The filter has one phase per output sample of
/// a block (`T`) and `2·width + F` taps each, so its size follows the rates' ratio in lowest
/// terms, not the rates: every common rate needs at most 441 phases (8, 16 and 32 kHz to
/// 44.1 kHz) and 694 taps (192 kHz), but 44 099 Hz would need 44 100 phases of 44 113 taps,
/// 15.6 GB of f64, an allocation that aborts the process. Rates past these bounds are refused
/// before a filter is built ([`affordable`]).
pub const MAX_FILTER_PHASES: usize = 1024;
/// The most taps each phase's filter may have (see [`MAX_FILTER_PHASES`]); it is also the work
/// per output sample.
pub const MAX_FILTER_TAPS: usize = 1024;

/// The filter resampling `from` Hz to `to` Hz: (phases, taps of each phase), or (1, 1) for equal
/// rates, which need none.
pub fn filter_shape(from: u32, to: u32) -> (usize, usize) {
    if from == to {
        return (1, 1);
    }
    let g = gcd(from, to);
    let (f, t) = ((from / g) as usize, (to / g) as usize);
    (t, 2 * width(f, t) + f)
}

/// Whether resampling `from` Hz to `to` Hz stays within [`MAX_FILTER_PHASES`] and
/// [`MAX_FILTER_TAPS`].
pub fn affordable(from: u32, to: u32) -> bool {
    let (phases, taps) = filter_shape(from, to);
    phases <= MAX_FILTER_PHASES && taps <= MAX_FILTER_TAPS
}

/// `samples` at `from` Hz resampled to `to` Hz (both > 0). Equal rates return the input.
///
/// # Panics
/// If the rates are not [`affordable`] (callers refuse such rates first).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
    assert!(from > 0 && to > 0, "sample rates must be positive");
    if from == to {
        return samples.to_vec();
    }
    assert!(affordable(from, to), "resampling {from} Hz to {to} Hz needs too large a filter");
    let g = gcd(from, to);
    let (f, t) = ((from / g) as usize, (to / g) as usize);
    let (filters, width) = filters(f, t);
    let taps = 2 * width + f;
    let out_len = (samples.len() * t).div_ceil(f);
    let mut out = Vec::with_capacity(out_len);
    let at = |i: isize| -> f64 { usize::try_from(i).ok().and_then(|i| samples.get(i)).map_or(0.0, |&v| f64::from(v)) };
    for j in 0..out_len {
        let (block, phase) = (j / t, j % t);
        let start = (block * f) as isize - width as isize;
        let filter = &filters[phase * taps..(phase + 1) * taps];
        let sum: f64 = filter.iter().enumerate().map(|(k, &c)| c * at(start + k as isize)).sum();
        out.push(sum as f32);
    }
    out
}

/// Each phase's filter (`to` phases of `2·width + from` taps), and `width`.
fn filters(from: usize, to: usize) -> (Vec<f64>, usize) {
    let base = from.min(to) as f64 * ROLLOFF;
    let width = width(from, to);
    let taps = 2 * width + from;
    let scale = base / from as f64;
    let mut out = Vec::with_capacity(to * taps);
    for phase in 0..to {
        for k in 0..taps {
            let idx = (k as f64 - width as f64) / from as f64;
            let x = ((-(phase as f64) / to as f64 + idx) * base).clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS);
            let window = (x * std::f64::consts::PI / ZERO_CROSSINGS / 2.0).cos().powi(2);
            let arg = x * std::f64::consts::PI;
            let sinc = if arg == 0.0 { 1.0 } else { arg.sin() / arg };
            out.push(sinc * window * scale);
        }
    }
    (out, width)
}

/// Input samples the filter reaches past a block on each side (`width` above).
fn width(from: usize, to: usize) -> usize {
    (ZERO_CROSSINGS * from as f64 / (from.min(to) as f64 * ROLLOFF)).ceil() as usize
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every common rate is affordable; a rate with no short ratio to 44.1 kHz is not (it once
    /// made a 644-byte upload allocate 974 MB, found by fuzzing: `fuzz/seeds/voice_clip/wav-44108-hz`).
    #[test]
    fn filter_sizes_follow_the_ratio_and_are_bounded() {
        for rate in [8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000, 88_200, 96_000, 192_000] {
            assert!(affordable(rate, 44_100), "{rate} Hz");
        }
        assert_eq!(filter_shape(48_000, 44_100), (147, 174));
        assert_eq!(filter_shape(192_000, 44_100), (147, 694));
        assert_eq!(filter_shape(44_108, 44_100), (11_025, 11_041));
        assert_eq!(filter_shape(44_099, 44_100), (44_100, 44_113));
        assert!(!affordable(44_108, 44_100) && !affordable(44_099, 44_100));
        assert_eq!(filter_shape(44_100, 44_100), (1, 1));
    }

    #[test]
    fn lengths_follow_the_rate_ratio_rounded_up() {
        let x = vec![0.25f32; 1000];
        assert_eq!(resample(&x, 16_000, 44_100).len(), 2757); // ⌈1000 · 441 / 160⌉
        assert_eq!(resample(&x, 48_000, 44_100).len(), 919); // ⌈1000 · 147 / 160⌉
        assert_eq!(resample(&x, 44_100, 44_100), x);
    }

    /// A low tone well inside both bands comes through with its amplitude (away from the edges).
    #[test]
    fn a_tone_in_band_keeps_its_amplitude() {
        let (from, to, hz) = (24_000.0f64, 44_100.0f64, 440.0f64);
        let x: Vec<f32> =
            (0..24_000).map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / from).sin() as f32).collect();
        let y = resample(&x, 24_000, 44_100);
        for (j, &v) in y.iter().enumerate().skip(1000).take(40_000) {
            let want = (2.0 * std::f64::consts::PI * hz * j as f64 / to).sin();
            assert!((f64::from(v) - want).abs() < 2e-3, "sample {j}: {v} against {want}");
        }
    }
}
