//! The hot-path decoder: reads the Protobuf wire format
//! (<https://protobuf.dev/programming-guides/encoding/>) of one message
//! straight into one RowBinary row, following a [`Plan`].
//!
//! Two passes over reused scratch, no allocation once it has grown and no
//! `DynamicMessage`:
//! 1. **scan**: tags, varints and lengths are read in wire order; a field
//!    a column reads leaves its raw value in the column's slot (a varint or
//!    fixed value, or the byte range of a length-delimited one: the payload
//!    is borrowed, nothing is copied). Fields may come in any order and
//!    repeat: a scalar's last occurrence wins, a repeated field's
//!    occurrences concatenate (packed and unpacked alike, as Protobuf
//!    parsers must accept both), a nested message's occurrences merge (its
//!    fields are scanned into the same slots), a oneof member clears its
//!    siblings. Fields no column reads are skipped by wire type (groups
//!    too), as unknown fields are.
//! 2. **assemble**: the columns are written in INSERT order from their
//!    slots, converted as the plan says; an absent field gets its default
//!    (implicit presence) or the column's missing value (explicit
//!    presence), see [`super::plan`].
//!
//! Malformed input (a truncated varint or length, a wire type that is not
//! the field's, invalid UTF-8 in a `string`) is a [`Fail`]; so is a value
//! that cannot be written exactly (an enum number without a name for a
//! String column, a Timestamp finer than the column's precision).

use super::conv::Wire;
use super::plan::{Action, ColKind, Conv, Plan, Src};
use super::put::{int_value, put_cell, put_time};
use spate_row::rowbinary::put_leb128;
use spate_row::spec::MissingValue;

/// Deepest group nesting skipped (prost's recursion limit is 100 too).
const MAX_GROUP_DEPTH: u32 = 100;

/// Why a message did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fail {
    /// The wire bytes are malformed.
    Wire(String),
    /// A column's value cannot be written (column index, reason).
    Value(u32, String),
    /// A column whose field is absent and may not be missing.
    Missing(u32),
}

fn truncated() -> Fail {
    Fail::Wire("truncated message: a varint, fixed value or length runs past its end".into())
}

/// A column's raw value: a varint or fixed value in `a`, or the byte range
/// `a..b` of a length-delimited one (offsets into the message).
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    set: bool,
    a: u64,
    b: u64,
}

/// One occurrence of a repeated field: one value (`n == 0`), or a packed
/// run `a..b` of `n` values.
#[derive(Clone, Copy, Debug)]
struct Item {
    a: u64,
    b: u64,
    n: u64,
}

/// Reused per-lane buffers.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    slots: Vec<Slot>,
    items: Vec<Vec<Item>>,
    seen: Vec<bool>,
    entries: Vec<[u64; 4]>,
}

#[inline]
fn varint(b: &[u8], pos: &mut usize, end: usize) -> Result<u64, Fail> {
    if *pos < end {
        let x = b[*pos];
        if x < 0x80 {
            *pos += 1;
            return Ok(u64::from(x));
        }
    }
    varint_slow(b, pos, end)
}

#[inline(never)]
fn varint_slow(b: &[u8], pos: &mut usize, end: usize) -> Result<u64, Fail> {
    // Up to 8 bytes with 8 at hand: found and compacted in one word (the
    // first byte without its high bit ends it; then the 7-bit groups are
    // packed pairwise, 4 pairs, 2 pairs, 1 pair).
    if let Some(w) = b.get(*pos..*pos + 8).filter(|_| *pos + 8 <= end) {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let stops = !w & 0x8080_8080_8080_8080;
        if stops != 0 {
            let len = (stops.trailing_zeros() + 1) / 8;
            let keep = if len == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * len)) - 1
            };
            let mut x = w & keep & 0x7f7f_7f7f_7f7f_7f7f;
            x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
            x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
            x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
            *pos += len as usize;
            return Ok(x);
        }
    }
    // Ten bytes at hand: no bound check per byte.
    if let Some(w) = b.get(*pos..*pos + 10).filter(|_| *pos + 10 <= end) {
        let mut v = 0u64;
        for (i, &x) in w.iter().enumerate() {
            if i == 9 && x > 1 {
                break;
            }
            v |= u64::from(x & 0x7f) << (7 * i);
            if x < 0x80 {
                *pos += i + 1;
                return Ok(v);
            }
        }
        return Err(Fail::Wire("invalid varint: longer than 64 bits".into()));
    }
    let mut v = 0u64;
    for i in 0..10 {
        if *pos >= end {
            return Err(truncated());
        }
        let x = b[*pos];
        *pos += 1;
        if i == 9 && x > 1 {
            return Err(Fail::Wire("invalid varint: longer than 64 bits".into()));
        }
        v |= u64::from(x & 0x7f) << (7 * i);
        if x < 0x80 {
            return Ok(v);
        }
    }
    Err(Fail::Wire("invalid varint: longer than 10 bytes".into()))
}

/// Reads a value of wire type `w` at `pos`: `(value, 0)` or `(start, end)`.
#[inline(always)]
fn read(b: &[u8], pos: &mut usize, end: usize, w: Wire) -> Result<(u64, u64), Fail> {
    match w {
        Wire::Varint => Ok((varint(b, pos, end)?, 0)),
        Wire::I32 => {
            let s = b.get(*pos..*pos + 4).filter(|_| *pos + 4 <= end);
            let s = s.ok_or_else(truncated)?;
            *pos += 4;
            Ok((u64::from(u32::from_le_bytes(s.try_into().expect("4"))), 0))
        }
        Wire::I64 => {
            let s = b.get(*pos..*pos + 8).filter(|_| *pos + 8 <= end);
            let s = s.ok_or_else(truncated)?;
            *pos += 8;
            Ok((u64::from_le_bytes(s.try_into().expect("8")), 0))
        }
        Wire::Len => {
            let len = varint(b, pos, end)?;
            let start = *pos;
            if len > (end - start) as u64 {
                return Err(truncated());
            }
            *pos = start + len as usize;
            Ok((start as u64, *pos as u64))
        }
    }
}

fn wire_of(wt: u8) -> Option<Wire> {
    Some(match wt {
        0 => Wire::Varint,
        1 => Wire::I64,
        2 => Wire::Len,
        5 => Wire::I32,
        _ => return None,
    })
}

#[cold]
fn wrong_wire(number: u32, got: u8, want: Wire) -> Fail {
    Fail::Wire(format!(
        "field {number} has wire type {got}, its type needs {}",
        want as u8
    ))
}

/// Skips a value of wire type `wt` (groups by their end tag).
fn skip(
    b: &[u8],
    pos: &mut usize,
    end: usize,
    wt: u8,
    number: u32,
    depth: u32,
) -> Result<(), Fail> {
    if let Some(w) = wire_of(wt) {
        read(b, pos, end, w)?;
        return Ok(());
    }
    match wt {
        3 => {
            if depth >= MAX_GROUP_DEPTH {
                return Err(Fail::Wire("groups nested deeper than 100".into()));
            }
            loop {
                if *pos >= end {
                    return Err(truncated());
                }
                let key = varint(b, pos, end)?;
                let (n, w) = ((key >> 3) as u32, (key & 7) as u8);
                if w == 4 {
                    if n == number {
                        return Ok(());
                    }
                    return Err(Fail::Wire(format!(
                        "group {number} closed by end-group tag {n}"
                    )));
                }
                skip(b, pos, end, w, n, depth + 1)?;
            }
        }
        4 => Err(Fail::Wire(format!("unexpected end-group tag {number}"))),
        _ => Err(Fail::Wire(format!(
            "invalid wire type {wt} (field {number})"
        ))),
    }
}

#[inline]
fn check_utf8(b: &[u8], a: u64, e: u64, number: u32) -> Result<(), Fail> {
    let s = &b[a as usize..e as usize];
    if !s.is_ascii() && std::str::from_utf8(s).is_err() {
        return Err(Fail::Wire(format!(
            "field {number}: a string that is not valid UTF-8"
        )));
    }
    Ok(())
}

/// Reads a field key: `(number, wire type)`.
#[inline(always)]
fn key(b: &[u8], pos: &mut usize, end: usize) -> Result<(u32, u8), Fail> {
    let key = varint(b, pos, end)?;
    if key > u64::from(u32::MAX) {
        return Err(Fail::Wire(format!("invalid field key {key}")));
    }
    let number = (key >> 3) as u32;
    if number == 0 {
        return Err(Fail::Wire("field number 0".into()));
    }
    Ok((number, (key & 7) as u8))
}

impl Scratch {
    fn reset(&mut self, plan: &Plan) {
        let n = plan.cols.len();
        if self.slots.len() != n {
            self.slots.resize(n, Slot::default());
            self.items.resize_with(n, Vec::new);
        }
        self.slots.fill(Slot::default());
        for v in &mut self.items {
            v.clear();
        }
        self.seen.clear();
        self.seen.resize(plan.nodes.len(), false);
        self.seen[0] = true;
    }

    fn clear(&mut self, plan: &Plan, clears: (u32, u32)) {
        for &c in &plan.clear_lists[clears.0 as usize..clears.1 as usize] {
            self.slots[c as usize].set = false;
        }
    }

    /// Pass 1 over the message `b[start..end]` at plan node `node`.
    fn scan(
        &mut self,
        plan: &Plan,
        b: &[u8],
        node: u32,
        start: usize,
        end: usize,
    ) -> Result<(), Fail> {
        let nd = &plan.nodes[node as usize];
        let mut pos = start;
        while pos < end {
            let (number, wt) = key(b, &mut pos, end)?;
            let Some(action) = nd.action(number) else {
                skip(b, &mut pos, end, wt, number, 0)?;
                continue;
            };
            match *action {
                Action::Scalar {
                    col,
                    wire,
                    utf8,
                    clears,
                } => {
                    if wt != wire as u8 {
                        return Err(wrong_wire(number, wt, wire));
                    }
                    let (a, e) = read(b, &mut pos, end, wire)?;
                    if utf8 {
                        check_utf8(b, a, e, number)?;
                    }
                    self.clear(plan, clears);
                    self.slots[col as usize] = Slot { set: true, a, b: e };
                }
                Action::List { col, wire, utf8 } => {
                    if wt == wire as u8 {
                        let (a, e) = read(b, &mut pos, end, wire)?;
                        if utf8 {
                            check_utf8(b, a, e, number)?;
                        }
                        self.items[col as usize].push(Item { a, b: e, n: 0 });
                    } else if wt == Wire::Len as u8 && wire != Wire::Len {
                        let (a, e) = read(b, &mut pos, end, Wire::Len)?;
                        let n = packed_count(b, a as usize, e as usize, wire)?;
                        if n > 0 {
                            self.items[col as usize].push(Item { a, b: e, n });
                        }
                    } else {
                        return Err(wrong_wire(number, wt, wire));
                    }
                }
                Action::Map { col } => {
                    if wt != Wire::Len as u8 {
                        return Err(wrong_wire(number, wt, Wire::Len));
                    }
                    let (a, e) = read(b, &mut pos, end, Wire::Len)?;
                    // Checked now, so a malformed entry is a wire error
                    // whatever the column order; read again when written.
                    let ColKind::Map { key, value } = &plan.cols[col as usize].kind else {
                        unreachable!("map actions feed map columns")
                    };
                    map_entry(key, value, b, a as usize, e as usize)?;
                    self.items[col as usize].push(Item { a, b: e, n: 0 });
                }
                Action::Node { node: child } => {
                    if wt != Wire::Len as u8 {
                        return Err(wrong_wire(number, wt, Wire::Len));
                    }
                    let (a, e) = read(b, &mut pos, end, Wire::Len)?;
                    self.seen[child as usize] = true;
                    self.scan(plan, b, child, a as usize, e as usize)?;
                }
                Action::Time { col, clears } => {
                    if wt != Wire::Len as u8 {
                        return Err(wrong_wire(number, wt, Wire::Len));
                    }
                    let (a, e) = read(b, &mut pos, end, Wire::Len)?;
                    self.clear(plan, clears);
                    self.sub(b, col, a as usize, e as usize, Wire::Varint, false, true)?;
                }
                Action::Wrapper {
                    col,
                    wire,
                    utf8,
                    clears,
                } => {
                    if wt != Wire::Len as u8 {
                        return Err(wrong_wire(number, wt, Wire::Len));
                    }
                    let (a, e) = read(b, &mut pos, end, Wire::Len)?;
                    self.clear(plan, clears);
                    self.sub(b, col, a as usize, e as usize, wire, utf8, false)?;
                }
                Action::Skip { clears } => {
                    skip(b, &mut pos, end, wt, number, 0)?;
                    self.clear(plan, clears);
                }
            }
        }
        Ok(())
    }

    /// A Timestamp (`time`: seconds = field 1 into `a`, nanos = field 2
    /// into `b`) or a wrapper (`value` = field 1 of wire `wire`), merged
    /// into the column's slot.
    #[allow(clippy::too_many_arguments)]
    fn sub(
        &mut self,
        b: &[u8],
        col: u32,
        start: usize,
        end: usize,
        wire: Wire,
        utf8: bool,
        time: bool,
    ) -> Result<(), Fail> {
        let slot = &mut self.slots[col as usize];
        if !slot.set {
            *slot = Slot {
                set: true,
                a: 0,
                b: 0,
            };
        }
        let mut pos = start;
        while pos < end {
            let (number, wt) = key(b, &mut pos, end)?;
            match (time, number) {
                (true, 1 | 2) | (false, 1) => {
                    if wt != wire as u8 {
                        return Err(wrong_wire(number, wt, wire));
                    }
                    let (v, e) = read(b, &mut pos, end, wire)?;
                    if utf8 {
                        check_utf8(b, v, e, number)?;
                    }
                    if time && number == 2 {
                        slot.b = v;
                    } else {
                        slot.a = v;
                        if !time {
                            slot.b = e;
                        }
                    }
                }
                _ => skip(b, &mut pos, end, wt, number, 0)?,
            }
        }
        Ok(())
    }
}

/// The number of values in a packed run `a..e` of wire type `w`,
/// checking that it holds whole values.
fn packed_count(b: &[u8], a: usize, e: usize, w: Wire) -> Result<u64, Fail> {
    match w {
        Wire::Varint => {
            let mut n = 0;
            let mut pos = a;
            while pos < e {
                varint(b, &mut pos, e)?;
                n += 1;
            }
            Ok(n)
        }
        Wire::I32 | Wire::I64 => {
            let size = if w == Wire::I32 { 4 } else { 8 };
            if (e - a) % size != 0 {
                return Err(Fail::Wire(format!(
                    "a packed run of {} bytes is not whole {size}-byte values",
                    e - a
                )));
            }
            Ok(((e - a) / size) as u64)
        }
        Wire::Len => unreachable!("strings do not pack"),
    }
}

/// Whether two map keys (raw) are the same key.
fn same_key(conv: &Conv, b: &[u8], x: (u64, u64), y: (u64, u64)) -> bool {
    match conv.src {
        Src::String | Src::Bytes => b[x.0 as usize..x.1 as usize] == b[y.0 as usize..y.1 as usize],
        s => int_value(s, x.0) == int_value(s, y.0),
    }
}

/// Decodes the message `b` (whole) into one row appended to `out`.
pub(crate) fn decode_row(
    plan: &Plan,
    s: &mut Scratch,
    b: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    s.reset(plan);
    s.scan(plan, b, 0, 0, b.len())?;
    let wd = plan.with_defaults;
    for (i, c) in plan.cols.iter().enumerate() {
        let slot = s.slots[i];
        let parent = s.seen[c.node as usize];
        let val = |e: String| Fail::Value(i as u32, e);
        let present = match &c.kind {
            ColKind::Scalar { conv, implicit } => {
                if slot.set || (*implicit && parent) {
                    if wd {
                        out.push(0);
                    }
                    // An absent implicit field is its default: raw 0, or
                    // the empty byte range.
                    let (a, e) = if slot.set { (slot.a, slot.b) } else { (0, 0) };
                    put_cell(conv, a, e, b, out).map_err(val)?;
                    true
                } else {
                    false
                }
            }
            ColKind::Wrapper { conv } => {
                if slot.set {
                    if wd {
                        out.push(0);
                    }
                    put_cell(conv, slot.a, slot.b, b, out).map_err(val)?;
                }
                slot.set
            }
            ColKind::Time { dst, nullable } => {
                if slot.set {
                    if wd {
                        out.push(0);
                    }
                    put_time(*dst, *nullable, slot.a, slot.b, out).map_err(val)?;
                }
                slot.set
            }
            ColKind::List { conv } => {
                if parent {
                    if wd {
                        out.push(0);
                    }
                    put_list(conv, &s.items[i], b, i, out)?;
                }
                parent
            }
            ColKind::Map { key, value } => {
                if parent {
                    if wd {
                        out.push(0);
                    }
                    let Scratch { items, entries, .. } = s;
                    put_map(key, value, &items[i], entries, b, i, out)?;
                }
                parent
            }
            ColKind::Absent => false,
        };
        if !present {
            put_missing(&c.missing, c.default.as_deref(), wd, i, out)?;
        }
    }
    Ok(())
}

/// A repeated field's items (`items`, packed runs unpacked) as an Array cell.
#[inline(always)]
fn put_list(
    conv: &Conv,
    items: &[Item],
    b: &[u8],
    i: usize,
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    let val = |e: String| Fail::Value(i as u32, e);
    let n: u64 = items.iter().map(|it| it.n.max(1)).sum();
    put_leb128(out, n);
    let w = conv.src.wire();
    for it in items {
        if it.n == 0 {
            put_cell(conv, it.a, it.b, b, out).map_err(val)?;
            continue;
        }
        let (mut pos, end) = (it.a as usize, it.b as usize);
        while pos < end {
            let (v, _) = read(b, &mut pos, end, w)?;
            put_cell(conv, v, 0, b, out).map_err(val)?;
        }
    }
    Ok(())
}

/// A map field's entries (`items`; a later duplicate key wins) as a Map cell.
#[inline(always)]
fn put_map(
    key: &Conv,
    value: &Conv,
    items: &[Item],
    entries: &mut Vec<[u64; 4]>,
    b: &[u8],
    i: usize,
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    let val = |e: String| Fail::Value(i as u32, e);
    entries.clear();
    for it in items {
        let e = map_entry(key, value, b, it.a as usize, it.b as usize)?;
        match entries
            .iter()
            .position(|x| same_key(key, b, (x[0], x[1]), (e[0], e[1])))
        {
            Some(j) => entries[j] = e,
            None => entries.push(e),
        }
    }
    put_leb128(out, entries.len() as u64);
    for e in entries.iter() {
        put_cell(key, e[0], e[1], b, out).map_err(val)?;
        put_cell(value, e[2], e[3], b, out).map_err(val)?;
    }
    Ok(())
}

/// The cell of column `i` when its field is absent: NULL, the DEFAULT literal or the server's.
#[inline(always)]
fn put_missing(
    missing: &MissingValue,
    default: Option<&[u8]>,
    wd: bool,
    i: usize,
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    match (missing, default) {
        (MissingValue::Null, _) => {
            if wd {
                out.push(0);
            }
            out.push(1);
        }
        (MissingValue::Literal(_), Some(bytes)) => {
            if wd {
                out.push(0);
            }
            out.extend_from_slice(bytes);
        }
        (MissingValue::ServerDefault, _) => out.push(1),
        _ => return Err(Fail::Missing(i as u32)),
    }
    Ok(())
}

/// One map entry `b[start..end]`: `[key a, key b, value a, value b]`,
/// defaults for an absent key or value.
fn map_entry(
    key: &Conv,
    value: &Conv,
    b: &[u8],
    start: usize,
    end: usize,
) -> Result<[u64; 4], Fail> {
    let mut e = [0u64; 4];
    let mut pos = start;
    while pos < end {
        let (number, wt) = self::key(b, &mut pos, end)?;
        let (conv, at) = match number {
            1 => (key, 0),
            2 => (value, 2),
            _ => {
                skip(b, &mut pos, end, wt, number, 0)?;
                continue;
            }
        };
        let w = conv.src.wire();
        if wt != w as u8 {
            return Err(wrong_wire(number, wt, w));
        }
        let (v, x) = read(b, &mut pos, end, w)?;
        if conv.src == Src::String {
            check_utf8(b, v, x, number)?;
        }
        e[at] = v;
        e[at + 1] = x;
    }
    Ok(e)
}
