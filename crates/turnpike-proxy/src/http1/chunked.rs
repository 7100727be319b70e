//! The chunked transfer coding (RFC 9112 §7.1), decoded in place from a connection's read
//! buffer: used for upstream response bodies (`h1.rs`) and client request bodies
//! (`h1_server.rs`) alike.

use std::io;

use bytes::{Bytes, BytesMut};

/// A chunk-size line or trailer line longer than this is refused.
const MAX_LINE: usize = 8 * 1024;

/// Where the decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

/// What the front of the buffer gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    /// The last chunk and the trailer section are read: the body is complete.
    End,
    /// More bytes are needed.
    NeedMore,
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Decodes from the front of `buf`, consuming what it decodes. Trailer fields are dropped.
pub fn decode(buf: &mut BytesMut, state: &mut Chunk) -> io::Result<Decoded> {
    loop {
        match *state {
            Chunk::Data(remaining) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = remaining.min(buf.len() as u64) as usize;
                let data = buf.split_to(n).freeze();
                let left = remaining - n as u64;
                *state = if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                };
                return Ok(Decoded::Data(data));
            }
            Chunk::Size | Chunk::DataEnd | Chunk::Trailers => {
                // These states each consume one line.
                // A line longer than MAX_LINE is refused whether its end has come yet or not
                // (+1: its CR may have come without the LF), so the verdict does not depend on
                // how the bytes were cut into reads.
                let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") else {
                    if buf.len() > MAX_LINE + 1 {
                        return Err(invalid("invalid chunked encoding"));
                    }
                    return Ok(Decoded::NeedMore);
                };
                if pos > MAX_LINE {
                    return Err(invalid("invalid chunked encoding"));
                }
                let line = buf.split_to(pos + 2);
                let line = &line[..pos];
                match *state {
                    Chunk::Size => {
                        let hex = line
                            .split(|b| *b == b';')
                            .next()
                            .unwrap_or(b"")
                            .trim_ascii();
                        // At most 16 hex digits: a u64, never an overflow.
                        if hex.is_empty() || hex.len() > 16 {
                            return Err(invalid("invalid chunk size"));
                        }
                        let size = std::str::from_utf8(hex)
                            .ok()
                            .and_then(|s| u64::from_str_radix(s, 16).ok())
                            .ok_or_else(|| invalid("invalid chunk size"))?;
                        *state = if size == 0 {
                            Chunk::Trailers
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::DataEnd => {
                        if !line.is_empty() {
                            return Err(invalid("invalid chunk terminator"));
                        }
                        *state = Chunk::Size;
                    }
                    _ => {
                        if line.is_empty() {
                            return Ok(Decoded::End);
                        }
                    }
                }
            }
        }
    }
}

/// The last chunk with no trailers: ends a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Appends `data` as one chunk (size line, data, CRLF); nothing for empty data, which would
/// read as the last chunk.
pub fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    push_size_line(out, data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends a chunk-size line: `n` in lower-case hex, then CRLF.
pub fn push_size_line(out: &mut Vec<u8>, n: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes; the data and whether it ended.
    fn run(input: &[u8], step: usize) -> io::Result<(Vec<u8>, bool)> {
        let mut buf = BytesMut::new();
        let mut state = Chunk::Size;
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match decode(&mut buf, &mut state)? {
                    Decoded::Data(d) => out.extend_from_slice(&d),
                    Decoded::End => return Ok((out, true)),
                    Decoded::NeedMore => break,
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn decodes_split_anywhere() {
        let body = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: t\r\n\r\n";
        for step in 1..body.len() {
            assert_eq!(
                run(body, step).unwrap(),
                (b"hello world!".to_vec(), true),
                "step {step}"
            );
        }
    }

    #[test]
    fn encoded_chunks_decode_to_themselves() {
        let mut wire = Vec::new();
        for piece in [&b"a"[..], &[b'z'; 300][..], b"", b"0\r\n\r\n"] {
            encode_chunk(&mut wire, piece);
        }
        wire.extend_from_slice(LAST_CHUNK);
        let mut want = b"a".to_vec();
        want.extend_from_slice(&[b'z'; 300]);
        want.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(run(&wire, 5).unwrap(), (want, true));
    }

    #[test]
    fn refuses_bad_sizes_and_terminators() {
        assert!(run(b"zz\r\n", 64).is_err());
        assert!(run(b"\r\n", 64).is_err());
        assert!(run(b"11111111111111111\r\n", 64).is_err(), "overflow");
        assert!(run(b"2\r\nabX\r\n", 64).is_err());
        assert!(run(&vec![b'1'; MAX_LINE + 2], 64).is_err());
        // A long trailer line is refused however it arrives.
        let mut long = b"0\r\nx: ".to_vec();
        long.extend(std::iter::repeat_n(b'y', MAX_LINE));
        long.extend_from_slice(b"\r\n\r\n");
        assert!(run(&long, long.len()).is_err());
        assert!(run(&long, 7).is_err());
        assert_eq!(run(b"3\r\nab", 64).unwrap(), (b"ab".to_vec(), false));
    }
}
