//! English text normalisation (issue 15): Drama 3 reads digits and symbols poorly, so numbers,
//! dates, times, currencies, percentages and common units are written out as words before the
//! prompt is built. On by default; a request turns it off with `"normalize": false`.
//!
//! What it covers (`docs/api.md` lists it for clients):
//! - integers (`1,234` → one thousand two hundred and thirty-four; `-7` → minus seven),
//!   decimals (`3.14` → three point one four), ordinals (`21st` → twenty-first);
//! - years: a bare four-digit number from 1100 to 2099 (`1999` → nineteen ninety-nine);
//! - ISO dates (`2026-12-04` → December fourth, twenty twenty-six);
//! - times (`3:30` → three thirty, `10:05 pm` → ten oh five PM, `7:00` → seven o'clock);
//! - currencies `$ € £ ¥` before an amount (`$5.20` → five dollars and twenty cents);
//! - percentages (`50%` → fifty percent) and a table of units after a number (`5 km`, `20°C`).
//!
//! Numbers become words as the `num2words` crate words them (`number_words`). Tags and directions
//! (`<|…|>`, `[…]`, `<tag>`/`</tag>`) are never touched; anything not recognised is left as it is.

use super::number_words::{cardinal, ordinal, year};

use super::text::markup_len;

/// `text` with numbers and symbols written out (tags and directions untouched).
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    let mut plain = 0;
    let mut i = 0;
    while i < text.len() {
        if let Some(len) = markup_len(&text[i..]) {
            out.push_str(&normalize_plain(&text[plain..i]));
            out.push_str(&text[i..i + len]);
            i += len;
            plain = i;
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out.push_str(&normalize_plain(&text[plain..]));
    out
}

/// Normalises text with no protected span in it: each recognised token is rewritten in place.
fn normalize_plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let at_word_start = out.chars().last().is_none_or(|c| !(c.is_alphanumeric() || GLUE.contains(&c)));
        if at_word_start && let Some((words, len)) = rewrite(rest) {
            out.push_str(&words);
            rest = &rest[len..];
            continue;
        }
        let c = rest.chars().next().expect("rest is not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A recognised token at the start of `s` (which starts a word): its words and its length.
fn rewrite(s: &str) -> Option<(String, usize)> {
    if let Some(hit) = currency(s).or_else(|| date(s)).or_else(|| time(s)) {
        return Some(hit);
    }
    let (negative, body) = match s.strip_prefix('-') {
        Some(body) if body.starts_with(|c: char| c.is_ascii_digit()) => (true, body),
        _ => (false, s),
    };
    let (number, len) = number_at(body)?;
    let mut used = len + usize::from(negative);
    let after = &s[used..];
    // Part of a larger numeric shape (a version, an address, a range, a ratio): left as written.
    if glued(after) {
        return None;
    }
    // Not part of a longer alphanumeric run (e.g. "A4", "mp3", "3rd" is handled below).
    if let Some(suffix) = ["st", "nd", "rd", "th"].into_iter().find(|x| starts_word(after, x))
        && !negative
        && let Some(n) = number.integer()
    {
        let words = ordinal(n);
        return Some((words, used + suffix.len()));
    }
    if after.starts_with(|c: char| c.is_alphanumeric()) && unit_at(after).is_none() {
        return None;
    }
    let mut words = if negative { String::from("minus ") } else { String::new() };
    let year = !negative && number.is_year() && !after.starts_with('%') && unit_at(after).is_none();
    words.push_str(&if year { year_words(number.integer()?)? } else { number.words()? });
    if after.starts_with('%') {
        words.push_str(" percent");
        used += 1;
    } else if let Some((unit, len)) = unit_at(after) {
        words.push(' ');
        words.push_str(if number.is_one() { unit.singular } else { unit.plural });
        used += len;
    }
    Some((words, used))
}

/// Characters that glue a number to what precedes or follows it into one shape.
const GLUE: [char; 6] = ['.', ':', '/', '-', '_', ','];

/// Whether `s` continues a number into a larger shape: glue followed by a digit or a letter.
fn glued(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| GLUE.contains(&c)) && chars.next().is_some_and(char::is_alphanumeric)
}

/// Whether `s` starts with `word` followed by something that is not a letter or digit.
fn starts_word(s: &str, word: &str) -> bool {
    s.strip_prefix(word).is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric()))
}

/// A number as written: its integer digits (separators removed) and its fraction digits.
#[derive(Debug)]
struct Number {
    integer: String,
    fraction: Option<String>,
    /// Written with thousands separators (then never a year).
    grouped: bool,
}

impl Number {
    fn integer(&self) -> Option<i64> {
        if self.fraction.is_some() { None } else { self.integer.parse().ok() }
    }

    fn is_year(&self) -> bool {
        !self.grouped && self.integer.len() == 4 && self.integer().is_some_and(|n| (1100..2100).contains(&n))
    }

    fn is_one(&self) -> bool {
        self.integer() == Some(1)
    }

    fn words(&self) -> Option<String> {
        let whole: i64 = self.integer.parse().ok()?;
        let mut words = cardinal(whole);
        if let Some(fraction) = &self.fraction {
            words.push_str(" point");
            for d in fraction.chars() {
                words.push(' ');
                words.push_str(DIGITS[d.to_digit(10)? as usize]);
            }
        }
        Some(words)
    }
}

const DIGITS: [&str; 10] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];

/// A number at the start of `s`: digits with optional `,` thousands groups and one `.`
/// fraction (a `.` or `,` not followed by a digit ends it). At most 15 integer digits.
fn number_at(s: &str) -> Option<(Number, usize)> {
    let digits = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    let first = digits(s);
    if first == 0 || first > 15 {
        return None;
    }
    let (mut integer, mut len, mut grouped) = (s[..first].to_owned(), first, false);
    while first <= 3 && s[len..].starts_with(',') && digits(&s[len + 1..]) == 3 {
        integer.push_str(&s[len + 1..len + 4]);
        len += 4;
        grouped = true;
    }
    if integer.len() > 15 {
        return None;
    }
    let mut fraction = None;
    if s[len..].starts_with('.') {
        let n = digits(&s[len + 1..]);
        if n > 0 {
            fraction = Some(s[len + 1..len + 1 + n].to_owned());
            len += 1 + n;
        }
    }
    Some((Number { integer, fraction, grouped }, len))
}

/// A year's words: "nineteen ninety-nine", "two thousand and five", "twenty twenty-six".
fn year_words(value: i64) -> Option<String> {
    Some(year(value))
}

/// `$5`, `$5.20`, `€1,000`, `£0.99`, `¥500` at the start of `s`.
fn currency(s: &str) -> Option<(String, usize)> {
    let symbol = s.chars().next()?;
    let (one, many, cent, cents) = match symbol {
        '$' => ("dollar", "dollars", "cent", "cents"),
        '€' => ("euro", "euros", "cent", "cents"),
        '£' => ("pound", "pounds", "penny", "pence"),
        '¥' => ("yen", "yen", "", ""),
        _ => return None,
    };
    let (number, len) = number_at(&s[symbol.len_utf8()..])?;
    let whole: i64 = number.integer.parse().ok()?;
    let mut words = cardinal(whole);
    words.push(' ');
    words.push_str(if whole == 1 { one } else { many });
    match number.fraction.as_deref() {
        None => {}
        Some(f) if f.len() == 2 && !cent.is_empty() => {
            let minor: i64 = f.parse().ok()?;
            if minor > 0 {
                let minor_words = cardinal(minor);
                words = if whole == 0 { String::new() } else { format!("{words} and ") };
                words.push_str(&minor_words);
                words.push(' ');
                words.push_str(if minor == 1 { cent } else { cents });
            }
        }
        Some(_) => return None,
    }
    Some((words, symbol.len_utf8() + len))
}

/// An ISO date `YYYY-MM-DD` at the start of `s`.
fn date(s: &str) -> Option<(String, usize)> {
    let b = s.as_bytes();
    let shape = b.len() >= 10
        && b[..10].iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    if !shape || s[10..].starts_with(|c: char| c.is_alphanumeric()) {
        return None;
    }
    let (year, month, day): (i64, usize, i64) = (s[..4].parse().ok()?, s[5..7].parse().ok()?, s[8..10].parse().ok()?);
    let name = *MONTHS.get(month.checked_sub(1)?)?;
    if !(1..=31).contains(&day) {
        return None;
    }
    let words = format!("{name} {}, {}", ordinal(day), year_words(year)?);
    Some((words, 10))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `H:MM` or `HH:MM`, optionally followed by `am`/`pm` (with or without a space or dots).
fn time(s: &str) -> Option<(String, usize)> {
    let hours = s.bytes().take_while(u8::is_ascii_digit).count();
    if !(1..=2).contains(&hours) || !s[hours..].starts_with(':') {
        return None;
    }
    let minutes = &s[hours + 1..];
    if minutes.len() < 2 || !minutes.as_bytes()[..2].iter().all(u8::is_ascii_digit) {
        return None;
    }
    if minutes[2..].starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (h, m): (i64, i64) = (s[..hours].parse().ok()?, minutes[..2].parse().ok()?);
    if h > 23 || m > 59 {
        return None;
    }
    let mut len = hours + 3;
    let mut words = cardinal(h);
    match m {
        0 => words.push_str(" o'clock"),
        1..=9 => words.push_str(&format!(" oh {}", DIGITS[m as usize])),
        _ => words.push_str(&format!(" {}", cardinal(m))),
    }
    let after = &s[len..];
    let spaced = after.strip_prefix(' ').unwrap_or(after);
    for (marker, spoken) in [("a.m.", "AM"), ("p.m.", "PM"), ("am", "AM"), ("pm", "PM"), ("AM", "AM"), ("PM", "PM")] {
        if starts_word(spaced, marker) || (marker.ends_with('.') && spaced.starts_with(marker)) {
            if m == 0 {
                words.truncate(words.len() - " o'clock".len());
            }
            words.push(' ');
            words.push_str(spoken);
            len += (after.len() - spaced.len()) + marker.len();
            break;
        }
    }
    if s[len..].starts_with(|c: char| c.is_alphanumeric()) {
        return None;
    }
    Some((words, len))
}

/// A unit the normaliser spells out after a number.
struct Unit {
    symbol: &'static str,
    singular: &'static str,
    plural: &'static str,
}

const UNITS: [Unit; 22] = [
    Unit { symbol: "km/h", singular: "kilometer per hour", plural: "kilometers per hour" },
    Unit { symbol: "mph", singular: "mile per hour", plural: "miles per hour" },
    Unit { symbol: "km", singular: "kilometer", plural: "kilometers" },
    Unit { symbol: "cm", singular: "centimeter", plural: "centimeters" },
    Unit { symbol: "mm", singular: "millimeter", plural: "millimeters" },
    Unit { symbol: "m", singular: "meter", plural: "meters" },
    Unit { symbol: "kg", singular: "kilogram", plural: "kilograms" },
    Unit { symbol: "mg", singular: "milligram", plural: "milligrams" },
    Unit { symbol: "g", singular: "gram", plural: "grams" },
    Unit { symbol: "lbs", singular: "pound", plural: "pounds" },
    Unit { symbol: "lb", singular: "pound", plural: "pounds" },
    Unit { symbol: "ml", singular: "milliliter", plural: "milliliters" },
    Unit { symbol: "mi", singular: "mile", plural: "miles" },
    Unit { symbol: "ft", singular: "foot", plural: "feet" },
    Unit { symbol: "°C", singular: "degree Celsius", plural: "degrees Celsius" },
    Unit { symbol: "°F", singular: "degree Fahrenheit", plural: "degrees Fahrenheit" },
    Unit { symbol: "TB", singular: "terabyte", plural: "terabytes" },
    Unit { symbol: "GB", singular: "gigabyte", plural: "gigabytes" },
    Unit { symbol: "MB", singular: "megabyte", plural: "megabytes" },
    Unit { symbol: "KB", singular: "kilobyte", plural: "kilobytes" },
    Unit { symbol: "ms", singular: "millisecond", plural: "milliseconds" },
    Unit { symbol: "Hz", singular: "hertz", plural: "hertz" },
];

/// A unit right after a number (one optional space), ending a word: the unit and the length
/// taken (the space included).
fn unit_at(s: &str) -> Option<(&'static Unit, usize)> {
    let spaced = s.strip_prefix(' ').unwrap_or(s);
    let unit = UNITS.iter().find(|u| starts_word(spaced, u.symbol))?;
    Some((unit, s.len() - spaced.len() + unit.symbol.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_dates_times_money_and_units() {
        let cases = [
            ("I have 3 cats.", "I have three cats."),
            ("It costs $5.20 today", "It costs five dollars and twenty cents today"),
            ("£0.99 and €1 and ¥500", "ninety-nine pence and one euro and five hundred yen"),
            ("about 1,234 people", "about one thousand two hundred and thirty-four people"),
            ("pi is 3.14", "pi is three point one four"),
            ("it was -7 outside", "it was minus seven outside"),
            ("the 21st century", "the twenty-first century"),
            ("in 1999 and 2026", "in nineteen ninety-nine and twenty twenty-six"),
            ("on 2026-12-04.", "on December fourth, twenty twenty-six."),
            ("at 3:30, then 10:05 pm, then 7:00", "at three thirty, then ten oh five PM, then seven o'clock"),
            ("at 7:00am sharp", "at seven AM sharp"),
            ("50% off", "fifty percent off"),
            ("a 5 km run at 20°C", "a five kilometers run at twenty degrees Celsius"),
            ("1 kg of flour", "one kilogram of flour"),
            ("no digits here", "no digits here"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input), want, "{input}");
        }
    }

    #[test]
    fn tags_directions_and_codes_are_left_alone() {
        assert_eq!(
            normalize("<|speaker:1|> [sighs 2 times] <whisper>5 cats</whisper>"),
            "<|speaker:1|> [sighs 2 times] <whisper>five cats</whisper>"
        );
        // Digits inside words, versions and unknown shapes stay as written.
        for kept in ["mp3 files", "A4 paper", "v2.1b", "12:345", "99:99", "x86_64"] {
            assert_eq!(normalize(kept), kept, "{kept}");
        }
    }
}
