//! Deflate for a small response body that arrives whole: LZ77 over the body with a small hash
//! table, coded with deflate's fixed Huffman codes (RFC 1951, 3.2.6), in one final block.
//!
//! zlib-rs clears its 128 KiB hash table for every stream (and 48 KiB of block state): for a
//! 100-byte body that was 181,000 of the 207,000 instructions gzip added, against nginx's
//! 42,000 for the whole response (nginx sizes zlib's window and hash to the Content-Length).
//! Here the table is 2 KiB and the work is per byte. A small body's dynamic Huffman tables
//! would cost about what they save, which is why zlib itself codes short blocks with the fixed
//! codes. Bodies above [`MAX`] and streamed bodies keep zlib-rs.

/// The largest body coded here (a whole body within one deflate window is required: 32 KiB).
pub const MAX: usize = 8 * 1024;

const HASH_BITS: u32 = 10;
const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;

/// Bits written least significant first, as deflate packs them.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, which deflate writes most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        self.put(code.reverse_bits() >> (32 - len), len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// The fixed literal/length codes (RFC 1951, 3.2.6), bit-reversed as they are written, with
/// their lengths: made once, at compile time.
const LITERALS: [(u16, u8); 288] = {
    let mut t = [(0u16, 0u8); 288];
    let mut s = 0;
    while s < 288 {
        let (code, len) = match s {
            0..=143 => (0x30 + s, 8),
            144..=255 => (0x190 + (s - 144), 9),
            256..=279 => (s - 256, 7),
            _ => (0xC0 + (s - 280), 8),
        };
        t[s as usize] = (
            ((code as u32).reverse_bits() >> (32 - len)) as u16,
            len as u8,
        );
        s += 1;
    }
    t
};

/// The fixed literal/length code of symbol `s` (0..=287).
#[inline]
fn literal(bits: &mut Bits, s: u32) {
    let (code, len) = LITERALS[s as usize];
    bits.put(u32::from(code), u32::from(len));
}

/// How many bytes `a` and `b` have in common from their start (eight at a time).
#[inline]
fn common(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or([0; 8]));
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if x != y {
            return i + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Length base values and extra bits, for symbols 257..=285.
const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

fn emit_match(bits: &mut Bits, len: usize, dist: usize) {
    let l = LENGTH_BASE.partition_point(|&b| usize::from(b) <= len) - 1;
    literal(bits, 257 + l as u32);
    if LENGTH_EXTRA[l] > 0 {
        bits.put(
            (len - usize::from(LENGTH_BASE[l])) as u32,
            u32::from(LENGTH_EXTRA[l]),
        );
    }
    let d = DIST_BASE.partition_point(|&b| usize::from(b) <= dist) - 1;
    // Distance codes are fixed 5-bit codes.
    bits.code(d as u32, 5);
    if DIST_EXTRA[d] > 0 {
        bits.put(
            (dist - usize::from(DIST_BASE[d])) as u32,
            u32::from(DIST_EXTRA[d]),
        );
    }
}

fn hash(b: &[u8]) -> usize {
    let v = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    (v.wrapping_mul(0x9E37_79B1) >> (32 - HASH_BITS)) as usize
}

/// `input` (at most [`MAX`] bytes) as one final fixed-code deflate block.
pub fn deflate(input: &[u8]) -> Vec<u8> {
    debug_assert!(input.len() <= MAX);
    let mut bits = Bits {
        out: Vec::with_capacity(input.len() / 2 + 16),
        acc: 0,
        n: 0,
    };
    // BFINAL = 1, BTYPE = 01 (fixed codes).
    bits.put(0b011, 3);
    // Positions + 1 (0: empty).
    let mut table = [0u16; 1 << HASH_BITS];
    let n = input.len();
    let mut i = 0;
    while i < n {
        if i + MIN_MATCH <= n {
            let h = hash(&input[i..]);
            let cand = usize::from(table[h]);
            table[h] = (i + 1) as u16;
            if cand > 0 {
                let c = cand - 1;
                let limit = (n - i).min(MAX_MATCH);
                let len = common(&input[c..], &input[i..i + limit]);
                if len >= MIN_MATCH {
                    emit_match(&mut bits, len, i - c);
                    // The positions inside the match go into the table too (better matches
                    // after it, at a few instructions a byte).
                    let end = i + len;
                    i += 1;
                    while i < end {
                        if i + MIN_MATCH <= n {
                            table[hash(&input[i..])] = (i + 1) as u16;
                        }
                        i += 1;
                    }
                    continue;
                }
            }
        }
        literal(&mut bits, u32::from(input[i]));
        i += 1;
    }
    literal(&mut bits, 256);
    bits.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn inflate(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::DeflateDecoder::new(data)
            .read_to_end(&mut out)
            .expect("a valid deflate stream");
        out
    }

    fn json(n: usize) -> Vec<u8> {
        let mut s = String::new();
        let mut i = 0;
        while s.len() < n {
            s.push_str(&format!(
                "{{\"id\": {i}, \"name\": \"item-{}\", \"status\": \"active\", \"tags\": [\"a\", \"b\"]}}\n",
                i * 7 % 1000
            ));
            i += 1;
        }
        s.truncate(n);
        s.into_bytes()
    }

    #[test]
    fn what_it_writes_inflates_to_the_input() {
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"a".to_vec(),
            b"ab".to_vec(),
            b"abc".to_vec(),
            vec![b'x'; MAX],
            vec![0; 259],
            vec![255; 1000],
            json(100),
            json(4096),
            json(MAX),
        ];
        // Every byte value, and pseudo-random bytes (nothing to match).
        cases.push((0..=255u8).cycle().take(3000).collect());
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        cases.push(
            (0..MAX)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect(),
        );
        // Repeats at every distance and length class.
        for period in [1usize, 2, 3, 5, 31, 257, 1025, 4097] {
            cases.push((0..MAX).map(|i| (i % period) as u8).collect());
        }
        for c in &cases {
            assert_eq!(inflate(&deflate(c)), *c, "{} bytes", c.len());
        }
    }

    #[test]
    fn small_json_compresses_about_as_well_as_zlib_level_1() {
        use std::io::Write;
        for n in [100, 1024, 4096, MAX] {
            let body = json(n);
            let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(1));
            z.write_all(&body).unwrap();
            let zlib = z.finish().unwrap().len();
            let ours = deflate(&body).len();

            assert!(
                ours as f64 <= zlib as f64 * 1.25 + 8.0,
                "{n} bytes: {ours} against zlib's {zlib}"
            );
        }
    }
}
