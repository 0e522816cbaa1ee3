//! Frame rows, the unit the whole model works in (`model.md` §5): every sequence position is
//! `[token_id, c0, c1, …, c9]`. Text rows carry zeros for the codes; audio rows carry
//! `c0 + semantic_start` as their token and the ten codes.

/// `T` rows of width `1 + codebooks`, row-major.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rows {
    codebooks: usize,
    data: Vec<u32>,
}

impl Rows {
    pub fn new(codebooks: usize) -> Rows {
        Rows { codebooks, data: Vec::new() }
    }

    /// Rows from a flat row-major buffer of width `1 + codebooks`.
    pub fn from_flat(codebooks: usize, data: Vec<u32>) -> Rows {
        assert_eq!(data.len() % (codebooks + 1), 0, "rows must be whole");
        Rows { codebooks, data }
    }

    pub fn codebooks(&self) -> usize {
        self.codebooks
    }

    pub fn width(&self) -> usize {
        self.codebooks + 1
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.width()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn row(&self, t: usize) -> &[u32] {
        &self.data[t * self.width()..(t + 1) * self.width()]
    }

    pub fn token(&self, t: usize) -> u32 {
        self.row(t)[0]
    }

    /// Code `c_i` of row `t` (`i` in `0..codebooks`).
    pub fn code(&self, t: usize, i: usize) -> u32 {
        self.row(t)[1 + i]
    }

    pub fn as_flat(&self) -> &[u32] {
        &self.data
    }

    /// Rows `range` as their own [`Rows`].
    pub fn slice(&self, range: std::ops::Range<usize>) -> Rows {
        let w = self.width();
        Rows::from_flat(self.codebooks(), self.data[range.start * w..range.end * w].to_vec())
    }

    /// Appends a text row `[token, 0, …, 0]`.
    pub fn push_text(&mut self, token: u32) {
        self.data.push(token);
        self.data.extend(std::iter::repeat_n(0, self.codebooks));
    }

    /// Appends an audio row `[c0 + semantic_start, c0, …, c9]`.
    pub fn push_audio(&mut self, semantic_start: u32, codes: &[u32]) {
        assert_eq!(codes.len(), self.codebooks, "one code per codebook");
        self.data.push(semantic_start + codes[0]);
        self.data.extend_from_slice(codes);
    }

    /// Appends a row as given (e.g. a generated frame `[main, c0..c9]`).
    pub fn push_row(&mut self, row: &[u32]) {
        assert_eq!(row.len(), self.width(), "row width");
        self.data.extend_from_slice(row);
    }

    pub fn extend(&mut self, other: &Rows) {
        assert_eq!(other.codebooks, self.codebooks, "rows of different widths");
        self.data.extend_from_slice(&other.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_audio_rows() {
        let mut r = Rows::new(3);
        r.push_text(7);
        r.push_audio(100, &[5, 1, 2]);
        assert_eq!(r.len(), 2);
        assert_eq!(r.row(0), &[7, 0, 0, 0]);
        assert_eq!(r.row(1), &[105, 5, 1, 2]);
        assert_eq!(r.code(1, 2), 2);
    }
}
