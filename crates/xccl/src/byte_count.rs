//! Byte counts as people write them in settings and files: `1048576`, `64K`, `1M`, `2G`.

use crate::error::{Error, Result};

/// Parses `1048576`, `64K`, `1M`, `2G` within `[min, max]`.
pub fn parse_bytes(name: &str, v: &str, min: usize, max: usize) -> Result<usize> {
    let t = v.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|d| d.checked_mul(mult))
        .filter(|b| (min..=max).contains(b))
        .ok_or_else(|| Error::Config(format!("{name}='{v}' is not a byte count between {min} and {max}")))
}

/// A length from which something applies (pulling a message, say), as settings and tuning
/// files write it: a byte count from 1 as [`parse_bytes`] reads it, or `off` for never
/// (`usize::MAX`).
pub(crate) fn parse_threshold(name: &str, v: &str) -> Result<usize> {
    if v.trim() == "off" { Ok(usize::MAX) } else { parse_bytes(name, v, 1, usize::MAX) }
}

/// How [`parse_threshold`] reads `b` back: its bytes, or `off`.
pub(crate) fn threshold_text(b: usize) -> String {
    if b == usize::MAX { "off".to_string() } else { b.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_accept_suffixes() {
        assert_eq!(parse_bytes("X", "3M", 0, usize::MAX).unwrap(), 3 << 20);
        assert_eq!(parse_bytes("X", "17", 0, usize::MAX).unwrap(), 17);
        assert!(parse_bytes("X", "M", 0, usize::MAX).is_err());
        assert!(parse_bytes("X", "99999999999999999999G", 0, usize::MAX).is_err());
    }

    #[test]
    fn thresholds_are_byte_counts_or_off_and_read_back() {
        assert_eq!(parse_threshold("X", " off ").unwrap(), usize::MAX);
        assert_eq!(parse_threshold("X", "64K").unwrap(), 64 << 10);
        assert!(parse_threshold("X", "0").is_err());
        for b in [1, 64 << 10, usize::MAX] {
            assert_eq!(parse_threshold("X", &threshold_text(b)).unwrap(), b);
        }
    }
}
