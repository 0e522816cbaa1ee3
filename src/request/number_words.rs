//! English words for integers, as the normaliser writes them (`request::normalize`): cardinals
//! ("one thousand two hundred and thirty-four"), ordinals ("twenty-first") and years ("nineteen
//! ninety-nine", "two thousand and five", "nineteen oh-five").
//!
//! The wording is the `num2words` crate's (1.2, English), which the tests hold this module to,
//! number by number. Why not call it: it computes in arbitrary-precision floats, about 28 µs a
//! number on the CI machine, so a 20 000-character script spent 5 ms in it before its first
//! audio (issue 15). This is integer arithmetic.

const UNITS: [&str; 9] = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];
const TEENS: [&str; 10] =
    ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"];
const TENS: [&str; 9] = ["ten", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
/// Names of the powers of a thousand that an `i64` reaches (up to 10¹⁸).
const MEGAS: [&str; 6] = ["thousand", "million", "billion", "trillion", "quadrillion", "quintillion"];

/// "zero", "minus forty-two", "one hundred one", "one thousand and one".
pub fn cardinal(n: i64) -> String {
    if n == 0 {
        return "zero".to_owned();
    }
    let mut words: Vec<String> = Vec::new();
    if n < 0 {
        words.push("minus".to_owned());
    }
    let mut groups = Vec::new();
    let mut rest = n.unsigned_abs();
    while rest > 0 {
        groups.push((rest % 1000) as usize);
        rest /= 1000;
    }
    // "and" comes before the last group's tens and units when an earlier group had tens or
    // units of its own (num2words' rule: so "one hundred one", but "one thousand and one").
    let mut first = true;
    for (i, &group) in groups.iter().enumerate().rev() {
        let (hundreds, tens, units) = (group / 100, group / 10 % 10, group % 10);
        if hundreds > 0 {
            words.push(UNITS[hundreds - 1].to_owned());
            words.push("hundred".to_owned());
        }
        if tens != 0 || units != 0 {
            if i == 0 && !first {
                words.push("and".to_owned());
            } else {
                first = false;
            }
            words.push(match (tens, units) {
                (0, u) => UNITS[u - 1].to_owned(),
                (1, u) => TEENS[u].to_owned(),
                (t, 0) => TENS[t - 1].to_owned(),
                (t, u) => format!("{}-{}", TENS[t - 1], UNITS[u - 1]),
            });
        }
        if i != 0 && group != 0 {
            words.push(MEGAS[i - 1].to_owned());
        }
    }
    words.join(" ")
}

/// "first", "twelfth", "twenty-first", "one hundredth": the cardinal's last word made ordinal
/// (`n` ≥ 0: num2words has no negative ordinals, and the normaliser asks for none).
pub fn ordinal(n: i64) -> String {
    let cardinal = cardinal(n);
    let (head, last) = cardinal.rsplit_once(' ').map_or(("", cardinal.as_str()), |(h, l)| (h, l));
    let (prefix, word) = last.split_once('-').map_or(("", last), |(p, w)| (p, w));
    let ordinal_word = match word {
        "one" => "first".to_owned(),
        "two" => "second".to_owned(),
        "three" => "third".to_owned(),
        "five" => "fifth".to_owned(),
        "eight" => "eighth".to_owned(),
        "nine" => "ninth".to_owned(),
        "twelve" => "twelfth".to_owned(),
        w if w.ends_with('y') => format!("{}ieth", &w[..w.len() - 1]),
        w => format!("{w}th"),
    };
    let hyphen = if prefix.is_empty() { "" } else { "-" };
    let space = if head.is_empty() { "" } else { " " };
    format!("{head}{space}{prefix}{hyphen}{ordinal_word}")
}

/// A year as it is said: "nineteen ninety-nine", "nineteen hundred", "nineteen oh-five", and
/// as a cardinal where that is how it is said ("two thousand and five", "one hundred", 10 000 on).
pub fn year(n: i64) -> String {
    let (years, suffix) = if n < 0 { (n.unsigned_abs(), " BC") } else { (n as u64, "") };
    let (high, low) = (years / 100, years % 100);
    let words = if high == 0 || (high % 10 == 0 && low < 10) || high >= 100 {
        cardinal(years as i64)
    } else {
        let low_words = match low {
            0 => "hundred".to_owned(),
            1..=9 => format!("oh-{}", cardinal(low as i64)),
            _ => cardinal(low as i64),
        };
        format!("{} {low_words}", cardinal(high as i64))
    };
    format!("{words}{suffix}")
}

#[cfg(test)]
mod tests {
    use num2words::Num2Words;

    use super::*;

    /// Every integer to 20 000, then a spread of larger ones (each power of ten ± a little, and a
    /// deterministic scatter up to 10¹⁵, the normaliser's largest), both signs.
    fn numbers() -> Vec<i64> {
        let mut out: Vec<i64> = (0..=20_000).collect();
        let mut p = 1i64;
        for _ in 0..16 {
            for d in [-1, 0, 1, 7, 11, 100, 101] {
                out.push(p + d);
            }
            p *= 10;
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push((x % 1_000_000_000_000_000) as i64 >> (x % 48));
        }
        let negatives: Vec<i64> = out.iter().take(2000).map(|n| -n).collect();
        out.extend(negatives);
        out
    }

    #[test]
    fn cardinals_and_ordinals_are_num2words_word_for_word() {
        for n in numbers() {
            assert_eq!(cardinal(n), Num2Words::new(n).to_words().unwrap(), "cardinal {n}");
            if n >= 0 {
                assert_eq!(ordinal(n), Num2Words::new(n).ordinal().to_words().unwrap(), "ordinal {n}");
            }
        }
    }

    #[test]
    fn years_are_num2words_word_for_word() {
        for n in (-2100..=12_000).chain([99_999, 100_000, 123_456]) {
            assert_eq!(year(n), Num2Words::new(n).year().to_words().unwrap(), "year {n}");
        }
    }
}
