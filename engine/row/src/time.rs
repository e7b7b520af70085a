//! Calendar arithmetic and time-text parsing for Date, Date32, DateTime and
//! DateTime64 columns.
//!
//! Accepted text (see [`parse_datetime`]): RFC 3339 (`2018-02-07T01:26:13.84Z`,
//! `...+05:30`), the ClickHouse form `YYYY-MM-DD HH:MM:SS[.fff]`, a bare date
//! `YYYY-MM-DD`, and user formats compiled by [`TimeFormat`] (a strftime
//! subset: `%Y %m %d %H %M %S %f %z %b %%`). Text without an offset is *naive*:
//! the mapper decides which offset it means (DESIGN: never guess silently).
//!
//! Times are kept as [`ParsedTime`]: wall-clock seconds since 1970-01-01 as
//! written, nanoseconds, and the written offset if any. Digits past the
//! nanosecond are dropped (floor), like ClickHouse's own parser.
//!
//! The calendar is proleptic Gregorian; [`days_from_civil`] and
//! [`civil_from_days`] are the classic era-based conversions (400-year eras
//! of 146097 days), valid for every year in `i32`.

/// Seconds in a day.
pub const SECS_PER_DAY: i64 = 86_400;

/// Days from 1970-01-01 to `year-month-day` (negative before 1970).
/// `month` is 1..=12, `day` 1..=31 (not checked here: see [`valid_date`]).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Shift the year to start in March so the leap day is the year's last.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400; // 0..=399
    let m = i64::from(month);
    let day_of_year = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The `(year, month, day)` of `days` since 1970-01-01 (inverse of
/// [`days_from_civil`]).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097; // 0..=146096
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Whether `year-month-day` exists in the Gregorian calendar.
pub fn valid_date(year: i64, month: u32, day: u32) -> bool {
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days_in_month).contains(&day)
}

/// A time as written in text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedTime {
    /// Seconds since 1970-01-01 00:00:00 of the wall-clock time as written
    /// (before applying any offset).
    pub wall_secs: i64,
    /// Nanoseconds within the second, 0..1e9.
    pub nanos: u32,
    /// The written UTC offset in seconds (`+05:30` is 19800), or `None` for
    /// naive text.
    pub offset_secs: Option<i32>,
}

impl ParsedTime {
    /// Seconds since the Unix epoch of the instant, reading naive text at
    /// `naive_offset_secs`.
    pub fn epoch_secs(&self, naive_offset_secs: i32) -> i64 {
        self.wall_secs - i64::from(self.offset_secs.unwrap_or(naive_offset_secs))
    }

    /// Days since 1970-01-01 of the date as written (the wall-clock date).
    pub fn wall_days(&self) -> i64 {
        self.wall_secs.div_euclid(SECS_PER_DAY)
    }
}

/// Why a time text did not parse (static text on the per-row path, so a
/// failed attempt before the next format allocates nothing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimeError(pub std::borrow::Cow<'static, str>);

impl From<String> for TimeError {
    fn from(s: String) -> TimeError {
        TimeError(std::borrow::Cow::Owned(s))
    }
}

impl TimeError {
    fn at(reason: &'static str) -> TimeError {
        TimeError(std::borrow::Cow::Borrowed(reason))
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    /// `min..=max` ASCII digits as a number (one pass: read and summed
    /// together; this runs several times per time value).
    #[inline]
    fn digits(&mut self, min: usize, max: usize, what: &'static str) -> Result<i64, TimeError> {
        let start = self.i;
        let mut v = 0i64;
        while self.i - start < max {
            let d = match self.s.get(self.i) {
                Some(c) => c.wrapping_sub(b'0'),
                None => break,
            };
            if d > 9 {
                break;
            }
            v = v * 10 + i64::from(d);
            self.i += 1;
        }
        if self.i - start < min {
            return Err(TimeError::at(what));
        }
        Ok(v)
    }

    #[inline]
    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn fraction(&mut self) -> u32 {
        let mut nanos = 0u32;
        let mut n = 0;
        while let Some(c) = self.s.get(self.i).filter(|c| c.is_ascii_digit()) {
            if n < 9 {
                nanos = nanos * 10 + u32::from(c - b'0');
                n += 1;
            }
            self.i += 1;
        }
        nanos * 10u32.pow(9 - n)
    }

    /// `Z`, `z`, `±HH:MM`, `±HHMM` or `±HH`.
    fn offset(&mut self) -> Result<Option<i32>, TimeError> {
        match self.s.get(self.i) {
            Some(b'Z' | b'z') => {
                self.i += 1;
                Ok(Some(0))
            }
            Some(&sign @ (b'+' | b'-')) => {
                self.i += 1;
                let h = self.digits(2, 2, "expected offset hours")?;
                self.eat(b':');
                let m = if self.i < self.s.len() {
                    self.digits(2, 2, "expected offset minutes")?
                } else {
                    0
                };
                if h > 23 || m > 59 {
                    return Err(TimeError::at("offset out of range"));
                }
                let secs = (h * 3600 + m * 60) as i32;
                Ok(Some(if sign == b'-' { -secs } else { secs }))
            }
            _ => Ok(None),
        }
    }
}

#[inline]
fn assemble(
    year: i64,
    month: i64,
    day: i64,
    (hour, minute, second): (i64, i64, i64),
) -> Result<i64, TimeError> {
    if !(1..=12).contains(&month) || !valid_date(year, month as u32, day as u32) {
        return Err(TimeError::from(format!(
            "no such date {year:04}-{month:02}-{day:02}"
        )));
    }
    // 60 is allowed for a leap second; it lands on the next second, as in
    // ClickHouse and most parsers.
    if hour > 23 || minute > 59 || second > 60 {
        return Err(TimeError::from(format!(
            "no such time {hour:02}:{minute:02}:{second:02}"
        )));
    }
    let days = days_from_civil(year, month as u32, day as u32);
    Ok(days * SECS_PER_DAY + hour * 3600 + minute * 60 + second)
}

/// Parses RFC 3339 and the forms close to it: `YYYY-MM-DD`,
/// `YYYY-MM-DD[T| ]HH:MM[:SS[.f...]][Z|±HH:MM|±HHMM]`.
///
/// # Errors
/// [`TimeError`] saying what was expected or which field is out of range.
pub fn parse_datetime(text: &[u8]) -> Result<ParsedTime, TimeError> {
    let mut c = Cursor { s: text, i: 0 };
    let year = c.digits(4, 4, "expected a 4-digit year")?;
    if !c.eat(b'-') {
        return Err(TimeError::at("expected `-` after the year"));
    }
    let month = c.digits(2, 2, "expected a 2-digit month")?;
    if !c.eat(b'-') {
        return Err(TimeError::at("expected `-` after the month"));
    }
    let day = c.digits(2, 2, "expected a 2-digit day")?;
    let mut time = (0, 0, 0);
    let mut nanos = 0;
    let mut offset = None;
    if c.i < text.len() {
        if !(c.eat(b'T') || c.eat(b't') || c.eat(b' ')) {
            return Err(TimeError::at("expected `T` or a space after the date"));
        }
        time.0 = c.digits(2, 2, "expected 2-digit hours")?;
        if !c.eat(b':') {
            return Err(TimeError::at("expected `:` after the hours"));
        }
        time.1 = c.digits(2, 2, "expected 2-digit minutes")?;
        if c.eat(b':') {
            time.2 = c.digits(2, 2, "expected 2-digit seconds")?;
            if c.eat(b'.') || c.eat(b',') {
                if !c.s.get(c.i).is_some_and(u8::is_ascii_digit) {
                    return Err(TimeError::at("expected digits after the decimal point"));
                }
                nanos = c.fraction();
            }
        }
        offset = c.offset()?;
    }
    if c.i != text.len() {
        return Err(TimeError::at("unexpected text after the time"));
    }
    Ok(ParsedTime {
        wall_secs: assemble(year, month, day, time)?,
        nanos,
        offset_secs: offset,
    })
}

/// The common RFC 3339 shapes read by position: exactly
/// `YYYY-MM-DD[T|t| ]HH:MM:SS`, then optionally `.` or `,` and digits, then
/// optionally `Z` or `z`. `Some` only where [`parse_datetime`] gives the
/// same time; `None` says nothing (other shapes, offsets, and every error
/// are left to [`parse_datetime`]).
#[inline]
pub fn parse_iso_fixed(text: &[u8]) -> Option<ParsedTime> {
    // `YYYY-MM-` and `DD?HH:MM` as words (SWAR, as in Layout::parse),
    // then `:SS`.
    const DIGITS0: u64 = 0x0080_8000_8080_8080;
    const DIGITS1: u64 = 0x8080_0080_8000_8080;
    const LIT0: u64 = u64::from_le_bytes(*b"\0\0\0\0-\0\0-");
    const LIT1: u64 = u64::from_le_bytes(*b"\0\0\0\0\0:\0\0");
    const MASK0: u64 = 0xff00_00ff_0000_0000;
    const MASK1: u64 = 0x0000_ff00_0000_0000;
    let head: &[u8; 19] = text.get(..19)?.try_into().ok()?;
    let w0 = u64::from_le_bytes(head[..8].try_into().ok()?);
    let w1 = u64::from_le_bytes(head[8..16].try_into().ok()?);
    if w0 & MASK0 != LIT0
        || w1 & MASK1 != LIT1
        || !matches!(head[10], b'T' | b't' | b' ')
        || head[16] != b':'
        || !digits_at(w0, DIGITS0)
        || !digits_at(w1, DIGITS1)
        || !head[17].is_ascii_digit()
        || !head[18].is_ascii_digit()
    {
        return None;
    }
    let two = |at: usize| i64::from(head[at] - b'0') * 10 + i64::from(head[at + 1] - b'0');
    let mut c = Cursor { s: text, i: 19 };
    let mut nanos = 0;
    if c.eat(b'.') || c.eat(b',') {
        if !c.s.get(c.i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        nanos = c.fraction();
    }
    let offset_secs = if c.eat(b'Z') || c.eat(b'z') {
        Some(0)
    } else {
        None
    };
    if c.i != text.len() {
        return None;
    }
    let wall_secs = assemble(
        two(0) * 100 + two(2),
        two(5),
        two(8),
        (two(11), two(14), two(17)),
    )
    .ok()?;
    Some(ParsedTime {
        wall_secs,
        nanos,
        offset_secs,
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Literal(u8),
    Year,
    Month,
    MonthName,
    Day,
    Hour,
    Minute,
    Second,
    Fraction,
    Offset,
}

/// A user time format, a strftime subset: `%Y` year (4 digits), `%m` month
/// (1-2 digits), `%b` English month abbreviation (`Jun`, any case), `%d` day
/// (1-2 digits), `%H` hour, `%M` minute, `%S` second, `%f` fraction (1+
/// digits), `%z` offset (`Z`, `±HH:MM`, `±HHMM`), `%%` a percent sign; any
/// other byte matches itself. `"%Y/%m/%d %H:%M"` reads the flights data's
/// `2001/01/01 00:47`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeFormat {
    text: String,
    items: Vec<Item>,
    /// The fixed-width layout, when the format has one (see [`Layout`]).
    layout: Option<Layout>,
}

/// A byte of a fixed-width layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    /// This byte, exactly.
    Literal(u8),
    /// An ASCII digit.
    Digit,
}

/// The fixed-width reading of a format made only of literals and numeric
/// fields (`%Y` as 4 digits, `%m %d %H %M %S` as 2): text that matches it
/// cell by cell is read by position, without the general walk. Only used
/// where the result is the same as the general parse: the greedy 1-2 digit
/// fields then take exactly these 2 digits, and [`parse_datetime`], which
/// the mapper tries first, cannot accept such text (the layout's byte 4 is
/// not `-` or one of bytes 0..4 is a non-digit literal).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Layout {
    cells: Vec<Cell>,
    /// The offset of the first digit of `%Y %m %d %H %M %S`, in that order,
    /// in the parse buffer ([`PAD`]: the text, then the defaults of absent
    /// fields, so every field is read the same way; a repeated field keeps
    /// its last place, as the general parse keeps its last value).
    at: [u8; 6],
    /// The cells as little-endian words of 8 bytes (the last zero-padded):
    /// literal bytes, ones over literal bytes, and high bits of digit
    /// bytes, so a match is checked a word at a time (SWAR).
    words: Vec<(u64, u64, u64)>,
    /// The one-register reading of a layout of at most 16 cells.
    short: Option<Short>,
}

/// A [`Layout`] of at most 16 cells as 128-bit masks: the text's match is
/// checked, and every field's value computed, in one register (SWAR),
/// without the parse buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Short {
    /// Literal bytes.
    lit: u128,
    /// Ones over literal bytes.
    lit_mask: u128,
    /// The high bit of each digit byte.
    digit_high: u128,
    /// Ones over digit bytes.
    digit_mask: u128,
    /// Where each of `%Y %m %d %H %M %S` starts in [`Short::pairs`]'s
    /// bytes, or in the defaults after them (see [`SHORT_DEFAULTS`]).
    at: [u8; 6],
}

/// Two-digit values of absent fields, after a short layout's 16 pair
/// bytes: `00` at 16, `01` at 17, and `19`, `70` at 18 and 20 (a year is
/// two pairs two bytes apart).
const SHORT_DEFAULTS: [u8; 16] = [0, 1, 19, 0, 70, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Days in each month of a common year (index 1..=12).
const DAYS_IN_MONTH: [u8; 16] = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 0, 0, 0];

impl Short {
    fn of(cells: &[Cell], at: &[u8; 6]) -> Option<Short> {
        if cells.len() > 16 {
            return None;
        }
        let (mut lit, mut lit_mask, mut digit_high, mut digit_mask) = (0u128, 0u128, 0u128, 0u128);
        for (k, cell) in cells.iter().enumerate() {
            match cell {
                Cell::Literal(b) => {
                    lit |= u128::from(*b) << (8 * k);
                    lit_mask |= 0xff << (8 * k);
                }
                Cell::Digit => {
                    digit_high |= 0x80 << (8 * k);
                    digit_mask |= 0xff << (8 * k);
                }
            }
        }
        // The long layout's absent places (PAD's) map to the defaults'.
        let mut short_at = [0u8; 6];
        for (k, (&place, short)) in at.iter().zip(&mut short_at).enumerate() {
            *short = match place {
                p if p < PAD_ZERO => p,
                _ if k == 0 => 18,
                _ if k <= 2 => 17,
                _ => 16,
            };
        }
        Some(Short {
            lit,
            lit_mask,
            digit_high,
            digit_mask,
            at: short_at,
        })
    }

    /// [`Layout::parse`] for a text of the layout's length.
    #[inline]
    fn parse(&self, text: &[u8]) -> Option<ParsedTime> {
        const ZEROS: u128 = 0x3030_3030_3030_3030_3030_3030_3030_3030;
        const LOW7: u128 = 0x7f7f_7f7f_7f7f_7f7f_7f7f_7f7f_7f7f_7f7f;
        const NINE_UP: u128 = 0x7676_7676_7676_7676_7676_7676_7676_7676;
        let v = u128::from(word_at(text, 0)) | u128::from(word_or_zero(text, 8)) << 64;
        let x = v ^ ZEROS;
        // As digits_at: a digit byte's high bit stays clear after adding.
        if v & self.lit_mask != self.lit
            || ((x & LOW7).wrapping_add(NINE_UP) | x) & self.digit_high != 0
        {
            return None;
        }
        // Digit bytes as 0..=9, others 0; then byte k holds
        // 10 * d[k] + d[k + 1] (at most 99: no carry between bytes).
        let d = x & self.digit_mask;
        let pairs = d.wrapping_mul(10).wrapping_add(d >> 8);
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&pairs.to_le_bytes());
        b[16..].copy_from_slice(&SHORT_DEFAULTS);
        // Every place is below 21 (the masks only spare bounds checks).
        let two = |at: u8| u32::from(b[usize::from(at) & 31]);
        let [y, mo, d, h, mi, sec] = self.at;
        let year = two(y) * 100 + two(y.wrapping_add(2));
        let (month, day) = (two(mo), two(d));
        let (hour, minute, second) = (two(h), two(mi), two(sec));
        // As assemble, for years 0..=9999.
        if month == 0 || month > 12 || day == 0 {
            return None;
        }
        // The leap rule only for a February 29th.
        if day > u32::from(DAYS_IN_MONTH[(month & 15) as usize])
            && !(month == 2 && day == 29 && year % 4 == 0 && (year % 100 != 0 || year % 400 == 0))
        {
            return None;
        }
        if hour > 23 || minute > 59 || second > 60 {
            return None;
        }
        let days = days_from_civil_0_9999(year, month, day);
        Some(ParsedTime {
            wall_secs: days * SECS_PER_DAY + i64::from(hour * 3600 + minute * 60 + second),
            nanos: 0,
            offset_secs: None,
        })
    }
}

/// [`days_from_civil`] for years 0..=9999 (month 1..=12), in unsigned
/// arithmetic: the year is moved up one 400-year era so nothing is
/// negative before the divisions.
#[inline]
fn days_from_civil_0_9999(year: u32, month: u32, day: u32) -> i64 {
    debug_assert!(year <= 9999, "four-digit year");
    debug_assert!((1..=12).contains(&month), "month");
    // March-based years, so the leap day is the year's last.
    let y = year + 400 - u32::from(month <= 2);
    let m = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let days = y * 365 + y / 4 - y / 100 + y / 400 + day_of_year;
    i64::from(days) - (719_468 + 146_097)
}

/// [`word_at`], or 0 when `at` is past the text.
#[inline]
fn word_or_zero(text: &[u8], at: usize) -> u64 {
    if at >= text.len() {
        0
    } else {
        word_at(text, at)
    }
}

/// Whether every byte of `v` whose high bit is set in `high` is an ASCII
/// digit (SWAR): a digit minus `'0'` is 0..=9, so adding 0x76 to its low 7
/// bits leaves the high bit clear, and its own high bit is clear; no carry
/// crosses bytes (each sum stays below 0x100).
#[inline]
fn digits_at(v: u64, high: u64) -> bool {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const NINE_UP: u64 = 0x7676_7676_7676_7676;
    let x = v ^ ZEROS;
    ((x & LOW7).wrapping_add(NINE_UP) | x) & high == 0
}

/// A field a [`Layout`] lacks.
const ABSENT: u8 = u8::MAX;

/// The parse buffer's start: the text goes over bytes 0..32 (a layout has
/// at most 32 cells), and bytes 32..40 hold the values of absent fields,
/// `00` (time fields, at [`PAD_ZERO`]), `01` (month and day, at
/// [`PAD_ONE`]) and `1970` (year, at [`PAD_YEAR`]). 64 bytes, so an offset
/// masked with 63 needs no bounds check.
const PAD: [u8; 64] = {
    let mut b = [0u8; 64];
    let tail = *b"00011970";
    let mut k = 0;
    while k < 8 {
        b[32 + k] = tail[k];
        k += 1;
    }
    b
};
/// Where `00` sits in [`PAD`].
const PAD_ZERO: u8 = 32;
/// Where `01` sits in [`PAD`].
const PAD_ONE: u8 = 34;
/// Where `1970` sits in [`PAD`].
const PAD_YEAR: u8 = 36;

/// Text as little-endian words of 8 bytes, the last zero-padded.
#[inline]
fn word_at(text: &[u8], at: usize) -> u64 {
    if let Some(w) = text.get(at..at + 8) {
        return u64::from_le_bytes(w.try_into().expect("8 bytes"));
    }
    let mut v = 0u64;
    for (k, &b) in text[at..].iter().enumerate() {
        v |= u64::from(b) << (8 * k);
    }
    v
}

impl Layout {
    fn of(items: &[Item]) -> Option<Layout> {
        let mut cells = Vec::new();
        let mut at = [ABSENT; 6];
        for item in items {
            let width = match item {
                Item::Literal(b) => {
                    cells.push(Cell::Literal(*b));
                    continue;
                }
                Item::Year => 4,
                Item::Month | Item::Day | Item::Hour | Item::Minute | Item::Second => 2,
                Item::MonthName | Item::Fraction | Item::Offset => return None,
            };
            let k = match item {
                Item::Year => 0,
                Item::Month => 1,
                Item::Day => 2,
                Item::Hour => 3,
                Item::Minute => 4,
                _ => 5,
            };
            at[k] = u8::try_from(cells.len()).unwrap_or(ABSENT);
            cells.extend(std::iter::repeat_n(Cell::Digit, width));
        }
        let iso_excluded = cells.get(4) != Some(&Cell::Literal(b'-'))
            || cells[..4.min(cells.len())]
                .iter()
                .any(|c| matches!(c, Cell::Literal(b) if !b.is_ascii_digit()));
        if !iso_excluded || cells.len() > 32 {
            return None;
        }
        for (k, place) in at.iter_mut().enumerate() {
            if *place == ABSENT {
                *place = match k {
                    0 => PAD_YEAR,
                    1 | 2 => PAD_ONE,
                    _ => PAD_ZERO,
                };
            }
        }
        let words = cells
            .chunks(8)
            .map(|chunk| {
                let (mut lit, mut lit_mask, mut digit_high) = (0u64, 0u64, 0u64);
                for (k, cell) in chunk.iter().enumerate() {
                    match cell {
                        Cell::Literal(b) => {
                            lit |= u64::from(*b) << (8 * k);
                            lit_mask |= 0xff << (8 * k);
                        }
                        Cell::Digit => digit_high |= 0x80 << (8 * k),
                    }
                }
                (lit, lit_mask, digit_high)
            })
            .collect();
        let short = Short::of(&cells, &at);
        Some(Layout {
            cells,
            at,
            words,
            short,
        })
    }

    /// The time when `text` matches cell by cell and is a real date and
    /// time; `None` otherwise (the general parse then decides and explains).
    #[inline]
    fn parse(&self, text: &[u8]) -> Option<ParsedTime> {
        if text.len() != self.cells.len() {
            return None;
        }
        if let Some(short) = &self.short {
            return short.parse(text);
        }
        debug_assert!(self.words.len() <= 4, "at most 32 cells");
        let mut b = PAD;
        for (w, &(lit, lit_mask, digit_high)) in self.words.iter().enumerate() {
            let v = word_at(text, 8 * w);
            if v & lit_mask != lit || !digits_at(v, digit_high) {
                return None;
            }
            // The words already hold the text: no second copy from it.
            let at = 8 * (w & 3);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        // Every offset is below 40 and its digits are checked (or PAD's),
        // so the masks only spare bounds checks.
        let two = |at: u8| {
            let at = usize::from(at);
            i64::from(b[at & 63] - b'0') * 10 + i64::from(b[(at + 1) & 63] - b'0')
        };
        let [y, mo, d, h, mi, sec] = self.at;
        let year = two(y) * 100 + two(y + 2);
        let (month, day) = (two(mo), two(d));
        let time = (two(h), two(mi), two(sec));
        Some(ParsedTime {
            wall_secs: assemble(year, month, day, time).ok()?,
            nanos: 0,
            offset_secs: None,
        })
    }
}

impl TimeFormat {
    /// Compiles `format`.
    ///
    /// # Errors
    /// [`TimeError`] for an unknown `%` directive or a format without `%Y`.
    pub fn compile(format: &str) -> Result<TimeFormat, TimeError> {
        let mut items = Vec::new();
        let mut bytes = format.bytes();
        while let Some(b) = bytes.next() {
            if b != b'%' {
                items.push(Item::Literal(b));
                continue;
            }
            items.push(match bytes.next() {
                Some(b'Y') => Item::Year,
                Some(b'm') => Item::Month,
                Some(b'b') => Item::MonthName,
                Some(b'd') => Item::Day,
                Some(b'H') => Item::Hour,
                Some(b'M') => Item::Minute,
                Some(b'S') => Item::Second,
                Some(b'f') => Item::Fraction,
                Some(b'z') => Item::Offset,
                Some(b'%') => Item::Literal(b'%'),
                Some(other) => {
                    return Err(TimeError::from(format!(
                        "unknown directive `%{}` in time format `{format}`",
                        other as char
                    )));
                }
                None => {
                    return Err(TimeError::from(format!(
                        "dangling `%` in time format `{format}`"
                    )));
                }
            });
        }
        if !items.contains(&Item::Year) {
            return Err(TimeError::from(format!(
                "time format `{format}` has no `%Y`"
            )));
        }
        Ok(TimeFormat {
            text: format.to_owned(),
            layout: Layout::of(&items),
            items,
        })
    }

    /// Parses `text` by this format's fixed-width layout, when it has one
    /// and `text` fits it. `Some` only where [`TimeFormat::parse`] gives the
    /// same time and [`parse_datetime`] fails (so a caller that tries
    /// [`parse_datetime`] first and then this format may skip both); `None`
    /// says nothing (use the general parsers).
    #[inline]
    pub fn parse_fixed(&self, text: &[u8]) -> Option<ParsedTime> {
        self.layout.as_ref()?.parse(text)
    }

    /// The length of text [`TimeFormat::parse_fixed`] reads, when any text
    /// it accepts is also a JSON string body without escapes (every
    /// literal is printable and neither `"` nor `\\`) and never numeric
    /// text (a literal outside `0-9 . + - e E`): then a reader may take
    /// exactly that many bytes up to a closing quote as the string.
    pub fn fixed_json_len(&self) -> Option<usize> {
        let layout = self.layout.as_ref()?;
        let mut numeric = true;
        for cell in &layout.cells {
            if let Cell::Literal(b) = *cell {
                if b < 0x20 || b == b'"' || b == b'\\' || b >= 0x80 {
                    return None;
                }
                numeric &= matches!(b, b'0'..=b'9' | b'.' | b'+' | b'-' | b'e' | b'E');
            }
        }
        (!numeric).then_some(layout.cells.len())
    }

    /// The format as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Parses `text` with this format; missing fields default to the start
    /// of their unit (month and day 1, time 00:00:00).
    ///
    /// # Errors
    /// [`TimeError`] when `text` does not match.
    pub fn parse(&self, text: &[u8]) -> Result<ParsedTime, TimeError> {
        let mut c = Cursor { s: text, i: 0 };
        let (mut year, mut month, mut day) = (1970, 1, 1);
        let mut time = (0, 0, 0);
        let mut nanos = 0;
        let mut offset = None;
        for item in &self.items {
            match item {
                Item::Literal(b) => {
                    if !c.eat(*b) {
                        return Err(TimeError::at("does not match the format"));
                    }
                }
                Item::Year => year = c.digits(4, 4, "expected a 4-digit year")?,
                Item::Month => month = c.digits(1, 2, "expected a month")?,
                Item::MonthName => month = month_name(&mut c)?,
                Item::Day => day = c.digits(1, 2, "expected a day")?,
                Item::Hour => time.0 = c.digits(1, 2, "expected hours")?,
                Item::Minute => time.1 = c.digits(1, 2, "expected minutes")?,
                Item::Second => time.2 = c.digits(1, 2, "expected seconds")?,
                Item::Fraction => {
                    if !c.s.get(c.i).is_some_and(u8::is_ascii_digit) {
                        return Err(TimeError::at("expected fraction digits"));
                    }
                    nanos = c.fraction();
                }
                Item::Offset => {
                    offset = c.offset()?;
                    if offset.is_none() {
                        return Err(TimeError::at("expected a UTC offset"));
                    }
                }
            }
        }
        if c.i != text.len() {
            return Err(TimeError::at("unexpected text after the time"));
        }
        Ok(ParsedTime {
            wall_secs: assemble(year, month, day, time)?,
            nanos,
            offset_secs: offset,
        })
    }
}

fn month_name(c: &mut Cursor<'_>) -> Result<i64, TimeError> {
    const NAMES: [&[u8; 3]; 12] = [
        b"jan", b"feb", b"mar", b"apr", b"may", b"jun", b"jul", b"aug", b"sep", b"oct", b"nov",
        b"dec",
    ];
    let word =
        c.s.get(c.i..c.i + 3)
            .ok_or_else(|| TimeError::at("expected a month name"))?;
    for (i, name) in NAMES.iter().enumerate() {
        if word.eq_ignore_ascii_case(&name[..]) {
            c.i += 3;
            return Ok(i as i64 + 1);
        }
    }
    Err(TimeError::at("expected a month name (Jan..Dec)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_conversions_agree() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2149, 6, 6), 65_535);
        assert_eq!(days_from_civil(1900, 1, 1), -25_567);
        for d in (-800_000..800_000).step_by(997) {
            let (y, m, dd) = civil_from_days(d);
            assert!(valid_date(y, m, dd));
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }

    #[test]
    fn four_digit_year_days_agree_with_the_general_conversion() {
        for year in 0..=9999u32 {
            for (month, day) in [(1, 1), (2, 28), (2, 29), (3, 1), (12, 31)] {
                assert_eq!(
                    days_from_civil_0_9999(year, month, day),
                    days_from_civil(i64::from(year), month, day),
                    "{year}-{month}-{day}"
                );
            }
        }
    }

    /// The one-register reading of short layouts at calendar edges: every
    /// day of the months around each month end, leap years and not, bad
    /// digits and out-of-range fields, agrees with the general parse.
    #[test]
    fn short_layouts_agree_at_calendar_edges() {
        let f = TimeFormat::compile("%Y/%m/%d %H:%M").unwrap();
        assert!(f.layout.as_ref().unwrap().short.is_some());
        for year in [
            0, 1, 4, 100, 400, 1900, 1970, 1999, 2000, 2023, 2024, 2100, 9999,
        ] {
            for month in 0..=13 {
                for day in [0, 1, 27, 28, 29, 30, 31, 32, 99] {
                    for time in ["00:00", "23:59", "24:00", "00:60", "9:99"] {
                        let text = format!("{year:04}/{month:02}/{day:02} {time}");
                        assert_eq!(
                            f.parse_fixed(text.as_bytes()).ok_or(()),
                            f.parse(text.as_bytes()).map_err(drop),
                            "{text}"
                        );
                    }
                }
            }
        }
        for bad in [
            "2001/01/01 00:4:",
            "2001/01/01 00:4/",
            "200a/01/01 00:47",
            "2001-01/01 00:47",
        ] {
            assert_eq!(f.parse_fixed(bad.as_bytes()), None, "{bad}");
        }
        // 16 cells exactly, and a 17-cell layout that keeps the long path.
        let f = TimeFormat::compile("%d/%m/%Y %H:%M:%S").unwrap();
        assert!(f.layout.as_ref().unwrap().short.is_none());
        assert_eq!(
            f.parse_fixed(b"29/02/2024 23:59:60").ok_or(()),
            f.parse(b"29/02/2024 23:59:60").map_err(drop)
        );
        let f = TimeFormat::compile("%Y").unwrap();
        assert_eq!(
            f.parse_fixed(b"2024").ok_or(()),
            f.parse(b"2024").map_err(drop)
        );
    }

    #[test]
    fn fixed_json_lengths_only_for_plain_non_numeric_layouts() {
        for (format, want) in [
            ("%Y/%m/%d %H:%M", Some(16)),
            ("%d/%m/%Y %H:%M:%S", Some(19)),
            ("%Y %H", Some(7)),
            // numeric text is an epoch, so the layout must not decide it
            ("%Y%m%d", None),
            ("%d.%m.%Y", None),
            ("%Y+%m", None),
            // not a plain JSON string body
            ("%Y\"%m", None),
            ("%Y\\%m", None),
            ("%Y\t%m", None),
            ("%Y/%m/\u{e9}%d", None),
            // no fixed layout at all
            ("%b %d %Y", None),
            ("%Y-%m-%d %H:%M", None),
        ] {
            assert_eq!(
                TimeFormat::compile(format).unwrap().fixed_json_len(),
                want,
                "{format}"
            );
        }
    }

    #[test]
    fn parses_rfc3339_and_clickhouse_text() {
        let t = parse_datetime(b"2018-02-07T01:26:13.840Z").unwrap();
        assert_eq!(t.epoch_secs(0), 1_517_966_773);
        assert_eq!(t.nanos, 840_000_000);
        let t = parse_datetime(b"2018-02-07 06:56:13+05:30").unwrap();
        assert_eq!(t.epoch_secs(0), 1_517_966_773);
        let t = parse_datetime(b"2018-02-07 01:26:13.123456789123").unwrap();
        assert_eq!((t.offset_secs, t.nanos), (None, 123_456_789));
        let t = parse_datetime(b"1969-12-31").unwrap();
        assert_eq!(t.wall_secs, -86_400);
        for bad in [
            "2018-02-30",
            "2018-13-01",
            "2018-02-07T25:00",
            "2018-2-7",
            "2018-02-07X",
            "2018-02-07 01:26:13.",
            "2018-02-07T01:26:13+5",
            "",
        ] {
            assert!(parse_datetime(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn user_formats() {
        let f = TimeFormat::compile("%Y/%m/%d %H:%M").unwrap();
        let t = f.parse(b"2001/01/01 00:47").unwrap();
        assert_eq!(t.epoch_secs(0), 978_310_020);
        let f = TimeFormat::compile("%b %d %Y").unwrap();
        let t = f.parse(b"Jun 12 1998").unwrap();
        assert_eq!(t.wall_days(), days_from_civil(1998, 6, 12));
        assert!(f.parse(b"Foo 12 1998").is_err());
        assert!(TimeFormat::compile("%Q").is_err());
        assert!(TimeFormat::compile("%H:%M").is_err());
    }

    #[test]
    fn fixed_layouts_agree_with_the_general_parse() {
        let cases: &[(&str, &[&str])] = &[
            (
                "%Y/%m/%d %H:%M",
                &[
                    "2001/01/01 00:47",
                    "2001/1/01 00:47",
                    "2001/02/30 00:47",
                    "2001/01/01 24:00",
                    "2001/01/01 00:4x",
                    "2001/01/01 00:470",
                    "1999/12/31 23:59",
                    "2000/02/29 12:00",
                    "1900/02/29 12:00",
                    "2024/02/29 00:00",
                    "2023/02/29 00:00",
                    "2001/04/31 00:00",
                    "2001/04/30 00:00",
                    "0000/03/01 00:00",
                    "9999/12/31 23:59",
                ],
            ),
            // Absent fields read as their defaults (1970, 01, 00).
            ("%m/%Y", &["02/2024", "13/2024", "00/2024"]),
            ("%Y %H", &["2024 23", "2024 24"]),
            (
                "%Y%m%d%H%M%S",
                &[
                    "20010101004712",
                    "20011301004712",
                    "2001010100471",
                    "x0010101004712",
                ],
            ),
            ("%d.%m.%Y", &["31.12.1999", "1.12.1999", "32.12.1999"]),
        ];
        for (format, texts) in cases {
            let f = TimeFormat::compile(format).unwrap();
            assert!(f.layout.is_some(), "{format} has a fixed layout");
            for text in *texts {
                let general = f.parse(text.as_bytes());
                match f.parse_fixed(text.as_bytes()) {
                    Some(t) => {
                        assert_eq!(Ok(t), general, "{format} on {text}");
                        assert!(parse_datetime(text.as_bytes()).is_err(), "{text}");
                    }
                    None => assert!(
                        general.is_err() || text.len() != f.layout.as_ref().unwrap().cells.len(),
                        "{format} on {text}: the general parse is the only reader"
                    ),
                }
            }
        }
        // The fixed RFC 3339 reader: every byte value at every position.
        for base in [
            &b"2018-02-07T01:26:13"[..],
            b"2018-02-07 01:26:13.840Z",
            b"2016-12-31t23:59:60,123456789123z",
        ] {
            for at in 0..base.len() {
                for b in 0..=255u8 {
                    let mut text = base.to_vec();
                    text[at] = b;
                    if let Some(t) = parse_iso_fixed(&text) {
                        assert_eq!(Ok(t), parse_datetime(&text), "{text:?}");
                    }
                }
            }
            assert_eq!(
                parse_iso_fixed(base).ok_or(()),
                parse_datetime(base).map_err(drop)
            );
        }
        // Every byte value in every position of a layout's words.
        let f = TimeFormat::compile("%Y/%m/%d %H:%M").unwrap();
        for at in 0..16 {
            for b in 0..=255u8 {
                let mut text = *b"2001/01/01 00:47";
                text[at] = b;
                let general = f.parse(&text);
                assert_eq!(
                    f.parse_fixed(&text).ok_or(()),
                    general.map_err(drop),
                    "{text:?}"
                );
            }
        }
        // No layout where ISO text could match, or widths vary.
        for format in [
            "%Y-%m-%d %H:%M",
            "%Y/%m/%d %H:%M:%S.%f",
            "%b %d %Y",
            "%Y/%m/%d%z",
        ] {
            assert!(
                TimeFormat::compile(format).unwrap().layout.is_none(),
                "{format}"
            );
        }
    }
}
