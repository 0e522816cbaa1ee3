//! A check of a FLAC file's Vorbis comment blocks before symphonia reads them: symphonia 0.5.5
//! allocates each comment at the length the file declares (`vec![0; len]`), before reading it
//! and without comparing it to the block that holds it. A 79-byte upload declaring a 2.2 GB
//! comment made it allocate 2.2 GB (found by fuzzing, `fuzz/seeds/voice_clip/flac-comment-2gb`);
//! a failed allocation would abort the server. Every length inside a comment block must fit in
//! the block, whose own length is at most 16 MiB (24 bits), so no comment can ask for more.

const MAGIC: &[u8; 4] = b"fLaC";
const VORBIS_COMMENT: u8 = 4;

/// `Err` with a reason when `bytes` is a FLAC stream (it starts `fLaC`) one of whose Vorbis
/// comment blocks declares a vendor string, a comment count or a comment longer than the block.
/// Anything else (other formats, other blocks, a truncated file) is left to the decoder.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let Some(mut rest) = bytes.strip_prefix(MAGIC) else { return Ok(()) };
    while let [flags, l0, l1, l2, tail @ ..] = rest {
        let len = usize::from(*l0) << 16 | usize::from(*l1) << 8 | usize::from(*l2);
        let block = &tail[..len.min(tail.len())];
        if flags & 0x7f == VORBIS_COMMENT && !comments_fit(block, len) {
            return Err(String::from("a FLAC comment block declares more bytes than it holds"));
        }
        if flags & 0x80 != 0 || len > tail.len() {
            break;
        }
        rest = &tail[len..];
    }
    Ok(())
}

/// Whether every length in a Vorbis comment block of `len` declared bytes (`block`: those of
/// them present) fits in `len`: the vendor string, then a count of comments, each a length and
/// its bytes, all lengths little-endian u32.
fn comments_fit(block: &[u8], len: usize) -> bool {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<usize> {
        let end = at.checked_add(n).filter(|&end| end <= len)?;
        at = end;
        Some(end)
    };
    let read_u32 = |block: &[u8], from: usize| -> Option<usize> {
        let b = block.get(from..from + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let Some(vendor_end) = take(4) else { return true };
    let Some(vendor) = read_u32(block, vendor_end - 4) else { return true };
    if take(vendor).is_none() {
        return false;
    }
    let Some(count_end) = take(4) else { return false };
    let Some(count) = read_u32(block, count_end - 4) else { return true };
    for _ in 0..count {
        let Some(len_end) = take(4) else { return false };
        let Some(comment) = read_u32(block, len_end - 4) else { return true };
        if take(comment).is_none() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FLAC header with one Vorbis comment block of `declared` bytes holding `body`.
    fn flac_with_comments(declared: usize, body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(0x80 | VORBIS_COMMENT);
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
    fn the_fuzzers_input_is_refused() {
        let input = include_bytes!("../../fuzz/seeds/voice_clip/flac-comment-2gb");
        assert!(check(&input[1..]).is_err());
    }
}
