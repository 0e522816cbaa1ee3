//! Reading a checkpoint file front to back in large pieces, the way a cold start should
//! (issue 16, "fast, safe restarts"): a piece the page cache already holds is copied out of it
//! (a warm start), any other piece is read by direct I/O (`O_DIRECT`), which streams from the
//! disk at its sequential bandwidth without filling the page cache with 40 GB that will never be
//! read again. Where the file system refuses `O_DIRECT` (tmpfs, some network and overlay file
//! systems) the reader falls back to ordinary reads and says so.
//!
//! Direct I/O needs the buffer's address, the file offset and the length aligned to the device's
//! block size; [`DIRECT_ALIGN`] (4 KiB) covers every block size in use. Callers hand in buffers
//! aligned to it (the CUDA engine's pinned staging is page-aligned) and offsets that are
//! multiples of it; the last piece's length is rounded up inside the buffer.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The alignment direct I/O asks of buffers, offsets and lengths.
pub const DIRECT_ALIGN: usize = 4096;

/// How the reader takes each piece (`serve --weights-io`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadMode {
    /// From the page cache when it holds the whole piece, else by direct I/O.
    #[default]
    Auto,
    /// Every piece by direct I/O (a cold start measured from a warm machine).
    Direct,
    /// Every piece through the page cache (ordinary reads).
    Cached,
}

/// How one piece was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadHow {
    /// Copied out of the page cache, which held all of it.
    Cached,
    /// Read from the disk by direct I/O.
    Direct,
    /// An ordinary read of a piece the cache did not hold (direct I/O refused or not asked for).
    Buffered,
}

/// One file, read piece by piece; shared by several reading threads (`read_at` takes `&self`).
pub struct SequentialReader<'m> {
    path: PathBuf,
    len: u64,
    buffered: File,
    /// The same file opened with `O_DIRECT`, while direct reads work.
    direct: Option<File>,
    /// Set once a direct read is refused: the rest of the file is read the ordinary way.
    direct_refused: AtomicBool,
    /// The file mapped read-only, for asking which pages the page cache holds (`mincore`).
    mapped: Option<&'m [u8]>,
    mode: ReadMode,
}

impl<'m> SequentialReader<'m> {
    /// Opens `path`. `mapped`, when given, is the whole file mapped (page-aligned): `Auto` asks it
    /// which pieces are cached; without it every piece counts as uncached.
    pub fn open(path: &Path, mapped: Option<&'m [u8]>, mode: ReadMode) -> io::Result<SequentialReader<'m>> {
        let buffered = File::open(path)?;
        let len = buffered.metadata()?.len();
        let direct = match mode {
            ReadMode::Cached => None,
            // EINVAL here is the file system refusing O_DIRECT; read the ordinary way instead.
            ReadMode::Auto | ReadMode::Direct => {
                std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok()
            }
        };
        if mapped.is_some_and(|m| m.len() as u64 != len || !(m.as_ptr() as usize).is_multiple_of(page_size())) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the mapping given is not the whole file"));
        }
        Ok(SequentialReader {
            path: path.to_owned(),
            len,
            buffered,
            direct_refused: AtomicBool::new(direct.is_none() && mode != ReadMode::Cached),
            direct,
            mapped,
            mode,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether direct I/O was refused for this file (by `open` or by a read).
    pub fn direct_refused(&self) -> bool {
        self.direct_refused.load(Ordering::Relaxed)
    }

    /// Reads `want` bytes at `offset` (a multiple of [`DIRECT_ALIGN`]) into the front of `buf`,
    /// whose address is aligned to it and which has room for `want` rounded up to it. Returns
    /// how the piece was read. Fails if the file ends before `offset + want`.
    pub fn read_at(&self, offset: u64, want: usize, buf: &mut [u8]) -> io::Result<ReadHow> {
        assert!(offset.is_multiple_of(DIRECT_ALIGN as u64), "piece offset {offset} is not aligned");
        assert!(want <= buf.len(), "a piece of {want} bytes in a buffer of {}", buf.len());
        let how = match self.mode {
            ReadMode::Cached => ReadHow::Cached,
            ReadMode::Auto if self.cached(offset, want) => ReadHow::Cached,
            ReadMode::Auto | ReadMode::Direct if !self.direct_refused() => ReadHow::Direct,
            ReadMode::Auto | ReadMode::Direct => ReadHow::Buffered,
        };
        if how == ReadHow::Direct {
            match self.read_direct(offset, want, buf) {
                Ok(()) => return Ok(ReadHow::Direct),
                // A refusal (EINVAL: alignment the device does not take; EOPNOTSUPP) falls back.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)) => {
                    self.direct_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        read_exact_at(&self.buffered, offset, &mut buf[..want], self.len)?;
        Ok(if how == ReadHow::Cached { ReadHow::Cached } else { ReadHow::Buffered })
    }

    fn read_direct(&self, offset: u64, want: usize, buf: &mut [u8]) -> io::Result<()> {
        let file = self.direct.as_ref().expect("direct reads only while the O_DIRECT file is open");
        let padded = want.next_multiple_of(DIRECT_ALIGN);
        if padded > buf.len() || !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The padded tail past the end of the file reads short, which is fine: only `want` counts.
        let mut done = 0;
        while done < want {
            let n = file.read_at(&mut buf[done..padded], offset + done as u64)?;
            if n == 0 {
                return Err(past_end(self.len, offset, want));
            }
            done += n;
            if done < want && !done.is_multiple_of(DIRECT_ALIGN) {
                // A short read that broke alignment: finish the piece the ordinary way.
                return read_exact_at(&self.buffered, offset + done as u64, &mut buf[done..want], self.len);
            }
        }
        Ok(())
    }

    /// Whether the page cache holds every page of `offset .. offset + want`.
    fn cached(&self, offset: u64, want: usize) -> bool {
        let Some(map) = self.mapped else { return false };
        let page = page_size();
        let start = (offset as usize) / page * page;
        let end = (offset as usize + want).min(map.len());
        if start >= end {
            return true;
        }
        let pages = (end - start).div_ceil(page);
        let mut resident = vec![0u8; pages];
        // SAFETY: `map[start..end]` lies inside a live mapping whose base is page-aligned, so
        // `start` is page-aligned too; `resident` has one byte per page of the range.
        let rc =
            unsafe { libc::mincore(map.as_ptr().add(start) as *mut libc::c_void, end - start, resident.as_mut_ptr()) };
        rc == 0 && resident.iter().all(|&r| r & 1 == 1)
    }
}

fn read_exact_at(file: &File, offset: u64, buf: &mut [u8], len: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(past_end(len, offset, buf.len())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn past_end(len: u64, offset: u64, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("the file ended before byte {} (it was {len} bytes when opened)", offset + want as u64),
    )
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(DIRECT_ALIGN)
}

/// A heap buffer aligned for direct I/O (tests and host-side readers; the CUDA engine reads into
/// its pinned staging instead).
pub struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    pub fn new(len: usize) -> AlignedBuffer {
        assert!(len > 0, "an empty aligned buffer");
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuffer { ptr, len }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).expect("an aligned buffer's layout")
    }
}

impl AsRef<[u8]> for AlignedBuffer {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` addresses `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for AlignedBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    /// Every mode reads every piece, the unaligned tail included, exactly as the file holds it.
    #[test]
    fn every_mode_reads_the_file_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let data = pattern(3 * 65536 + 1234);
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private test file nobody else writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        for mode in [ReadMode::Auto, ReadMode::Direct, ReadMode::Cached] {
            for mapped in [None, Some(&map[..])] {
                let reader = SequentialReader::open(&path, mapped, mode).unwrap();
                let mut buf = AlignedBuffer::new(65536);
                let mut got = Vec::new();
                let mut offset = 0u64;
                while offset < reader.len() {
                    let want = (reader.len() - offset).min(65536) as usize;
                    let how = reader.read_at(offset, want, buf.as_mut()).unwrap();
                    if mode == ReadMode::Cached {
                        assert_eq!(how, ReadHow::Cached);
                    }
                    got.extend_from_slice(&buf.as_ref()[..want]);
                    offset += want as u64;
                }
                assert!(got == data, "{mode:?} with mapping {}: bytes differ", mapped.is_some());
            }
        }
    }

    /// A file that the page cache holds (just written) is read from it in `Auto`.
    #[test]
    fn auto_copies_cached_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, pattern(8192)).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private test file nobody else writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let _touch: u64 = map.iter().map(|&b| u64::from(b)).sum();
        let reader = SequentialReader::open(&path, Some(&map[..]), ReadMode::Auto).unwrap();
        let mut buf = AlignedBuffer::new(8192);
        assert_eq!(reader.read_at(0, 8192, buf.as_mut()).unwrap(), ReadHow::Cached);
    }

    /// A misaligned buffer is refused by direct I/O and read the ordinary way, and the reader
    /// remembers the refusal.
    #[test]
    fn a_refused_direct_read_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let data = pattern(8192);
        std::fs::write(&path, &data).unwrap();
        let reader = SequentialReader::open(&path, None, ReadMode::Direct).unwrap();
        let mut buf = AlignedBuffer::new(8192 + DIRECT_ALIGN);
        let how = reader.read_at(0, 4096, &mut buf.as_mut()[1..]).unwrap();
        assert_eq!(how, ReadHow::Buffered);
        assert!(reader.direct_refused());
        assert_eq!(&buf.as_ref()[1..4097], &data[..4096]);
    }

    /// Asking past the end of the file (a file shrunk after its header was read) is an error.
    #[test]
    fn a_piece_past_the_end_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, pattern(5000)).unwrap();
        for mode in [ReadMode::Direct, ReadMode::Cached] {
            let reader = SequentialReader::open(&path, None, mode).unwrap();
            let mut buf = AlignedBuffer::new(8192);
            let err = reader.read_at(4096, 4096, buf.as_mut()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{mode:?}: {err}");
        }
    }
}
