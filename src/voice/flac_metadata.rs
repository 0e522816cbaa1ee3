//! A check of a FLAC file's comment and picture blocks before symphonia reads them: symphonia
//! 0.5.5 allocates each comment, media type, description and picture at the length the file
//! declares (`vec![0; len]`), before reading it and without comparing it to the block that
//! holds it. A 79-byte upload declaring a 2.2 GB comment, and another declaring a 3.1 GB
//! picture, made it allocate that much (found by fuzzing: `fuzz/seeds/voice_clip/flac-*`); a
//! failed allocation would abort the server. Every length inside such a block must fit in the
//! block, whose own length is at most 16 MiB (24 bits), so nothing can ask for more.
//!
//! This names the fault for the common case; it is not the guarantee. Other paths reach the
//! same readers (Ogg packets, a base64 picture inside a comment, a `fLaC` after other bytes) and
//! other demuxers allocate declared sizes too: the server decodes clients' clips in a child
//! process under a memory limit (`super::isolated`), which contains them all.

const MAGIC: &[u8; 4] = b"fLaC";
const VORBIS_COMMENT: u8 = 4;
const PICTURE: u8 = 6;

/// `Err` with a reason when `bytes` is a FLAC stream (it starts `fLaC`) one of whose comment or
/// picture blocks declares a field longer than the block. Anything else (other formats, other
/// blocks, a truncated file) is left to the decoder.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let Some(mut rest) = bytes.strip_prefix(MAGIC) else { return Ok(()) };
    while let [flags, l0, l1, l2, tail @ ..] = rest {
        let len = usize::from(*l0) << 16 | usize::from(*l1) << 8 | usize::from(*l2);
        let block = Fields { block: &tail[..len.min(tail.len())], len, at: 0 };
        let fits = match flags & 0x7f {
            VORBIS_COMMENT => block.comments_fit(),
            PICTURE => block.picture_fits(),
            _ => true,
        };
        if !fits {
            return Err(String::from("a FLAC metadata block declares more bytes than it holds"));
        }
        if flags & 0x80 != 0 || len > tail.len() {
            break;
        }
        rest = &tail[len..];
    }
    Ok(())
}

/// Why a field could not be read: it runs past the block's declared length (the block lies),
/// or past the bytes present (a truncated file: the decoder's to refuse).
enum Short {
    Declared,
    Present,
}

/// A block of `len` declared bytes (`block`: those of them present) read field by field.
struct Fields<'a> {
    block: &'a [u8],
    len: usize,
    at: usize,
}

impl Fields<'_> {
    /// Skips `n` bytes.
    fn skip(&mut self, n: usize) -> Result<(), Short> {
        self.at = self.at.checked_add(n).filter(|&end| end <= self.len).ok_or(Short::Declared)?;
        Ok(())
    }

    /// A u32, `big` or little endian.
    fn u32(&mut self, big: bool) -> Result<usize, Short> {
        let from = self.at;
        self.skip(4)?;
        let b: [u8; 4] = self.block.get(from..from + 4).ok_or(Short::Present)?.try_into().expect("4 bytes");
        Ok((if big { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }) as usize)
    }

    /// A length-prefixed field.
    fn sized(&mut self, big: bool) -> Result<(), Short> {
        let n = self.u32(big)?;
        self.skip(n)
    }

    /// Whether a walk over the fields found none running past the declared length.
    fn fits(mut self, walk: impl FnOnce(&mut Self) -> Result<(), Short>) -> bool {
        !matches!(walk(&mut self), Err(Short::Declared))
    }

    /// Vorbis comments: a vendor string, a count, then each comment (lengths little-endian).
    fn comments_fit(self) -> bool {
        self.fits(|f| {
            f.sized(false)?;
            for _ in 0..f.u32(false)? {
                f.sized(false)?;
            }
            Ok(())
        })
    }

    /// A picture: type, media type, description, width, height, depth, colours, then the data
    /// (big-endian).
    fn picture_fits(self) -> bool {
        self.fits(|f| {
            f.u32(true)?;
            f.sized(true)?;
            f.sized(true)?;
            for _ in 0..4 {
                f.u32(true)?;
            }
            f.sized(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FLAC header with one Vorbis comment block of `declared` bytes holding `body`.
    fn flac_with_comments(declared: usize, body: &[u8]) -> Vec<u8> {
        flac_with(VORBIS_COMMENT, declared, body)
    }

    fn flac_with(kind: u8, declared: usize, body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(0x80 | kind);
        out.extend_from_slice(&(declared as u32).to_be_bytes()[1..]);
        out.extend_from_slice(body);
        out
    }

    fn comments(vendor: &[u8], entries: &[&[u8]], lie: Option<u32>) -> Vec<u8> {
        let mut b = (vendor.len() as u32).to_le_bytes().to_vec();
        b.extend_from_slice(vendor);
        b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (i, e) in entries.iter().enumerate() {
            let len = if i + 1 == entries.len() { lie.unwrap_or(e.len() as u32) } else { e.len() as u32 };
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(e);
        }
        b
    }

    #[test]
    fn comments_that_fit_their_block_pass_and_a_lying_length_is_refused() {
        let honest = comments(b"Lavf", &[b"TITLE=x", b"ARTIST=y"], None);
        assert_eq!(check(&flac_with_comments(honest.len(), &honest)), Ok(()));
        let lying = comments(b"Lavf", &[b"TITLE=x", b"ARTIST=y"], Some(2_230_583_040));
        assert!(check(&flac_with_comments(lying.len(), &lying)).is_err());
        // A vendor string or a count past the block's end.
        let mut vendor = honest.clone();
        vendor[..4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(check(&flac_with_comments(honest.len(), &vendor)).is_err());
        let truncated_block = comments(b"Lavf", &[], None);
        assert!(check(&flac_with_comments(truncated_block.len() - 2, &truncated_block)).is_err());
        // Not FLAC, or a FLAC without comments: nothing to say.
        assert_eq!(check(b"RIFF....WAVE"), Ok(()));
        assert_eq!(check(b"fLaC"), Ok(()));
    }

    #[test]
    fn pictures_that_fit_their_block_pass_and_a_lying_length_is_refused() {
        let picture = |data_len: u32| {
            let mut b = 3u32.to_be_bytes().to_vec();
            for field in [&b"image/png"[..], b"cover"] {
                b.extend_from_slice(&(field.len() as u32).to_be_bytes());
                b.extend_from_slice(field);
            }
            for v in [1u32, 1, 24, 0] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            b.extend_from_slice(&data_len.to_be_bytes());
            b.extend_from_slice(&[0x89, b'P', b'N', b'G']);
            b
        };
        let honest = picture(4);
        assert_eq!(check(&flac_with(PICTURE, honest.len(), &honest)), Ok(()));
        let lying = picture(3_124_560_147);
        assert!(check(&flac_with(PICTURE, lying.len(), &lying)).is_err());
    }

    #[test]
    fn the_fuzzers_inputs_are_refused() {
        for input in [
            &include_bytes!("../../fuzz/seeds/voice_clip/flac-comment-2gb")[..],
            &include_bytes!("../../fuzz/seeds/voice_clip/flac-picture-3gb")[..],
        ] {
            assert!(check(&input[1..]).is_err());
        }
    }
}
