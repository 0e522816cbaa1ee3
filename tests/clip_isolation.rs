//! A client's reference clip decoded in a child process (`voice::isolated`), as the server does:
//! the same clip as the in-process decoder, bit for bit, and the same refusals; files that make
//! the third-party decoders allocate tens of gigabytes are refused by the child's memory limit,
//! and this process goes on.

use std::io::Cursor;

use limelight::voice::clip::{self, ClipError, ClipLimits};
use limelight::voice::isolated::ClipDecoder;

fn decoder() -> ClipDecoder {
    ClipDecoder::new(env!("CARGO_BIN_EXE_limelight"), limelight::voice::isolated::DEFAULT_MEMORY_MIB)
}

/// A fuzz seed's file (its first byte picks the fuzz target's hint).
fn seed(name: &str) -> Vec<u8> {
    let path = format!("{}/fuzz/seeds/voice_clip/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))[1..].to_vec()
}

/// `seconds` of a two-tone stereo WAV at `rate`, 16-bit.
fn wav(seconds: f64, rate: u32) -> Vec<u8> {
    let spec =
        hound::WavSpec { channels: 2, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut out = Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut out, spec).unwrap();
    for i in 0..(seconds * f64::from(rate)) as usize {
        let t = i as f64 / f64::from(rate);
        for hz in [220.0, 330.0] {
            writer.write_sample((8000.0 * (std::f64::consts::TAU * hz * t).sin()) as i16).unwrap();
        }
    }
    writer.finalize().unwrap();
    out.into_inner()
}

#[test]
fn clips_and_refusals_come_back_as_the_in_process_decoder_gives_them() {
    // The seeds are short clips (0.1–0.8 s).
    let limits = ClipLimits { min_seconds: 0.05, ..ClipLimits::default() };
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("wav 24 kHz", wav(1.5, 24_000), None),
        ("wav 44.1 kHz", wav(0.75, 44_100), Some("audio/wav")),
        ("flac", seed("flac-24k"), Some("flac")),
        ("mp3", seed("mp3-24k"), None),
        ("ogg vorbis", seed("ogg-vorbis-22k"), Some("ogg")),
        ("ogg opus", seed("opus-48k"), None),
        ("m4a", seed("m4a-aac-32k"), Some("m4a")),
        ("too short", wav(0.02, 24_000), None),
        ("not audio", b"definitely not audio".to_vec(), None),
        ("odd rate", seed("wav-44108-hz"), None),
    ];
    let mut clips = 0;
    for (what, bytes, hint) in cases {
        let alone = decoder().decode(&bytes, hint, &limits).expect("the decoder runs");
        let in_process = clip::decode(&bytes, hint, &limits);
        assert_eq!(alone, in_process, "{what}");
        clips += usize::from(alone.is_ok());
    }
    // Both kinds of answer came back: seven clips (samples and all), three refusals.
    assert_eq!(clips, 7);
}

/// Four bytes changed in an M4A's sample tables (a count of 2³² − 1) make symphonia 0.5.5 reserve
/// 16–64 GB before it reads the table: in the server's process that allocation would fail and
/// abort it. The child's address-space limit stops it there.
#[test]
fn files_that_make_the_decoder_allocate_gigabytes_are_refused_by_the_childs_limit() {
    let limits = ClipLimits::default();
    for name in ["m4a-stsc-64gb", "m4a-stts-32gb", "m4a-stsz-16gb", "m4a-stco-16gb"] {
        let refused = decoder().decode(&seed(name), Some("m4a"), &limits).expect("the decoder runs");
        match refused {
            Err(ClipError::Undecodable(why)) => assert!(why.contains("decoder was stopped by signal"), "{name}: {why}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    // The same decoder still decodes an honest clip afterwards.
    assert!(decoder().decode(&wav(1.0, 24_000), None, &limits).unwrap().is_ok());
}

#[test]
fn an_oversized_file_is_refused_before_a_child_starts_and_a_missing_decoder_is_the_servers_fault() {
    let missing = ClipDecoder::new("/nonexistent/limelight", 512);
    let limits = ClipLimits { max_bytes: 1000, ..ClipLimits::default() };
    let big = wav(1.0, 24_000);
    let refused = missing.decode(&big, None, &limits).expect("refused without running anything");
    assert_eq!(refused, Err(ClipError::TooLarge { bytes: big.len(), max: 1000 }));
    let e = missing.decode(b"RIFF", None, &limits).expect_err("nothing to run");
    assert!(e.to_string().contains("/nonexistent/limelight"), "{e}");
}

/// A decoder that goes on writing after its answer cannot hold the request: the answer's end
/// closes the pipe, so the child's next write fails and it stops (here `yes`, by SIGPIPE), and a
/// child that did not finish cleanly is not believed.
#[test]
fn a_decoder_that_keeps_writing_is_cut_off_and_not_believed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("talker");
    let answer = r#"{"Clip":{"samples":1,"source_rate":24000,"source_channels":1}}"#;
    std::fs::write(&script, format!("#!/bin/sh\n/bin/cat > /dev/null\nprintf '%s\\n' '{answer}'\nexec /usr/bin/yes\n"))
        .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let started = std::time::Instant::now();
    let got = ClipDecoder::new(&script, 512).decode(&wav(1.0, 24_000), None, &ClipLimits::default());
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    match got {
        Ok(Err(ClipError::Undecodable(why))) => assert!(why.contains("signal 13"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// A decoder that never reads its input, and so never spends CPU, cannot hold the request either:
/// the watchdog kills it at its wall-clock limit (twice its CPU limit, plus 2 s).
#[test]
fn a_decoder_that_blocks_is_killed_by_the_clock() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sleeper");
    std::fs::write(&script, "#!/bin/sh\nexec /usr/bin/sleep 600\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let decoder = ClipDecoder { cpu_seconds: 1, ..ClipDecoder::new(&script, 512) };
    let started = std::time::Instant::now();
    // Larger than a pipe's buffer: the write to a child that does not read blocks.
    let got = decoder.decode(&wav(3.0, 24_000), None, &ClipLimits::default());
    let took = started.elapsed();
    assert!((std::time::Duration::from_secs(3)..std::time::Duration::from_secs(20)).contains(&took), "{took:?}");
    match got {
        Ok(Err(ClipError::Undecodable(why))) => assert!(why.contains("signal 9"), "{why}"),
        other => panic!("{other:?}"),
    }
}
