//! Named tuples from JSON objects: `{"b": "x", "a": 1}` into
//! `Tuple(a UInt8, b String)`.
//!
//! RowBinary writes a tuple's elements back to back in declared order, but an
//! object's fields come in any order. The readers write each element where it
//! arrives and note it here ([`Arrivals`]); [`Arrivals::finish`] then adds
//! NULL for missing Nullable elements, refuses a missing non-Nullable one,
//! and rotates the written bytes into declared order in place. Nothing is
//! allocated: the notes are a fixed array, so an object maps into a tuple of
//! at most [`MAX_ELEMENTS`] elements (larger tuples take a JSON array).
//! Fields that name no element are ignored, as top-level fields that name no
//! column are; a field given twice is refused.

use spate_row::types::{ChType, TupleElement};

/// The most elements a named tuple read from an object may have.
pub(super) const MAX_ELEMENTS: usize = 64;

/// Which elements arrived, in arrival order, and how many bytes each wrote.
pub(super) struct Arrivals {
    index: [u8; MAX_ELEMENTS],
    len: [u32; MAX_ELEMENTS],
    n: usize,
    seen: u64,
}

impl Arrivals {
    /// Notes for `elements`, or why an object cannot map into them.
    pub(super) fn new(ty: &ChType, elements: &[TupleElement]) -> Result<Arrivals, String> {
        if elements.iter().any(|e| e.name.is_none()) {
            return Err(format!(
                "cannot put an object into {ty}: its elements have no names; send an array"
            ));
        }
        if elements.len() > MAX_ELEMENTS {
            return Err(format!(
                "an object maps into a named tuple of at most {MAX_ELEMENTS} elements; \
                 send an array for {ty}"
            ));
        }
        Ok(Arrivals {
            index: [0; MAX_ELEMENTS],
            len: [0; MAX_ELEMENTS],
            n: 0,
            seen: 0,
        })
    }

    /// The element named `key`, `Ok(None)` for a field that names none.
    ///
    /// # Errors
    /// A message when the element already arrived.
    pub(super) fn element(
        &self,
        elements: &[TupleElement],
        key: &[u8],
    ) -> Result<Option<usize>, String> {
        let Some(k) = elements
            .iter()
            .position(|e| e.name.as_deref().map(str::as_bytes) == Some(key))
        else {
            return Ok(None);
        };
        if self.seen & (1 << k) != 0 {
            return Err(format!(
                "tuple element `{}` given twice",
                String::from_utf8_lossy(key)
            ));
        }
        Ok(Some(k))
    }

    /// Element `k` was written as the last `len` bytes.
    pub(super) fn arrived(&mut self, k: usize, len: usize) {
        debug_assert!(k < MAX_ELEMENTS, "element index in range");
        debug_assert!(self.seen & (1 << k) == 0, "each element arrives once");
        self.index[self.n] = k as u8;
        self.len[self.n] = len as u32;
        self.n += 1;
        self.seen |= 1 << k;
    }

    /// Completes the tuple whose elements were written from `start` on:
    /// NULL for each missing Nullable element, then declared order.
    ///
    /// # Errors
    /// A message naming the first missing non-Nullable element.
    pub(super) fn finish(
        mut self,
        elements: &[TupleElement],
        buf: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), String> {
        for (k, e) in elements.iter().enumerate() {
            if self.seen & (1 << k) != 0 {
                continue;
            }
            if !matches!(e.ty, ChType::Nullable(_)) {
                return Err(format!(
                    "tuple element `{}` is missing and {} is not Nullable",
                    e.name.as_deref().unwrap_or_default(),
                    e.ty
                ));
            }
            buf.push(1);
            self.arrived(k, 1);
        }
        debug_assert_eq!(self.n, elements.len(), "every element present");
        // Selection by rotation: bring element k to the front of the
        // unsorted rest, k = 0, 1, ...
        let mut pos = start;
        for k in 0..self.n {
            let j = (k..self.n)
                .find(|&j| usize::from(self.index[j]) == k)
                .expect("every element arrived once");
            let before: usize = self.len[k..j].iter().map(|&l| l as usize).sum();
            let len = self.len[j] as usize;
            buf[pos..pos + before + len].rotate_right(len);
            self.index[k..=j].rotate_right(1);
            self.len[k..=j].rotate_right(1);
            pos += len;
        }
        debug_assert_eq!(pos, buf.len(), "the tuple's bytes are all placed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_row::types::ChType as T;

    fn elements(ty: &ChType) -> &[TupleElement] {
        match ty {
            ChType::Tuple(e) => e,
            _ => unreachable!(),
        }
    }

    #[test]
    fn out_of_order_elements_are_put_in_declared_order() {
        let ty = T::parse("Tuple(a UInt8, b String, c Nullable(UInt8), d UInt16)").unwrap();
        let els = elements(&ty);
        let mut buf = vec![0xEE]; // bytes before the tuple stay
        let mut a = Arrivals::new(&ty, els).unwrap();
        // d, b, a arrive in that order; c is missing.
        for (key, bytes) in [
            (&b"d"[..], &[4u8, 0][..]),
            (b"b", &[2, b'h', b'i']),
            (b"a", &[1]),
        ] {
            let k = a.element(els, key).unwrap().unwrap();
            buf.extend_from_slice(bytes);
            a.arrived(k, bytes.len());
        }
        assert_eq!(a.element(els, b"zz").unwrap(), None);
        assert!(a.element(els, b"a").unwrap_err().contains("twice"));
        a.finish(els, &mut buf, 1).unwrap();
        assert_eq!(buf, [0xEE, 1, 2, b'h', b'i', 1, 4, 0]);
    }

    #[test]
    fn a_missing_element_that_is_not_nullable_is_named() {
        let ty = T::parse("Tuple(a UInt8, b String)").unwrap();
        let els = elements(&ty);
        let mut a = Arrivals::new(&ty, els).unwrap();
        let mut buf = vec![7];
        a.arrived(0, 1);
        let e = a.finish(els, &mut buf, 0).unwrap_err();
        assert!(e.contains("`b`") && e.contains("String"), "{e}");
    }

    #[test]
    fn unnamed_tuples_take_arrays_only() {
        let ty = T::parse("Tuple(UInt8, String)").unwrap();
        let e = Arrivals::new(&ty, elements(&ty)).err().unwrap();
        assert!(e.contains("send an array"), "{e}");
    }
}
