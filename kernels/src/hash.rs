//! FNV-1a, 64 bit: a hash whose value never changes across Rust versions or platforms
//! (std's `DefaultHasher` makes no such promise), for keys written to disk.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// An incremental FNV-1a 64 hasher.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Self {
        Self(OFFSET)
    }

    /// Hashes raw bytes.
    pub(crate) fn bytes(&mut self, data: &[u8]) -> &mut Self {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
        self
    }

    /// Hashes a field with its length first, so that ("ab", "c") and ("a", "bc") differ.
    pub(crate) fn field(&mut self, data: &[u8]) -> &mut Self {
        self.bytes(&(data.len() as u64).to_le_bytes()).bytes(data)
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// The FNV-1a 64 hash of `data`.
pub(crate) fn fnv64(data: &[u8]) -> u64 {
    Fnv64::new().bytes(data).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_test_vectors() {
        assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fields_are_delimited() {
        let ab_c = Fnv64::new().field(b"ab").field(b"c").finish();
        let a_bc = Fnv64::new().field(b"a").field(b"bc").finish();
        assert_ne!(ab_c, a_bc);
    }
}
