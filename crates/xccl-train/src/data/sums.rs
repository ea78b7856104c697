//! The embedded task: addition written as text, `"123+456=9750"`.
//!
//! Operands have a fixed number of digits (zero-padded) and the sum is written with its
//! digits reversed (least significant first, `digits + 1` of them), so each answer digit
//! depends only on digits already seen and a carry: a small model learns it in minutes on a
//! CPU. The loss counts only the answer tokens. A fixed eighth of all problems (by a hash of
//! the operands) is held out and never trained on; accuracy is the fraction of 500 held-out
//! problems whose whole answer is right under greedy decoding.

use candle_core::{D, IndexOp};
use rand::RngExt;

use super::{Batch, Evaluation, Task, stream};
use crate::error::{Error, Result};
use crate::model::{Model, ids_tensor};

const PLUS: u32 = 10;
const EQUALS: u32 = 11;
/// Held-out problems evaluated.
const EVAL_PROBLEMS: usize = 500;
/// Stream of the evaluation problems (the same for every seed).
const EVAL_STREAM: u64 = 0xe7a1;

/// Addition of two `digits`-digit numbers.
#[derive(Clone, Debug)]
pub struct Sums {
    digits: usize,
    /// 10^digits.
    range: u64,
}

impl Sums {
    /// The task on `digits`-digit operands (1 to 9).
    pub fn new(digits: usize) -> Result<Sums> {
        if !(1..=9).contains(&digits) {
            return Err(Error::config(format!("sums need 1 to 9 digits per operand, not {digits}")));
        }
        Ok(Sums { digits, range: 10u64.pow(digits as u32) })
    }

    /// Whether `a + b` is held out for evaluation.
    pub fn held_out(&self, a: u64, b: u64) -> bool {
        let mut h = (a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
        h.is_multiple_of(8)
    }

    /// The tokens of `a+b=reversed(a+b)`: `3·digits + 3` of them.
    pub fn tokens(&self, a: u64, b: u64) -> Vec<u32> {
        let d = self.digits;
        let mut t = Vec::with_capacity(3 * d + 3);
        let digits = |mut x: u64, n: usize| {
            let mut v = vec![0u32; n];
            for slot in v.iter_mut().rev() {
                *slot = (x % 10) as u32;
                x /= 10;
            }
            v
        };
        t.extend(digits(a, d));
        t.push(PLUS);
        t.extend(digits(b, d));
        t.push(EQUALS);
        t.extend(digits(a + b, d + 1).into_iter().rev());
        t
    }

    /// Position (in the input row) of the `=` sign; the answer is predicted from here on.
    fn equals_at(&self) -> usize {
        2 * self.digits + 1
    }

    /// Renders tokens as text.
    pub fn render(tokens: &[u32]) -> String {
        tokens
            .iter()
            .map(|&t| match t {
                PLUS => '+',
                EQUALS => '=',
                d => char::from_digit(d, 10).unwrap_or('?'),
            })
            .collect()
    }

    fn pair(&self, rng: &mut impl rand::Rng, held_out: bool) -> (u64, u64) {
        loop {
            let a = rng.random_range(0..self.range);
            let b = rng.random_range(0..self.range);
            if self.held_out(a, b) == held_out {
                return (a, b);
            }
        }
    }
}

impl Task for Sums {
    fn vocab(&self) -> usize {
        12
    }

    fn seq_len(&self) -> usize {
        3 * self.digits + 2
    }

    fn describe(&self) -> String {
        format!("sums digits={} (answers reversed)", self.digits)
    }

    fn batch(&self, seed: u64, step: u64, rows: usize) -> Batch {
        let mut rng = stream(&[seed, step]);
        let len = self.seq_len();
        let mut batch = Batch { rows, len, ids: Vec::new(), targets: Vec::new(), mask: Vec::new() };
        for _ in 0..rows {
            let (a, b) = self.pair(&mut rng, false);
            let t = self.tokens(a, b);
            batch.ids.extend(&t[..len]);
            batch.targets.extend(&t[1..]);
            batch.mask.extend((0..len).map(|i| if i >= self.equals_at() { 1.0 } else { 0.0 }));
        }
        batch
    }

    fn evaluate(&self, model: &Model) -> Result<Evaluation> {
        let mut rng = stream(&[EVAL_STREAM, self.digits as u64]);
        let problems: Vec<Vec<u32>> = (0..EVAL_PROBLEMS)
            .map(|_| {
                let (a, b) = self.pair(&mut rng, true);
                self.tokens(a, b)
            })
            .collect();
        let len = self.seq_len();
        let start = self.equals_at();
        // Inputs: the prompt up to '=', then the model's own answer digits as they come.
        let mut ids: Vec<u32> = problems
            .iter()
            .flat_map(|p| p[..len].iter().enumerate().map(|(i, &t)| if i > start { 0 } else { t }))
            .collect();
        let mut answers = vec![Vec::new(); problems.len()];
        for pos in start..len {
            let logits = model.logits(&ids_tensor(&ids, problems.len(), len)?)?;
            let next = logits.i((.., pos, ..))?.argmax(D::Minus1)?.to_vec1::<u32>()?;
            for (row, &tok) in next.iter().enumerate() {
                answers[row].push(tok);
                if pos + 1 < len {
                    ids[row * len + pos + 1] = tok;
                }
            }
        }
        let right: Vec<bool> = problems.iter().zip(&answers).map(|(p, a)| p[start + 1..] == a[..]).collect();
        let examples = problems
            .iter()
            .zip(&answers)
            .zip(&right)
            .take(4)
            .map(|((p, a), ok)| {
                let forward = |x: &[u32]| Sums::render(&x.iter().rev().copied().collect::<Vec<_>>());
                let verdict = if *ok { "right" } else { "wrong" };
                format!(
                    "{} = {} ({verdict}, reversed: {})",
                    Sums::render(&p[..start]),
                    forward(a),
                    Sums::render(a)
                )
            })
            .collect();
        Ok(Evaluation {
            accuracy: right.iter().filter(|&&r| r).count() as f64 / problems.len() as f64,
            measure: format!("of {} held-out sums answered exactly (greedy decoding)", problems.len()),
            examples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_written_with_reversed_answers() {
        let s = Sums::new(3).unwrap();
        assert_eq!(Sums::render(&s.tokens(123, 456)), "123+456=9750");
        assert_eq!(Sums::render(&s.tokens(999, 1)), "999+001=0001");
        let b = s.batch(7, 3, 5);
        assert_eq!((b.rows, b.len, b.ids.len()), (5, 11, 55));
        assert_eq!(b.counted(), 5 * 4);
        assert_eq!(b, s.batch(7, 3, 5));
        assert_ne!(b, s.batch(7, 4, 5));
        // Training never draws a held-out problem.
        for row in 0..5 {
            let r = &b.ids[row * 11..row * 11 + 7];
            let num = |d: &[u32]| d.iter().fold(0u64, |x, &t| 10 * x + u64::from(t));
            assert!(!s.held_out(num(&r[..3]), num(&r[4..7])));
        }
        assert!(Sums::new(0).is_err());
    }
}
