//! What a long request's text costs before its first audio (issue 15): the normaliser and the
//! chunk split over a two-speaker script of 20 000 and 80 000 characters (the lines of
//! `tools/gpu/long-text.sh`), and a text of 1000 numbers; each the mean of 10 runs.
//!
//!     cargo run --release --example text_prep_cost

use std::time::{Duration, Instant};

use limelight::request::chunked::{CHUNK_LIMITS, chunk_texts};
use limelight::request::normalize::normalize;
use limelight::request::text::{CallerText, Field};

const LINES: [&str; 4] = [
    "The morning was quiet, and the river ran slowly past the old stone bridge.",
    "Did you see the boats come in before the rain started, or were you still asleep?",
    "I counted 12 of them, each one heavier than the last, riding low in the water.",
    "Then we should go down to the harbour at 7:30 and ask what they brought back.",
];

fn script(chars: usize) -> String {
    let mut out = String::new();
    for i in 0.. {
        if out.len() >= chars {
            break;
        }
        out.push_str(&format!("<|speaker:{}|> {} ", i % 2, LINES[i % LINES.len()]));
    }
    out
}

fn mean(f: impl Fn()) -> Duration {
    let start = Instant::now();
    for _ in 0..10 {
        f();
    }
    start.elapsed() / 10
}

fn main() {
    for (name, text) in [
        ("script 20 000", script(20_000)),
        ("script 80 000", script(80_000)),
        ("1000 numbers", "I counted 12 of them ".repeat(1000)),
    ] {
        let checked = CallerText::check(text.clone(), Field::Input).expect("checked text");
        let normalised = mean(|| drop(std::hint::black_box(normalize(&text))));
        let split = mean(|| drop(std::hint::black_box(chunk_texts(&checked, CHUNK_LIMITS))));
        println!("{name} ({} chars): normalise {normalised:?}, chunk_texts {split:?}", text.len());
    }
}
