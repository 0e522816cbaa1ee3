//! Whether a job's client keeps up with its stream (issue 16, finding 2). A slow reader pauses
//! only its own stream (its events wait in the outbox), but it still holds a slot of the batch:
//! so a client is given up when, while it holds its stream back,
//! - it takes nothing for `stall_timeout` (it stopped reading), or
//! - over a window of `rate_window` it takes audio slower than `min_read_rate` × real time (it
//!   reads, but too slowly ever to play the audio as it comes).
//!
//! A client is judged only while events wait for it: when the engine is the slower side (its
//! outbox runs empty), the client is keeping up by definition and no window is open.

use std::time::{Duration, Instant};

/// How a client must keep up (`--stall-timeout`, `--min-read-rate`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReaderPolicy {
    /// Longest time a client may take nothing while its events wait.
    pub stall_timeout: Duration,
    /// Least rate, in multiples of real time, at which a client that holds its stream back must
    /// take its audio; 0 turns the check off.
    pub min_read_rate: f64,
    /// The window the rate is measured over (the server uses [`RATE_WINDOW`]).
    pub rate_window: Duration,
}

/// The server's rate window: long enough that one event's audio (≤ 0.37 s) is a small part of
/// it, short enough that a slow reader is found while most of its request is still to come.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// What a delivery says about the client.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    KeepsUp,
    /// It took nothing for the stall timeout.
    Stalled,
    /// It took audio at `rate` × real time over the last window, below the policy's least.
    TooSlow {
        rate: f64,
    },
}

/// One client's reading, as the worker sees it.
#[derive(Debug, Default)]
pub struct ReaderPace {
    /// Samples of audio the client has taken.
    taken: u64,
    /// Since when events have waited for a client that took none.
    blocked_since: Option<Instant>,
    /// The open rate window: its start and the samples taken by then.
    window: Option<(Instant, u64)>,
}

impl ReaderPace {
    /// The client took an audio event of `samples`.
    pub fn took(&mut self, samples: usize) {
        self.taken += samples as u64;
    }

    /// Judges the client after a delivery: `waiting`, whether events still wait for it;
    /// `progressed`, whether it took any event in this delivery.
    pub fn judge(
        &mut self,
        waiting: bool,
        progressed: bool,
        now: Instant,
        policy: &ReaderPolicy,
        sample_rate: u32,
    ) -> Verdict {
        if !waiting {
            self.blocked_since = None;
            self.window = None;
            return Verdict::KeepsUp;
        }
        if progressed {
            self.blocked_since = None;
        }
        let since = *self.blocked_since.get_or_insert(now);
        if now.duration_since(since) >= policy.stall_timeout {
            return Verdict::Stalled;
        }
        if policy.min_read_rate <= 0.0 {
            return Verdict::KeepsUp;
        }
        let (start, taken_then) = *self.window.get_or_insert((now, self.taken));
        let elapsed = now.duration_since(start);
        if elapsed < policy.rate_window {
            return Verdict::KeepsUp;
        }
        let audio = (self.taken - taken_then) as f64 / f64::from(sample_rate);
        let rate = audio / elapsed.as_secs_f64();
        if rate < policy.min_read_rate {
            return Verdict::TooSlow { rate };
        }
        self.window = Some((now, self.taken));
        Verdict::KeepsUp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 1000;

    fn policy(min_read_rate: f64) -> ReaderPolicy {
        ReaderPolicy { stall_timeout: Duration::from_secs(30), min_read_rate, rate_window: Duration::from_secs(10) }
    }

    /// A client that takes `audio_secs` of audio every `every` while events wait, for `for_secs`.
    fn reading(
        pace: &mut ReaderPace,
        policy: &ReaderPolicy,
        audio_secs: f64,
        every: Duration,
        for_secs: u64,
    ) -> Verdict {
        let t0 = Instant::now();
        let mut t = t0;
        while t < t0 + Duration::from_secs(for_secs) {
            pace.took((audio_secs * f64::from(RATE)) as usize);
            let verdict = pace.judge(true, true, t, policy, RATE);
            if verdict != Verdict::KeepsUp {
                return verdict;
            }
            t += every;
        }
        Verdict::KeepsUp
    }

    #[test]
    fn a_reader_at_real_time_keeps_up_for_as_long_as_it_reads() {
        let mut pace = ReaderPace::default();
        let verdict = reading(&mut pace, &policy(0.5), 0.37, Duration::from_millis(370), 120);
        assert_eq!(verdict, Verdict::KeepsUp);
    }

    #[test]
    fn a_reader_below_the_least_rate_is_found_after_one_window() {
        let mut pace = ReaderPace::default();
        // 0.37 s of audio every 1.85 s: 0.2× real time.
        let verdict = reading(&mut pace, &policy(0.5), 0.37, Duration::from_millis(1850), 120);
        let Verdict::TooSlow { rate } = verdict else { panic!("{verdict:?}") };
        assert!((0.15..0.25).contains(&rate), "{rate}");
        // With the check off, the same reader keeps its stream.
        let mut pace = ReaderPace::default();
        assert_eq!(reading(&mut pace, &policy(0.0), 0.37, Duration::from_millis(1850), 120), Verdict::KeepsUp);
    }

    #[test]
    fn a_reader_that_takes_nothing_stalls_after_the_timeout() {
        let mut pace = ReaderPace::default();
        let policy = policy(0.0);
        let t0 = Instant::now();
        assert_eq!(pace.judge(true, false, t0, &policy, RATE), Verdict::KeepsUp);
        assert_eq!(pace.judge(true, false, t0 + Duration::from_secs(29), &policy, RATE), Verdict::KeepsUp);
        assert_eq!(pace.judge(true, false, t0 + Duration::from_secs(30), &policy, RATE), Verdict::Stalled);
    }

    #[test]
    fn a_client_is_not_judged_while_the_engine_is_the_slower_side() {
        let mut pace = ReaderPace::default();
        let policy = policy(0.5);
        let t0 = Instant::now();
        // Events wait for a moment, then the outbox runs empty: the window closes.
        assert_eq!(pace.judge(true, false, t0, &policy, RATE), Verdict::KeepsUp);
        assert_eq!(pace.judge(false, false, t0 + Duration::from_secs(5), &policy, RATE), Verdict::KeepsUp);
        // A new wait opens a new window: nothing taken in the 9 s since is within its window.
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(pace.judge(true, false, t1, &policy, RATE), Verdict::KeepsUp);
        assert_eq!(pace.judge(true, false, t1 + Duration::from_secs(9), &policy, RATE), Verdict::KeepsUp);
        assert!(matches!(
            pace.judge(true, false, t1 + Duration::from_secs(10), &policy, RATE),
            Verdict::TooSlow { .. }
        ));
    }
}
