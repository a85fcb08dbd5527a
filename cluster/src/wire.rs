//! The task services' two hot methods, `Mailbox.Deliver` and `Task.Call`, framed by hand so
//! that their payloads cross a task without being copied.
//!
//! Their messages are a name and a payload (`DeliverRequest { key = 1; payload = 2 }`,
//! `CallRequest { method = 1; payload = 2 }`, `CallReply { payload = 1 }`,
//! `DeliverReply {}`). Through tonic's codec a payload is copied into the encoding buffer
//! on the way out and into the decoding buffer on the way in: two passes over a collective's
//! chunk or a tf.data reply besides the kernel's. Here a message leaves as two data frames,
//! the gRPC prefix with the fields before the payload, then the payload's own buffer; and
//! arrives as the frames HTTP/2 read, the payload a slice of the frame that holds it (copied
//! only when it spans frames).
//!
//! The wire is gRPC's, byte for byte: tonic's generated clients reach these methods (the
//! server takes the same path for them), and requests this module does not take (a
//! compressed message) go to tonic's generated services.

use crate::transport::{h2_status, Channel};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::VecDeque;

/// `Mailbox.Deliver`'s path.
pub(crate) const DELIVER_PATH: &str = "/ferroflow.cluster.Mailbox/Deliver";
/// `Task.Call`'s path.
pub(crate) const CALL_PATH: &str = "/ferroflow.cluster.Task/Call";

/// A message of a name (field 1) and a payload (field 2), or of a payload alone (field 1),
/// as the two buffers it is sent in: the gRPC prefix (uncompressed, the message's length)
/// with every field but the payload's bytes, then the payload itself (not copied). An empty
/// payload is left out, as proto3 leaves out empty fields.
pub(crate) fn message(name: Option<&str>, payload: Bytes) -> [Bytes; 2] {
    // The prefix, then the fields; the prefix's length is filled in once they are known.
    let mut head = BytesMut::with_capacity(5 + 24 + name.map_or(0, str::len));
    head.put_u8(0);
    head.put_u32(0);
    let payload_field = match name {
        Some(name) => {
            put_bytes_key(&mut head, 1, name.len());
            head.extend_from_slice(name.as_bytes());
            2
        }
        None => 1,
    };
    if !payload.is_empty() {
        put_bytes_key(&mut head, payload_field, payload.len());
    }
    // Lengths beyond u32 cannot be framed: callers check with `check_size` first.
    let length = (head.len() - 5 + payload.len()) as u32;
    head[1..5].copy_from_slice(&length.to_be_bytes());
    [head.freeze(), payload]
}

/// A length-delimited field's key and length.
fn put_bytes_key(out: &mut BytesMut, field: u32, len: usize) {
    put_varint(out, u64::from(field << 3 | 2));
    put_varint(out, len as u64);
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Bytes that arrived as several buffers (HTTP/2 data frames), read from the front.
#[derive(Default)]
pub(crate) struct Chunks {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl Chunks {
    fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        if !chunk.is_empty() {
            self.chunks.push_back(chunk);
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The next `n` bytes: a slice of the buffer holding them, or a copy when they span
    /// buffers; `None` when fewer are left.
    fn take(&mut self, n: usize) -> Option<Bytes> {
        if n > self.len {
            return None;
        }
        self.len -= n;
        match self.chunks.front_mut() {
            Some(first) if first.len() >= n => {
                let taken = first.split_to(n);
                if first.is_empty() {
                    self.chunks.pop_front();
                }
                Some(taken)
            }
            _ => {
                let mut joined = BytesMut::with_capacity(n);
                while joined.len() < n {
                    let first = self.chunks.front_mut()?;
                    let part = first.split_to((n - joined.len()).min(first.len()));
                    joined.extend_from_slice(&part);
                    if first.is_empty() {
                        self.chunks.pop_front();
                    }
                }
                Some(joined.freeze())
            }
        }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
}

/// The length-delimited fields of a protobuf message (numbers 1 and 2, the only kind our
/// messages have), each a slice of the frames where it lies whole; fields of other numbers
/// or wire types are skipped, as protobuf's readers do.
pub(crate) fn fields(mut message: Chunks) -> Result<[Option<Bytes>; 2], tonic::Status> {
    let malformed = |what: &str| tonic::Status::internal(format!("malformed message: {what}"));
    let mut found: [Option<Bytes>; 2] = [None, None];
    while message.len() > 0 {
        let key = message
            .varint()
            .ok_or_else(|| malformed("a truncated key"))?;
        let (field, wire_type) = (key >> 3, key & 7);
        match wire_type {
            0 => {
                message
                    .varint()
                    .ok_or_else(|| malformed("a truncated varint"))?;
            }
            1 | 5 => {
                let width = if wire_type == 1 { 8 } else { 4 };
                message
                    .take(width)
                    .ok_or_else(|| malformed("a truncated fixed-size field"))?;
            }
            2 => {
                let len = message
                    .varint()
                    .and_then(|l| usize::try_from(l).ok())
                    .ok_or_else(|| malformed("a truncated length"))?;
                let value = message
                    .take(len)
                    .ok_or_else(|| malformed("a field longer than its message"))?;
                let slot = (field as usize)
                    .checked_sub(1)
                    .and_then(|i| found.get_mut(i));
                if let Some(slot) = slot {
                    *slot = Some(value);
                }
            }
            _ => return Err(malformed(&format!("wire type {wire_type}"))),
        }
    }
    Ok(found)
}

/// A string field as text.
pub(crate) fn text(field: Option<Bytes>, what: &str) -> Result<String, tonic::Status> {
    String::from_utf8(field.map(Vec::from).unwrap_or_default())
        .map_err(|_| tonic::Status::internal(format!("malformed message: {what} is not UTF-8")))
}

/// Reads the one message of a unary call's body from `stream` (giving the flow-control
/// room back as frames are read): its bytes as the frames carried them, or `None` when the
/// body ended before a whole message (a reply's status then comes in its trailers). Errors:
/// a compressed message (this path does not decompress), one longer than `limit`, a body
/// that carries more than one message.
pub(crate) async fn read_message(
    stream: &mut h2::RecvStream,
    limit: usize,
) -> Result<Option<Chunks>, tonic::Status> {
    let mut got = Chunks::default();
    let mut length = None;
    loop {
        let data = match std::future::poll_fn(|cx| stream.poll_data(cx)).await {
            Some(Ok(data)) => data,
            Some(Err(e)) => return Err(h2_status(&e)),
            None => break,
        };
        let _ = stream.flow_control().release_capacity(data.len());
        got.push(data);
        if length.is_none() && got.len() >= 5 {
            let prefix = got
                .take(5)
                .ok_or_else(|| tonic::Status::internal("a truncated message prefix"))?;
            if prefix[0] != 0 {
                return Err(tonic::Status::unimplemented(
                    "a compressed message on the uncompressed path",
                ));
            }
            let len = (&prefix[1..5]).get_u32() as usize;
            if len > limit {
                return Err(tonic::Status::out_of_range(format!(
                    "a message of {len} bytes is larger than the limit of {limit} bytes"
                )));
            }
            length = Some(len);
        }
        if length.is_some_and(|len| got.len() > len) {
            return Err(tonic::Status::internal(
                "more than one message in a unary call",
            ));
        }
    }
    Ok(match length {
        Some(len) if got.len() == len => Some(got),
        _ => None,
    })
}

/// The error a body that ended before its whole message is.
pub(crate) fn no_message() -> tonic::Status {
    tonic::Status::internal("the body ended before its whole message")
}

/// The error a message longer than gRPC can frame, or than the limit, is.
pub(crate) fn check_size(payload: &Bytes, limit: usize) -> Result<(), tonic::Status> {
    if payload.len() > limit.min(u32::MAX as usize - 4096) {
        return Err(tonic::Status::out_of_range(format!(
            "a message of {} bytes is larger than the limit of {limit} bytes",
            payload.len()
        )));
    }
    Ok(())
}

/// Calls `path` on `channel` with the request `frames` (see [`message`]) and `metadata`,
/// and returns the reply's message as the frames carried it. A failure is the gRPC status
/// the server sent (in the headers or the trailers) or the transport's.
pub(crate) async fn unary(
    channel: &Channel,
    path: &'static str,
    metadata: Option<(&'static str, http::HeaderValue)>,
    frames: [Bytes; 2],
    limit: usize,
) -> Result<Chunks, tonic::Status> {
    let mut request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| tonic::Status::internal(format!("bad request: {e}")))?;
    if let Some((name, value)) = metadata {
        request.headers_mut().insert(name, value);
    }
    let (response, mut send) = channel.start(request, false).await?;
    let [head, payload] = frames;
    let payload_follows = !payload.is_empty();
    let sent = send.send_data(head, !payload_follows).and_then(|()| {
        if payload_follows {
            send.send_data(payload, true)
        } else {
            Ok(())
        }
    });
    if let Err(e) = sent {
        // A server may answer before it reads the request (a wrong token is refused at
        // once) and close the stream: its status says why, the closed stream does not.
        let early = response.await.ok().and_then(|r| {
            tonic::Status::from_header_map(r.headers()).filter(|s| s.code() != tonic::Code::Ok)
        });
        return Err(early.unwrap_or_else(|| h2_status(&e)));
    }
    let response = response.await.map_err(|e| h2_status(&e))?;
    let (parts, mut body) = response.into_parts();
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    if parts.status != http::StatusCode::OK {
        return Err(tonic::Status::unknown(format!(
            "the server answered HTTP {}",
            parts.status
        )));
    }
    // The body read to its end (a failure while reading it leaves frames unread: no
    // trailers to wait for).
    let message = read_message(&mut body, limit).await?;
    let trailers = std::future::poll_fn(|cx| body.poll_trailers(cx))
        .await
        .map_err(|e| h2_status(&e))?;
    match (
        trailers.as_ref().and_then(tonic::Status::from_header_map),
        message,
    ) {
        // A server that failed after its headers says so in the trailers, with no message.
        (Some(status), _) if status.code() != tonic::Code::Ok => Err(status),
        (Some(_), Some(message)) => Ok(message),
        (Some(_), None) => Err(no_message()),
        (None, _) => Err(tonic::Status::internal("the reply had no gRPC status")),
    }
}

/// Answers a unary call through `respond`: `reply` (frames from [`message`]) then an `OK`
/// status in the trailers, or `status` alone, in the headers.
pub(crate) fn respond(
    mut respond: h2::server::SendResponse<Bytes>,
    reply: Result<[Bytes; 2], tonic::Status>,
) {
    let mut response = http::Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    let frames = match reply {
        Ok(frames) => frames,
        Err(status) => {
            if status.add_header(response.headers_mut()).is_ok() {
                let _ = respond.send_response(response, true);
            } else {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
            }
            return;
        }
    };
    // A failure from here on means the caller is gone: nobody to tell.
    let Ok(mut stream) = respond.send_response(response, false) else {
        return;
    };
    let [head, payload] = frames;
    if stream.send_data(head, false).is_err() {
        return;
    }
    if !payload.is_empty() && stream.send_data(payload, false).is_err() {
        return;
    }
    let mut trailers = http::HeaderMap::new();
    if tonic::Status::ok("").add_header(&mut trailers).is_ok() {
        let _ = stream.send_trailers(trailers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&[u8]]) -> Chunks {
        let mut c = Chunks::default();
        for p in parts {
            c.push(Bytes::copy_from_slice(p));
        }
        c
    }

    #[test]
    fn a_message_reads_back_in_any_framing_and_matches_prost() {
        use prost::Message;
        let payload = Bytes::from((0..300u32).map(|i| i as u8).collect::<Vec<u8>>());
        let [head, body] = message(Some("key/1"), payload.clone());
        let wire: Vec<u8> = [&head[..], &body[..]].concat();
        // prost's own encoding of the same message, after the same prefix.
        let reference = crate::server::pb::DeliverRequest {
            key: "key/1".into(),
            payload: payload.clone(),
        }
        .encode_to_vec();
        assert_eq!(&wire[5..], &reference[..]);
        assert_eq!(
            u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize,
            reference.len()
        );
        // Any cut of the message into frames reads back the same fields.
        for cut in [1, 3, 7, 50, reference.len() - 1] {
            let [name, value] = fields(chunks(&[&reference[..cut], &reference[cut..]])).unwrap();
            assert_eq!(text(name, "key").unwrap(), "key/1", "cut {cut}");
            assert_eq!(value.unwrap(), payload, "cut {cut}");
        }
        // A payload alone (CallReply), and an empty one (left out).
        let [head, body] = message(None, payload.clone());
        let wire: Vec<u8> = [&head[5..], &body[..]].concat();
        let reference = crate::server::pb::CallReply {
            payload: payload.clone(),
        }
        .encode_to_vec();
        assert_eq!(wire, reference);
        let [head, body] = message(Some("m"), Bytes::new());
        assert!(body.is_empty());
        let [_, value] = fields(chunks(&[&head[5..]])).unwrap();
        assert_eq!(value, None);
    }

    #[test]
    fn the_payload_is_a_slice_of_the_frame_that_holds_it() {
        let payload = Bytes::from(vec![7u8; 4096]);
        let [head, body] = message(Some("k"), payload.clone());
        let mut c = Chunks::default();
        c.push(head.slice(5..));
        c.push(body.clone());
        let [_, value] = fields(c).unwrap();
        assert_eq!(value.unwrap().as_ptr(), body.as_ptr());
    }

    #[test]
    fn unknown_fields_are_skipped_and_malformed_messages_are_errors() {
        // Field 3 varint, field 4 fixed64, field 5 fixed32, then field 1.
        let mut m = vec![0x18, 0x96, 0x01, 0x21];
        m.extend_from_slice(&[0; 8]);
        m.push(0x2d);
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&[0x0a, 0x02, b'h', b'i']);
        let [name, value] = fields(chunks(&[&m])).unwrap();
        assert_eq!(text(name, "key").unwrap(), "hi");
        assert_eq!(value, None);
        for bad in [
            &[0x0a, 0x05, b'a'][..],
            &[0x0a][..],
            &[0x80][..],
            &[0x0b][..],
            &[0x21, 0][..],
        ] {
            assert!(fields(chunks(&[bad])).is_err(), "{bad:?}");
        }
        assert!(text(Some(Bytes::from_static(&[0xff])), "key").is_err());
    }
}
