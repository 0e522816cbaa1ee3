//! The weights' upload in file order (issue 16, "fast, safe restarts"). The builders first ask
//! for every tensor and the backend allocates each one ([`FileOrderUpload::reserve`]); then
//! reading threads go through the shard files front to back in large pieces, straight into the
//! backend's staging buffers (by direct I/O unless the page cache holds the piece:
//! `checkpoint::sequential`), and check every tensor's bytes in the piece for NaN and infinity,
//! while this thread queues each piece's copies to the weights' destinations. A disk is read
//! at its sequential bandwidth, by several threads at once, with nothing read twice.
//!
//! Pieces are copied in the order they are read, not in file order; each copy has its own
//! destination, so the order does not matter. A staging buffer is refilled only after the
//! backend's fence says its copies are done.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::backend::FileOrderUpload;
use crate::checkpoint::Dtype;
use crate::checkpoint::finite::has_non_finite;
use crate::checkpoint::safetensors::SafetensorsFile;
use crate::checkpoint::sequential::{DIRECT_ALIGN, ReadHow, ReadMode, SequentialReader};

/// How the file-order upload reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOrderOptions {
    pub mode: ReadMode,
    /// Threads reading pieces at once (the disk's queue depth, and the page-cache copies' cores).
    pub readers: usize,
    /// Bytes per piece (a multiple of the direct-I/O alignment).
    pub piece_bytes: usize,
}

impl Default for FileOrderOptions {
    fn default() -> Self {
        FileOrderOptions { mode: ReadMode::Auto, readers: 4, piece_bytes: 32 << 20 }
    }
}

/// Pieces whose copies may be in flight at once, on top of one per reading thread.
const IN_FLIGHT: usize = 2;

/// One tensor's bytes in its file, and where they go when they are copied as stored.
struct Span<'c> {
    name: &'c str,
    bytes: Range<usize>,
    dtype: Dtype,
    dst: Option<u64>,
}

/// One shard file and its tensors in file order.
pub struct FilePlan<'c> {
    file: &'c SafetensorsFile,
    spans: Vec<Span<'c>>,
}

/// The plan over `files`: every tensor is checked; those in `reserved` (name → destination) are
/// copied there.
pub fn plan<'c>(files: &'c [SafetensorsFile], reserved: &BTreeMap<String, u64>) -> Vec<FilePlan<'c>> {
    files
        .iter()
        .map(|file| {
            let mut spans: Vec<Span<'c>> = file
                .tensors()
                .iter()
                .map(|(name, t)| Span {
                    name: name.as_str(),
                    bytes: t.bytes.clone(),
                    dtype: t.dtype,
                    dst: reserved.get(name).copied(),
                })
                .collect();
            spans.sort_by_key(|s| s.bytes.start);
            FilePlan { file, spans }
        })
        .collect()
}

impl FilePlan<'_> {
    /// The spans with bytes in `range`.
    fn overlapping(&self, range: Range<usize>) -> impl Iterator<Item = &Span<'_>> {
        let first = self.spans.partition_point(|s| s.bytes.end <= range.start);
        self.spans[first..].iter().take_while(move |s| s.bytes.start < range.end).filter(|s| !s.bytes.is_empty())
    }
}

/// What the upload read, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReadStats {
    /// Bytes read in all (the whole files, headers included).
    pub bytes: u64,
    /// Of those, copied out of the page cache.
    pub cached: u64,
    /// Read from the disk by direct I/O.
    pub direct: u64,
    /// Read the ordinary way from the disk (direct I/O refused or not asked for).
    pub buffered: u64,
    /// Files for which the file system refused direct I/O.
    pub direct_refused_files: usize,
    pub took: Duration,
}

impl ReadStats {
    pub fn gib_per_s(&self) -> f64 {
        self.bytes as f64 / f64::from(1u32 << 30) / self.took.as_secs_f64().max(1e-9)
    }
}

/// Why the upload stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamError {
    Read {
        file: String,
        message: String,
    },
    /// A tensor holds a NaN or an infinity (the caller finds and names the first one).
    NonFinite {
        file: String,
        tensor: String,
    },
    Staging(String),
}

struct Piece {
    file: usize,
    offset: u64,
    len: usize,
}

/// A reading thread's answer: a filled piece, or a buffer handed back as the thread ends.
struct Filled<S> {
    staging: S,
    piece: Option<(usize, Result<ReadHow, StreamError>)>,
}

/// Reads every file of `plans` once, front to back, checking every tensor and copying the
/// reserved ones; calls `report(bytes read, bytes in all)` each time another `every` are read.
pub fn stream<B: FileOrderUpload>(
    backend: &B,
    plans: &[FilePlan<'_>],
    options: FileOrderOptions,
    every: u64,
    report: &mut dyn FnMut(u64, u64),
) -> Result<ReadStats, StreamError> {
    assert!(
        options.piece_bytes > 0 && options.piece_bytes.is_multiple_of(DIRECT_ALIGN),
        "pieces of {} bytes",
        options.piece_bytes
    );
    let started = Instant::now();
    let readers = plans
        .iter()
        .map(|p| SequentialReader::open(p.file.path(), Some(p.file.mapped()), options.mode))
        .zip(plans)
        .map(|(r, p)| r.map_err(|e| read_error(p.file.path(), &e)))
        .collect::<Result<Vec<_>, _>>()?;
    let pieces = pieces(&readers, options.piece_bytes);
    let threads = options.readers.clamp(1, pieces.len().max(1));
    let buffers = backend.staging(threads + IN_FLIGHT + 1, options.piece_bytes).map_err(StreamError::Staging)?;

    let (free_tx, free_rx) = mpsc::channel();
    for b in buffers {
        free_tx.send(b).expect("the free list is open");
    }
    let free_rx = Mutex::new(free_rx);
    let (filled_tx, filled_rx) = mpsc::channel();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut stats = ReadStats::default();

    let total: u64 = readers.iter().map(SequentialReader::len).sum();
    let mut spare = Vec::new();

    let outcome = std::thread::scope(|scope| {
        for t in 0..threads {
            let work = Reading { free: &free_rx, next: &next, stop: &stop, pieces: &pieces, readers: &readers, plans };
            let filled = filled_tx.clone();
            std::thread::Builder::new()
                .name(format!("limelight-read-{t}"))
                .spawn_scoped(scope, move || work.run(filled))
                .expect("spawning a reading thread");
        }
        drop(filled_tx);
        let mut free_tx = Some(free_tx);
        let mut in_flight: VecDeque<(B::Staging, B::Fence)> = VecDeque::new();
        let (mut done, mut next_report, mut failed) = (0usize, every, None);
        while done < pieces.len() && failed.is_none() {
            let Ok(Filled { staging, piece }) = filled_rx.recv() else { break };
            let Some((i, read)) = piece else {
                spare.push(staging);
                continue;
            };
            let p = &pieces[i];
            match read {
                Ok(how) => stats.count(how, p.len as u64),
                Err(e) => {
                    failed = Some(e);
                    spare.push(staging);
                    continue;
                }
            }
            let fence = backend.copy_staged(&staging, &copies(&plans[p.file], p));
            in_flight.push_back((staging, fence));
            while in_flight.len() > IN_FLIGHT {
                let (staging, fence) = in_flight.pop_front().expect("a piece in flight");
                backend.wait(fence);
                match &free_tx {
                    Some(tx) => tx.send(staging).unwrap_or_else(|back| spare.push(back.0)),
                    None => spare.push(staging),
                }
            }
            done += 1;
            if stats.bytes >= next_report {
                report(stats.bytes, total);
                next_report = stats.bytes.saturating_add(every);
            }
        }
        // End every reader (those waiting for a buffer wake to a closed list), then let the
        // copies still queued finish before their buffers can be dropped.
        stop.store(true, Ordering::Relaxed);
        free_tx.take();
        for (staging, fence) in in_flight.drain(..) {
            backend.wait(fence);
            spare.push(staging);
        }
        match failed {
            Some(e) => Err(e),
            None if done < pieces.len() => Err(StreamError::Read {
                file: readers.first().map(|r| r.path().display().to_string()).unwrap_or_default(),
                message: "the reading threads ended before the last piece".into(),
            }),
            None => Ok(()),
        }
    });
    // Every buffer (handed back, queued, or spare) is dropped here, on the backend's thread.
    spare.extend(filled_rx.try_iter().map(|f| f.staging));
    drop(spare);
    drop(free_rx);
    outcome?;
    stats.direct_refused_files =
        if options.mode == ReadMode::Cached { 0 } else { readers.iter().filter(|r| r.direct_refused()).count() };
    stats.took = started.elapsed();
    Ok(stats)
}

impl ReadStats {
    fn count(&mut self, how: ReadHow, bytes: u64) {
        self.bytes += bytes;
        match how {
            ReadHow::Cached => self.cached += bytes,
            ReadHow::Direct => self.direct += bytes,
            ReadHow::Buffered => self.buffered += bytes,
        }
    }
}

/// Every file cut into pieces, files in plan order, each front to back.
fn pieces(readers: &[SequentialReader<'_>], piece_bytes: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for (file, r) in readers.iter().enumerate() {
        let mut offset = 0;
        while offset < r.len() {
            let len = (r.len() - offset).min(piece_bytes as u64) as usize;
            out.push(Piece { file, offset, len });
            offset += len as u64;
        }
    }
    out
}

/// The copies out of piece `p`'s buffer: `(range in the buffer, destination address)`.
fn copies(plan: &FilePlan<'_>, p: &Piece) -> Vec<(Range<usize>, u64)> {
    let start = p.offset as usize;
    let end = start + p.len;
    plan.overlapping(start..end)
        .filter_map(|s| {
            let dst = s.dst?;
            let lo = s.bytes.start.max(start);
            let hi = s.bytes.end.min(end);
            Some((lo - start..hi - start, dst + (lo - s.bytes.start) as u64))
        })
        .collect()
}

/// What each reading thread shares.
struct Reading<'a, 'c, S> {
    free: &'a Mutex<mpsc::Receiver<S>>,
    next: &'a AtomicUsize,
    stop: &'a AtomicBool,
    pieces: &'a [Piece],
    readers: &'a [SequentialReader<'c>],
    plans: &'a [FilePlan<'c>],
}

impl<S: AsMut<[u8]>> Reading<'_, '_, S> {
    /// Takes a free buffer, claims the next piece, reads and checks it, hands it over; again
    /// until the pieces run out or the upload stops. A buffer in hand goes back as it ends.
    fn run(self, filled: mpsc::Sender<Filled<S>>) {
        loop {
            let Ok(mut staging) = self.free.lock().expect("free-list lock").recv() else { return };
            let claimed =
                if self.stop.load(Ordering::Relaxed) { None } else { Some(self.next.fetch_add(1, Ordering::Relaxed)) };
            let Some(i) = claimed.filter(|&i| i < self.pieces.len()) else {
                let _ = filled.send(Filled { staging, piece: None });
                return;
            };
            let p = &self.pieces[i];
            let read = fill(&self.readers[p.file], &self.plans[p.file], p, staging.as_mut());
            if filled.send(Filled { staging, piece: Some((i, read)) }).is_err() {
                return;
            }
        }
    }
}

/// Reads piece `p` into `buf` and checks every tensor element that starts in it.
fn fill(reader: &SequentialReader<'_>, plan: &FilePlan<'_>, p: &Piece, buf: &mut [u8]) -> Result<ReadHow, StreamError> {
    let how = reader.read_at(p.offset, p.len, buf).map_err(|e| read_error(reader.path(), &e))?;
    let start = p.offset as usize;
    let end = start + p.len;
    let mapped = plan.file.mapped();
    for s in plan.overlapping(start..end) {
        let size = s.dtype.size();
        // Elements are laid out from the tensor's first byte; check those that start here.
        let first = s.bytes.start + (start.max(s.bytes.start) - s.bytes.start).div_ceil(size) * size;
        let whole_end = first + (s.bytes.end.min(end).saturating_sub(first)) / size * size;
        let mut bad = first < whole_end && has_non_finite(s.dtype, &buf[first - start..whole_end - start]);
        // An element split between this piece and the next is read from the mapping.
        if whole_end < end && whole_end < s.bytes.end {
            bad |= has_non_finite(s.dtype, &mapped[whole_end..whole_end + size]);
        }
        if bad {
            return Err(StreamError::NonFinite {
                file: reader.path().display().to_string(),
                tensor: s.name.to_owned(),
            });
        }
    }
    Ok(how)
}

fn read_error(path: &Path, e: &std::io::Error) -> StreamError {
    StreamError::Read { file: path.display().to_string(), message: format!("cannot read the weights: {e}") }
}
