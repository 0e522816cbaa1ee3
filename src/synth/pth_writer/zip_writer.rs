//! A STORED-only zip writer that lays records out byte-for-byte like PyTorch's miniz-based writer.
//!
//! What torch 2.x writes (checked against `torch.save` output, including a > 4 GiB archive):
//! * local header: version 0, flags `0x0808` (data descriptor follows, UTF-8 names), method 0, time
//!   and date 0, CRC and sizes 0; an extra field `"FB"` padded with `'Z'` so that the data starts on
//!   a 64-byte boundary (always present, possibly empty);
//! * data, then a data descriptor `PK\x07\x08` with CRC and 32-bit sizes (empty entries: flags
//!   `0x0800` and no descriptor);
//! * an entry whose size or local-header offset is ≥ 0xFFFFFFFF ("zip64 entry") also carries a zip64
//!   extra field (id 1) before the padding (uncompressed size and a zero compressed size if the
//!   size needs it, then the offset if the offset needs it), and its descriptor has 64-bit sizes;
//! * the central directory mirrors that (with real sizes in the zip64 field, `0xFFFFFFFF`
//!   placeholders), and ends with a zip64 end record and locator, always, then the classic end record.

use std::io::{self, Read, Write};

/// Data alignment PyTorch uses (`.storage_alignment`).
pub const ALIGNMENT: u64 = 64;
const MAX32: u64 = 0xFFFF_FFFF;
/// General-purpose flags: bit 11 (UTF-8 names), plus bit 3 (sizes in a data descriptor) for every
/// non-empty entry; miniz writes empty entries with neither descriptor nor bit 3.
fn flags(size: u64) -> u16 {
    if size == 0 { 0x0800 } else { 0x0808 }
}

struct Entry {
    name: String,
    offset: u64,
    size: u64,
    crc: u32,
}

/// Streams STORED entries to `out`, then the central directory on [`ZipWriter::finish`].
pub struct ZipWriter<W: Write> {
    out: W,
    pos: u64,
    entries: Vec<Entry>,
}

impl<W: Write> ZipWriter<W> {
    pub fn new(out: W) -> Self {
        ZipWriter { out, pos: 0, entries: Vec::new() }
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Adds one entry holding `data`.
    pub fn add(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.add_from_reader(name, data.len() as u64, crc32fast::hash(data), &mut &data[..])
    }

    /// Adds one entry of `size` bytes read from `data`, whose CRC-32 the caller already knows.
    pub fn add_from_reader(&mut self, name: &str, size: u64, crc: u32, data: &mut impl Read) -> io::Result<()> {
        if name.len() > usize::from(u16::MAX) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("zip entry name too long: {name}")));
        }
        let offset = self.pos;
        self.emit(&local_header(name, offset, size))?;
        let copied = io::copy(&mut data.take(size), &mut self.out)?;
        if copied != size {
            let msg = format!("zip entry {name}: expected {size} bytes, the source had {copied}");
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, msg));
        }
        self.pos += size;
        if size > 0 {
            self.emit(&data_descriptor(offset, size, crc))?;
        }
        self.entries.push(Entry { name: name.to_owned(), offset, size, crc });
        Ok(())
    }

    /// Writes the central directory and end records; returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        let cd_offset = self.pos;
        let central: Vec<u8> =
            self.entries.iter().flat_map(|e| central_header(&e.name, e.offset, e.size, e.crc)).collect();
        self.emit(&central)?;
        let end = end_records(self.entries.len() as u64, cd_offset, central.len() as u64);
        self.emit(&end)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn emit(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }
}

fn zip64_entry(offset: u64, size: u64) -> bool {
    size >= MAX32 || offset >= MAX32
}

fn u16le(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn u32le(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn u64le(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

/// Zip64 extended-information field (id 1) with the given values, or nothing.
fn zip64_extra(values: &[u64]) -> Vec<u8> {
    let mut v = Vec::new();
    if !values.is_empty() {
        u16le(&mut v, 1);
        u16le(&mut v, (values.len() * 8) as u16);
        values.iter().for_each(|&x| u64le(&mut v, x));
    }
    v
}

/// Local file header, name, zip64 field if needed and `"FB"` padding up to the aligned data start.
fn local_header(name: &str, offset: u64, size: u64) -> Vec<u8> {
    let mut z64 = Vec::new();
    if size >= MAX32 {
        // miniz writes the compressed size as 0 here: it is only known after the data.
        z64.extend([size, 0]);
    }
    if offset >= MAX32 {
        z64.push(offset);
    }
    let z64 = zip64_extra(&z64);
    let unpadded = offset + 30 + name.len() as u64 + z64.len() as u64 + 4;
    let pad = (ALIGNMENT - unpadded % ALIGNMENT) % ALIGNMENT;
    let mut v = Vec::with_capacity(unpadded as usize - offset as usize + pad as usize);
    u32le(&mut v, 0x0403_4b50);
    u16le(&mut v, 0); // version needed
    u16le(&mut v, flags(size));
    u16le(&mut v, 0); // method: stored
    u32le(&mut v, 0); // time, date
    v.extend_from_slice(&[0; 12]); // CRC and sizes: in the descriptor
    u16le(&mut v, name.len() as u16);
    u16le(&mut v, (z64.len() + 4 + pad as usize) as u16);
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&z64);
    v.extend_from_slice(b"FB");
    u16le(&mut v, pad as u16);
    v.resize(v.len() + pad as usize, b'Z');
    v
}

fn data_descriptor(offset: u64, size: u64, crc: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(24);
    u32le(&mut v, 0x0807_4b50);
    u32le(&mut v, crc);
    if zip64_entry(offset, size) {
        u64le(&mut v, size);
        u64le(&mut v, size);
    } else {
        u32le(&mut v, size as u32);
        u32le(&mut v, size as u32);
    }
    v
}

fn central_header(name: &str, offset: u64, size: u64, crc: u32) -> Vec<u8> {
    let mut z64 = Vec::new();
    if size >= MAX32 {
        z64.extend([size, size]);
    }
    if offset >= MAX32 {
        z64.push(offset);
    }
    let z64 = zip64_extra(&z64);
    let mut v = Vec::with_capacity(46 + name.len() + z64.len());
    u32le(&mut v, 0x0201_4b50);
    u16le(&mut v, 0); // version made by
    u16le(&mut v, 0); // version needed
    u16le(&mut v, flags(size));
    u16le(&mut v, 0); // method
    u32le(&mut v, 0); // time, date
    u32le(&mut v, crc);
    u32le(&mut v, size.min(MAX32) as u32);
    u32le(&mut v, size.min(MAX32) as u32);
    u16le(&mut v, name.len() as u16);
    u16le(&mut v, z64.len() as u16);
    u16le(&mut v, 0); // comment length
    u16le(&mut v, 0); // disk
    u16le(&mut v, 0); // internal attributes
    u32le(&mut v, 0); // external attributes
    u32le(&mut v, offset.min(MAX32) as u32);
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&z64);
    v
}

/// Zip64 end record + locator + classic end record, as miniz writes them for every torch archive.
fn end_records(entries: u64, cd_offset: u64, cd_size: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(56 + 20 + 22);
    u32le(&mut v, 0x0606_4b50);
    u64le(&mut v, 44); // size of the rest of this record
    u16le(&mut v, 0x031e); // made by: Unix, spec 3.0
    u16le(&mut v, 45); // needed: zip64
    u32le(&mut v, 0);
    u32le(&mut v, 0);
    u64le(&mut v, entries);
    u64le(&mut v, entries);
    u64le(&mut v, cd_size);
    u64le(&mut v, cd_offset);
    u32le(&mut v, 0x0706_4b50);
    u32le(&mut v, 0);
    u64le(&mut v, cd_offset + cd_size); // where the zip64 end record starts
    u32le(&mut v, 1);
    u32le(&mut v, 0x0605_4b50);
    u32le(&mut v, 0);
    u16le(&mut v, entries.min(0xFFFF) as u16);
    u16le(&mut v, entries.min(0xFFFF) as u16);
    u32le(&mut v, cd_size.min(MAX32) as u32);
    u32le(&mut v, cd_offset.min(MAX32) as u32);
    u16le(&mut v, 0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
    }

    // Expected bytes below were read out of archives written by torch 2.11 `torch.save`.

    #[test]
    fn small_entry_matches_torch() {
        let h = local_header("s/data/0", 726, 24);
        assert_eq!(
            h[..30],
            hex("50 4b 03 04 00 00 08 08 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 08 00 04 00")
        );
        assert_eq!(h[30..], *b"s/data/0FB\0\0");
        assert_eq!(726 + h.len() as u64, 768);
        let h = local_header("s/data.pkl", 0, 328);
        assert_eq!(h.len(), 64);
        assert_eq!(h[40..44], *b"FB\x14\0");
        assert_eq!(data_descriptor(726, 24, 0x91e7_9017), hex("50 4b 07 08 17 90 e7 91 18 00 00 00 18 00 00 00"));
        let c = central_header("s/data/0", 726, 24, 0x91e7_9017);
        let want = hex(
            "50 4b 01 02 00 00 00 00 08 08 00 00 00 00 00 00 17 90 e7 91 18 00 00 00 18 00 00 00 08 00 00 00 00 00 00 00 00 00 00 00 00 00 d6 02 00 00",
        );
        assert_eq!(c[..46], want);
    }

    #[test]
    fn zip64_entries_match_torch() {
        // A 2^32 + 64 byte record at offset 928.
        let h = local_header("big/data/1", 928, (1 << 32) + 64);
        assert_eq!(h[26..30], hex("0a 00 38 00"));
        assert_eq!(h[40..64], hex("01 00 10 00 40 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 46 42 20 00"));
        let d = data_descriptor(928, (1 << 32) + 64, 0x1dcd_f777);
        assert_eq!(d, hex("50 4b 07 08 77 f7 cd 1d 40 00 00 00 01 00 00 00 40 00 00 00 01 00 00 00"));
        let c = central_header("big/data/1", 928, (1 << 32) + 64, 0x1dcd_f777);
        assert_eq!(c[16..32], hex("77 f7 cd 1d ff ff ff ff ff ff ff ff 0a 00 14 00"));
        assert_eq!(c[42..46], hex("a0 03 00 00"));
        assert_eq!(c[56..], hex("01 00 10 00 40 00 00 00 01 00 00 00 40 00 00 00 01 00 00 00"));
        // A 12-byte record whose header lies past 4 GiB.
        let h = local_header("big/data/2", 0x1_0000_0458, 12);
        assert_eq!(h[26..52], hex("0a 00 40 00 62 69 67 2f 64 61 74 61 2f 32 01 00 08 00 58 04 00 00 01 00 00 00"));
        assert_eq!(h[52..56], *b"FB\x30\0");
        assert_eq!(
            data_descriptor(0x1_0000_0458, 12, 0x8b68_dcb1)[8..],
            hex("0c 00 00 00 00 00 00 00 0c 00 00 00 00 00 00 00")
        );
        let c = central_header("big/data/2", 0x1_0000_0458, 12, 0x8b68_dcb1);
        assert_eq!(c[42..46], hex("ff ff ff ff"));
        assert_eq!(c[56..], hex("01 00 08 00 58 04 00 00 01 00 00 00"));
    }

    #[test]
    fn end_records_match_torch() {
        let e = end_records(9, 0x1_0000_0600, 0x25b);
        let want =
            hex("50 4b 06 06 2c 00 00 00 00 00 00 00 1e 03 2d 00 00 00 00 00 00 00 00 00 09 00 00 00 00 00 00 00 \
             09 00 00 00 00 00 00 00 5b 02 00 00 00 00 00 00 00 06 00 00 01 00 00 00 50 4b 06 07 00 00 00 00 \
             5b 08 00 00 01 00 00 00 01 00 00 00 50 4b 05 06 00 00 00 00 09 00 09 00 5b 02 00 00 ff ff ff ff 00 00");
        assert_eq!(e, want);
    }
}
