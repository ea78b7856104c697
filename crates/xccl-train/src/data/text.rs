//! Any UTF-8 text file as a next-token task, byte- or character-level.
//!
//! The first 90% of the tokens are for training (random windows of the row length, the loss
//! on every position); the rest is held out, and accuracy is the fraction of held-out next
//! tokens the model predicts (top-1) over up to 64 windows spread over it.

use std::path::{Path, PathBuf};

use candle_core::D;
use rand::RngExt;

use super::{Batch, Evaluation, Task, shares, stream};
use crate::error::{Error, Result};
use crate::model::{Model, ids_tensor};

/// Held-out windows evaluated at most.
const EVAL_WINDOWS: usize = 64;

/// A text file's tokens.
#[derive(Clone, Debug)]
pub struct Text {
    path: PathBuf,
    tokens: Vec<u32>,
    /// The characters of a character-level vocabulary, by id; empty for bytes.
    chars: Vec<char>,
    /// Tokens before this index are for training, the rest held out.
    split: usize,
    len: usize,
    /// FNV-1a hash of the file's bytes.
    hash: u64,
}

impl Text {
    /// Reads `path` as UTF-8 text for rows of `len` tokens.
    pub fn load(path: &Path, byte_level: bool, len: usize) -> Result<Text> {
        let bad = |msg: String| Error::Data { path: path.to_path_buf(), msg };
        let bytes = std::fs::read(path).map_err(|e| {
            bad(format!("cannot read it ({e}); --data takes the path of an existing UTF-8 text file"))
        })?;
        if bytes.is_empty() {
            return Err(bad("the file is empty; --data needs a text file with some content".into()));
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            bad(format!(
                "not UTF-8 text (invalid byte sequence at byte {}); convert it to UTF-8 first",
                e.valid_up_to()
            ))
        })?;
        let (tokens, chars) = if byte_level {
            (bytes.iter().map(|&b| u32::from(b)).collect::<Vec<_>>(), Vec::new())
        } else {
            let mut chars: Vec<char> = text.chars().collect();
            chars.sort_unstable();
            chars.dedup();
            let tokens =
                text.chars().filter_map(|c| chars.binary_search(&c).ok().map(|i| i as u32)).collect();
            (tokens, chars)
        };
        let n = tokens.len();
        let held = (n / 10).max(len + 1);
        if len == 0 || n < held + len + 1 {
            return Err(bad(format!(
                "too short: {n} tokens, and rows of {len} tokens need at least {} (90% to train on, \
                 10% held out, each at least one row plus one); give a longer file or a smaller --context",
                2 * (len + 1)
            )));
        }
        let hash = bytes
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        Ok(Text { path: path.to_path_buf(), tokens, chars, split: n - held, len, hash })
    }

    /// The tokens of the file.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn render(&self, tokens: &[u32]) -> String {
        if self.chars.is_empty() {
            let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            tokens.iter().filter_map(|&t| self.chars.get(t as usize)).collect()
        }
    }

    fn window(&self, batch: &mut Batch, start: usize) {
        let w = &self.tokens[start..start + self.len + 1];
        batch.ids.extend(&w[..self.len]);
        batch.targets.extend(&w[1..]);
        batch.mask.extend(std::iter::repeat_n(1.0, self.len));
    }
}

impl Task for Text {
    fn vocab(&self) -> usize {
        if self.chars.is_empty() { 256 } else { self.chars.len() }
    }

    fn seq_len(&self) -> usize {
        self.len
    }

    fn describe(&self) -> String {
        let level = if self.chars.is_empty() { "bytes" } else { "chars" };
        format!(
            "text {} ({} tokens, {level}, vocabulary {}, fnv {:016x})",
            self.path.display(),
            self.tokens.len(),
            self.vocab(),
            self.hash
        )
    }

    fn batch(&self, seed: u64, step: u64, rows: usize) -> Batch {
        let mut rng = stream(&[seed, step]);
        let mut batch = Batch { rows, len: self.len, ids: Vec::new(), targets: Vec::new(), mask: Vec::new() };
        for _ in 0..rows {
            let start = rng.random_range(0..=self.split - self.len - 1);
            self.window(&mut batch, start);
        }
        batch
    }

    fn evaluate(&self, model: &Model) -> Result<Evaluation> {
        let held = self.tokens.len() - self.split;
        let windows = (held / (self.len + 1)).clamp(1, EVAL_WINDOWS);
        let mut batch =
            Batch { rows: windows, len: self.len, ids: Vec::new(), targets: Vec::new(), mask: Vec::new() };
        for part in shares(held - self.len - 1, windows) {
            self.window(&mut batch, self.split + part.start);
        }
        let logits = model.logits(&ids_tensor(&batch.ids, batch.rows, batch.len)?)?;
        let predicted = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?;
        let right = predicted.iter().zip(&batch.targets).filter(|(p, t)| p == t).count();
        let examples = (0..windows.min(2))
            .map(|r| {
                let row = r * self.len..(r + 1) * self.len;
                format!(
                    "text {:?} -> predicted next tokens {:?}",
                    self.render(&batch.ids[row.clone()]),
                    self.render(&predicted[row])
                )
            })
            .collect();
        Ok(Evaluation {
            accuracy: right as f64 / predicted.len().max(1) as f64,
            measure: format!("of {} held-out next tokens predicted (top-1)", predicted.len()),
            examples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xccl-train-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let missing = Text::load(Path::new("/nonexistent/xccl.txt"), false, 8).unwrap_err().to_string();
        assert!(missing.contains("cannot read"), "{missing}");
        let empty = Text::load(&file("empty.txt", b""), false, 8).unwrap_err().to_string();
        assert!(empty.contains("empty"), "{empty}");
        let binary = Text::load(&file("bin.txt", b"abc\xff\xfe"), true, 2).unwrap_err().to_string();
        assert!(binary.contains("not UTF-8") && binary.contains("byte 3"), "{binary}");
        let short =
            Text::load(&file("short.txt", "héllo wörld".as_bytes()), false, 8).unwrap_err().to_string();
        assert!(short.contains("too short"), "{short}");
    }

    #[test]
    fn windows_come_from_the_training_part() {
        let text = "the quick brown fox jumps over the lazy dog. ".repeat(20);
        let t = Text::load(&file("fox.txt", text.as_bytes()), false, 16).unwrap();
        assert_eq!(t.vocab(), 28);
        let b = t.batch(1, 2, 4);
        assert_eq!(b.ids.len(), 64);
        assert_eq!(b.counted(), 64);
        assert_eq!(&b.ids[1..16], &b.targets[..15]);
        assert_eq!(t.render(&t.tokens()[..9]), "the quick");
        let bytes = Text::load(&file("fox.txt", text.as_bytes()), true, 16).unwrap();
        assert_eq!(bytes.vocab(), 256);
    }
}
