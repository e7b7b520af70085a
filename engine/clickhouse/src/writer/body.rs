//! The request body: a sealed batch's segments, streamed in order with an
//! exact length, each `Bytes` shared, never copied.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// An HTTP body made of byte segments sent back to back.
#[derive(Debug)]
pub struct SegmentsBody {
    segments: std::vec::IntoIter<Bytes>,
    remaining: u64,
}

impl SegmentsBody {
    /// A body of `segments`, in order.
    pub fn new(segments: Vec<Bytes>) -> Self {
        let remaining = segments.iter().map(|s| s.len() as u64).sum();
        Self {
            segments: segments.into_iter(),
            remaining,
        }
    }
}

impl Body for SegmentsBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        loop {
            match self.segments.next() {
                Some(s) if s.is_empty() => {}
                Some(s) => {
                    self.remaining -= s.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(s))));
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn streams_segments_in_order_with_exact_length() {
        let body = SegmentsBody::new(vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"c"),
        ]);
        assert_eq!(body.size_hint().exact(), Some(3));
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"abc");
    }
}
