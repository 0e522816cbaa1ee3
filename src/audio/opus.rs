//! `opus`: mono Opus in an Ogg stream (RFC 7845), encoded with the pure-Rust `opus-rs` and
//! paged with the `ogg` crate; the OpusHead and OpusTags headers and the granule positions are
//! written here.
//!
//! Packets are 20 ms. The encoder looks [`PRE_SKIP`] samples ahead, so the stream starts with
//! that much priming (OpusHead's pre-skip tells decoders to drop it) and the input is padded
//! with silence until the last real sample is inside a packet; the last page's granule
//! position then tells decoders where the real audio ends. Granule positions count 48 kHz
//! samples whatever rate the encoder runs at.
//!
//! When streaming, every push ends an Ogg page, so a client gets each push's audio at once; the
//! page boundaries, and so the bytes, then depend on the chunking (the packets do not). A whole
//! response (`stream: false`) lets pages fill up, so its bytes do not. The newest packet is
//! always held back, because the last one must go on a page flagged end-of-stream and only
//! [`Writer::finish`] knows which one is last.

use ogg::{PacketWriteEndInfo, PacketWriter};
use opus_rs::{Application, OpusEncoder};

use super::chain::Writer;
use super::{AudioError, ResponseFormat};

/// The encoder's look-ahead in 48 kHz samples (2.5 ms + 4 ms, as libopus at every rate).
const PRE_SKIP: u16 = 312;

/// Packets per second (20 ms packets).
const PACKETS_PER_SECOND: u32 = 50;

/// Opus's granule clock.
const GRANULE_RATE: u64 = 48_000;

/// Transparent for mono speech at 48 kHz; Opus spends less where the band is narrower.
const BITRATE: i32 = 64_000;

/// The logical stream's serial number: fixed, so equal audio gives equal bytes.
const SERIAL: u32 = 0x4c49_4d45; // "LIME"

/// The largest packet Opus makes (RFC 6716 §3.2.1), with room to spare.
const MAX_PACKET: usize = 1500;

pub(super) struct OggOpusWriter {
    encoder: OpusEncoder,
    sample_rate: u32,
    streaming: bool,
    ogg: PacketWriter<'static, Vec<u8>>,
    headers_sent: bool,
    /// Samples waiting for a whole packet.
    pending: Vec<f32>,
    /// The newest packet, not yet paged.
    held: Option<Vec<u8>>,
    /// Packets made so far, including `held`.
    packets: u64,
    /// Real (not padding) samples taken so far, at `sample_rate`.
    samples: u64,
}

impl OggOpusWriter {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Result<Self, AudioError> {
        let rate = i32::try_from(sample_rate).map_err(|e| AudioError::codec(ResponseFormat::Opus, e))?;
        let mut encoder =
            OpusEncoder::new(rate, 1, Application::Audio).map_err(|e| AudioError::codec(ResponseFormat::Opus, e))?;
        encoder.bitrate_bps = BITRATE;
        Ok(Self {
            encoder,
            sample_rate,
            streaming,
            ogg: PacketWriter::new(Vec::new()),
            headers_sent: false,
            pending: Vec::new(),
            held: None,
            packets: 0,
            samples: 0,
        })
    }

    fn frame_len(&self) -> usize {
        (self.sample_rate / PACKETS_PER_SECOND) as usize
    }

    /// Granule position after `packets` packets: every packet is 20 ms of 48 kHz samples.
    fn granule_after(packets: u64) -> u64 {
        packets * GRANULE_RATE / u64::from(PACKETS_PER_SECOND)
    }

    /// Pages a packet; `end` says how its page ends.
    fn page(&mut self, packet: Vec<u8>, end: PacketWriteEndInfo, granule: u64) -> Result<(), AudioError> {
        self.ogg.write_packet(packet, SERIAL, end, granule).map_err(|e| AudioError::codec(ResponseFormat::Opus, e))
    }

    fn send_headers(&mut self) -> Result<(), AudioError> {
        if !self.headers_sent {
            self.headers_sent = true;
            // Each header on a page of its own, as RFC 7845 §3 requires.
            self.page(opus_head(self.sample_rate), PacketWriteEndInfo::EndPage, 0)?;
            self.page(opus_tags(), PacketWriteEndInfo::EndPage, 0)?;
        }
        Ok(())
    }

    /// Encodes one packet from the first `frame_len` samples of `pending`, pages the one held
    /// before it, and holds the new one.
    fn encode_packet(&mut self, page_end: PacketWriteEndInfo) -> Result<(), AudioError> {
        let n = self.frame_len();
        let mut packet = vec![0u8; MAX_PACKET];
        let len = self
            .encoder
            .encode(&self.pending[..n], n, &mut packet)
            .map_err(|e| AudioError::codec(ResponseFormat::Opus, e))?;
        packet.truncate(len);
        self.pending.drain(..n);
        if let Some(prev) = self.held.replace(packet) {
            self.page(prev, page_end, Self::granule_after(self.packets))?;
        }
        self.packets += 1;
        Ok(())
    }

    /// Moves the finished pages out of the Ogg writer.
    fn take_pages(&mut self, out: &mut Vec<u8>) {
        out.append(self.ogg.inner_mut());
    }
}

impl Writer for OggOpusWriter {
    fn write(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        self.send_headers()?;
        self.samples += pcm.len() as u64;
        self.pending.extend_from_slice(pcm);
        let n = self.frame_len();
        while self.pending.len() >= n {
            // When streaming, the packet paged by the last encode of this push closes the page.
            let last = self.pending.len() < 2 * n;
            let end =
                if self.streaming && last { PacketWriteEndInfo::EndPage } else { PacketWriteEndInfo::NormalPacket };
            self.encode_packet(end)?;
        }
        self.take_pages(out);
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        self.send_headers()?;
        // Pad until the packets cover the priming plus every real sample.
        let n = self.frame_len() as u64;
        let pre_skip = u64::from(PRE_SKIP) * u64::from(self.sample_rate) / GRANULE_RATE;
        let needed = self.samples + pre_skip;
        while self.packets * n < needed {
            self.pending.resize(n as usize, 0.0);
            self.encode_packet(PacketWriteEndInfo::NormalPacket)?;
        }
        // The end-trimming granule: priming plus the real samples, in 48 kHz units.
        let last_granule = u64::from(PRE_SKIP) + self.samples * GRANULE_RATE / u64::from(self.sample_rate);
        let last = self.held.take().expect("at least one packet was made");
        self.page(last, PacketWriteEndInfo::EndStream, last_granule)?;
        self.take_pages(out);
        Ok(())
    }
}

/// The identification header (RFC 7845 §5.1): mono, channel mapping family 0.
fn opus_head(sample_rate: u32) -> Vec<u8> {
    let mut h = b"OpusHead".to_vec();
    h.push(1); // version
    h.push(1); // channels
    h.extend_from_slice(&PRE_SKIP.to_le_bytes());
    // The rate the audio was encoded at; informational, Opus always decodes at 48 kHz.
    h.extend_from_slice(&sample_rate.to_le_bytes());
    h.extend_from_slice(&0i16.to_le_bytes()); // output gain
    h.push(0); // mapping family
    h
}

/// The comment header (RFC 7845 §5.2): a vendor string and no comments.
fn opus_tags() -> Vec<u8> {
    let vendor = b"limelight";
    let mut h = b"OpusTags".to_vec();
    h.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
    h.extend_from_slice(vendor);
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(pcm: &[f32], chunk: usize) -> Vec<u8> {
        let mut w = Box::new(OggOpusWriter::new(48_000, true).unwrap());
        let mut out = Vec::new();
        for c in pcm.chunks(chunk) {
            w.write(c, &mut out).unwrap();
        }
        w.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn head_bytes() {
        assert_eq!(
            opus_head(48_000),
            [b'O', b'p', b'u', b's', b'H', b'e', b'a', b'd', 1, 1, 0x38, 0x01, 0x80, 0xbb, 0x00, 0x00, 0, 0, 0]
        );
        assert_eq!(opus_tags()[8..12], [9, 0, 0, 0]);
    }

    /// Reads the stream back: headers first, then packets whose pages' granule positions
    /// grow by 960 per packet and end at pre-skip plus the input length.
    #[test]
    fn pages_carry_headers_granules_and_end_of_stream() {
        let pcm: Vec<f32> = (0..30_000).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
        let bytes = encode(&pcm, 4096);
        let mut reader = ogg::PacketReader::new(std::io::Cursor::new(&bytes));
        let head = reader.read_packet().unwrap().unwrap();
        assert_eq!(head.data, opus_head(48_000));
        assert!(head.first_in_stream() && head.last_in_page());
        let tags = reader.read_packet().unwrap().unwrap();
        assert!(tags.data.starts_with(b"OpusTags") && tags.last_in_page());
        let mut packets = 0u64;
        let mut last = None;
        while let Some(p) = reader.read_packet().unwrap() {
            packets += 1;
            assert_eq!(p.stream_serial(), SERIAL);
            if p.last_in_page() && !p.last_in_stream() {
                assert_eq!(p.absgp_page(), packets * 960);
            }
            last = Some(p);
        }
        let last = last.unwrap();
        assert!(last.last_in_stream());
        assert_eq!(last.absgp_page(), 312 + 30_000);
        // Enough packets for priming plus input, and no more.
        assert_eq!(packets, (312 + 30_000u64).div_ceil(960));
    }

    #[test]
    fn same_chunking_gives_same_bytes() {
        let pcm: Vec<f32> = (0..20_000).map(|i| (i as f32 * 0.07).sin() * 0.3).collect();
        assert_eq!(encode(&pcm, 2048), encode(&pcm, 2048));
        assert_eq!(encode(&[], 1), encode(&[], 1));
    }
}
