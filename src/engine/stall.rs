//! The stall guard of a long request's chunks (issue 15): a chunk whose audio stands still —
//! near-silence, or one sound held — for longer than a bound is cut there, instead of running
//! on to its frame bound.
//!
//! Stillness is judged from the frames' semantic codes (`c0`), not from the PCM: a later chunk's
//! audio is held undecoded while it runs (its retry must be the take that is heard), so there is
//! no PCM to measure until it ends. The semantic codebook follows the phonetic content: speech
//! changes it with every sound, about 14 characters a second, so a window of frames drawing on a
//! handful of semantic codes is audio that does not change. A pause the model means (a comma,
//! `[pause]`) lasts well under the window.

use crate::model::frame::Rows;

/// When a chunk counts as stalled: its last `window` frames hold at most `max_codes` distinct
/// semantic codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StallGuard {
    pub window: usize,
    pub max_codes: usize,
}

impl StallGuard {
    /// Whether the last `window` rows of `produced` (frames `[main, c0..c9]`) stand still. A
    /// chunk shorter than the window never does.
    pub fn stalled(&self, produced: &Rows) -> bool {
        let n = produced.len();
        if self.window == 0 || n < self.window {
            return false;
        }
        let mut seen: Vec<u32> = Vec::with_capacity(self.max_codes + 1);
        for t in n - self.window..n {
            let code = produced.code(t, 0);
            if !seen.contains(&code) {
                if seen.len() == self.max_codes {
                    return false;
                }
                seen.push(code);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames whose semantic codes are `codes` (the other codebooks vary, as a noise floor's do).
    fn frames(codes: &[u32]) -> Rows {
        let flat = (codes.iter().enumerate())
            .flat_map(|(t, &c)| {
                std::iter::once(c + 100).chain(std::iter::once(c)).chain((1..10).map(move |i| (t * i) as u32))
            })
            .collect();
        Rows::from_flat(10, flat)
    }

    #[test]
    fn a_window_of_few_semantic_codes_is_a_stall() {
        let guard = StallGuard { window: 8, max_codes: 2 };
        // Speech-like: a new code every frame.
        let speech: Vec<u32> = (0..20).collect();
        assert!(!guard.stalled(&frames(&speech)));
        // Then eight frames alternating between two codes: still.
        let mut still = speech.clone();
        still.extend([7, 9, 7, 7, 9, 9, 7, 9]);
        assert!(guard.stalled(&frames(&still)));
        // Seven still frames are not yet the window.
        assert!(!guard.stalled(&frames(&still[..still.len() - 1])));
        // A third code inside the window breaks it.
        still[24] = 3;
        assert!(!guard.stalled(&frames(&still)));
        // A chunk shorter than the window never stalls, however still.
        assert!(!guard.stalled(&frames(&[5; 7])));
        assert!(guard.stalled(&frames(&[5; 8])));
        // A window of zero is no guard.
        assert!(!StallGuard { window: 0, max_codes: 1 }.stalled(&frames(&[5; 8])));
    }
}
