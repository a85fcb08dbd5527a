//! Integer lookup and hashing preprocessing layers: IntegerLookup and Hashing (TF 2.4's
//! `tf.keras.layers.experimental.preprocessing`), on integer tensors (ferroflow has no
//! string dtype).

use std::collections::HashMap;

use ferroflow_tensor::{DType, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{cfg_usize, Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::expect_inputs;

/// The input's values as i64 (integer dtypes only), or an error naming the layer.
fn int_values(class: &str, x: &Tensor) -> Result<Vec<i64>> {
    if !x.dtype().is_int() {
        return Err(Error::invalid(
            "Layer.call",
            format!("{class} needs integer inputs, got {}", x.dtype()),
        ));
    }
    x.cast(DType::I64)?.to_vec::<i64>()
}

/// An optional integer config value (`null` or absent: `None`).
fn opt_i64(c: &Value, key: &str) -> Option<i64> {
    c.get(key).and_then(Value::as_i64)
}

/// `IntegerLookup`: maps integers to indices in a vocabulary. Index 0 is the mask value's
/// (when there is one), then `num_oov_indices` indices for values outside the vocabulary
/// (several are picked by `value mod num_oov_indices`), then the vocabulary in order. With
/// `invert`, indices map back to values (out-of-vocabulary indices to `oov_value`). TF 2.4's
/// defaults: mask value 0, one OOV index, OOV value -1. Outputs int64.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::IntegerLookup, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut lookup = IntegerLookup::new(&[12, 36, 1138, 42])?;
/// let x = Tensor::from_vec(vec![12i64, 1138, 0, 7], &[4])?;
/// assert_eq!(lookup.forward(&x, false)?.to_vec::<i64>()?, vec![2, 4, 0, 1]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct IntegerLookup {
    base: LayerBase,
    vocabulary: Vec<i64>,
    index: HashMap<i64, usize>,
    /// The value that maps to index 0 (`None`: no mask index).
    pub mask_value: Option<i64>,
    /// How many indices out-of-vocabulary values share.
    pub num_oov_indices: usize,
    /// What `invert` gives for an out-of-vocabulary index.
    pub oov_value: i64,
    /// Indices to values instead of values to indices.
    pub invert: bool,
}

impl IntegerLookup {
    /// A lookup of `vocabulary` (distinct values, none equal to the mask value 0) with TF
    /// 2.4's defaults.
    pub fn new(vocabulary: &[i64]) -> Result<IntegerLookup> {
        IntegerLookup::with_options(vocabulary, Some(0), 1, -1, false)
    }
    /// Every option.
    pub fn with_options(
        vocabulary: &[i64],
        mask_value: Option<i64>,
        num_oov_indices: usize,
        oov_value: i64,
        invert: bool,
    ) -> Result<IntegerLookup> {
        let mut index = HashMap::with_capacity(vocabulary.len());
        for (i, &v) in vocabulary.iter().enumerate() {
            if Some(v) == mask_value {
                return Err(Error::invalid(
                    "IntegerLookup",
                    format!("the vocabulary contains the mask value {v}"),
                ));
            }
            if index.insert(v, i).is_some() {
                return Err(Error::invalid(
                    "IntegerLookup",
                    format!("the vocabulary repeats {v}"),
                ));
            }
        }
        if invert && num_oov_indices != 1 {
            // TF too: an inverted lookup has one OOV value to give.
            return Err(Error::invalid(
                "IntegerLookup",
                format!("invert needs num_oov_indices = 1, got {num_oov_indices}"),
            ));
        }
        Ok(IntegerLookup {
            base: LayerBase::new("integer_lookup", None),
            vocabulary: vocabulary.to_vec(),
            index,
            mask_value,
            num_oov_indices,
            oov_value,
            invert,
        })
    }
    /// The vocabulary, in index order.
    pub fn vocabulary(&self) -> &[i64] {
        &self.vocabulary
    }
    /// How many indices there are: mask, OOV and vocabulary (`vocabulary_size()`).
    pub fn vocabulary_size(&self) -> usize {
        self.first_vocab_index() + self.vocabulary.len()
    }
    fn first_vocab_index(&self) -> usize {
        self.mask_value.is_some() as usize + self.num_oov_indices
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config: `mask_token`/`oov_token`
    /// or TF 2.4's `mask_value`/`oov_value`).
    pub fn from_config(c: &Value) -> Result<IntegerLookup> {
        let bad = |msg: String| Error::format("IntegerLookup config", msg);
        if let Some(mode) = c.get("output_mode").and_then(Value::as_str) {
            if mode != "int" {
                return Err(bad(format!(
                    "output_mode {mode:?} is not supported (ferroflow has \"int\")"
                )));
            }
        }
        let vocab = c
            .get("vocabulary")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("needs a vocabulary list (adapt is not supported)".into()))?
            .iter()
            .map(Value::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| bad("the vocabulary must be integers".into()))?;
        let mask = if c.get("mask_token").is_some() {
            opt_i64(c, "mask_token")
        } else if c.get("mask_value").is_some() {
            opt_i64(c, "mask_value")
        } else {
            Some(0)
        };
        let oov = opt_i64(c, "oov_token")
            .or_else(|| opt_i64(c, "oov_value"))
            .unwrap_or(-1);
        let num_oov = match c.get("num_oov_indices") {
            None => 1,
            Some(_) => cfg_usize(c, "IntegerLookup", "num_oov_indices")?,
        };
        let invert = c.get("invert").and_then(Value::as_bool).unwrap_or(false);
        IntegerLookup::with_options(&vocab, mask, num_oov, oov, invert)
    }
}

impl Layer for IntegerLookup {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("IntegerLookup");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let values = int_values("IntegerLookup", x)?;
        let first = self.first_vocab_index();
        let mask_index = self.mask_value.map(|_| 0usize);
        let out: Vec<i64> = if self.invert {
            values
                .iter()
                .map(|&i| {
                    if i >= first as i64 && i < self.vocabulary_size() as i64 {
                        self.vocabulary[i as usize - first]
                    } else if mask_index == Some(i as usize) && i == 0 {
                        self.mask_value.unwrap_or(self.oov_value)
                    } else {
                        self.oov_value
                    }
                })
                .collect()
        } else {
            let oov_start = self.mask_value.is_some() as i64;
            values
                .iter()
                .map(|&v| {
                    if Some(v) == self.mask_value {
                        0
                    } else if let Some(&i) = self.index.get(&v) {
                        (first + i) as i64
                    } else if self.num_oov_indices == 0 {
                        // No OOV index: TF fails on unknown values.
                        -1
                    } else {
                        oov_start + v.rem_euclid(self.num_oov_indices as i64)
                    }
                })
                .collect()
        };
        if !self.invert && self.num_oov_indices == 0 {
            if let Some(pos) = out.iter().position(|&i| i < 0) {
                return Err(Error::invalid(
                    "IntegerLookup",
                    format!(
                        "{} is not in the vocabulary and num_oov_indices is 0",
                        values[pos]
                    ),
                ));
            }
        }
        Ok(vec![Tensor::from_vec(out, x.shape())?])
    }
    fn get_config(&self) -> Value {
        json!({
            "vocabulary": self.vocabulary,
            "mask_token": self.mask_value,
            "oov_token": self.oov_value,
            "num_oov_indices": self.num_oov_indices,
            "invert": self.invert,
            "output_mode": "int",
        })
    }
}

/// `Hashing`: each integer's decimal text hashed with FarmHash's `Fingerprint64` into
/// `num_bins` bins (TF's `as_string` then `string_to_hash_bucket_fast`); with a mask value,
/// it gets bin 0 and the others bins `1..num_bins`. Outputs int64. TF's keyed `salt` is not
/// supported.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Hashing, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut h = Hashing::new(7)?;
/// let x = Tensor::from_vec(vec![1i64, 22, 333], &[3])?;
/// assert_eq!(h.forward(&x, false)?.to_vec::<i64>()?, vec![5, 1, 5]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Hashing {
    base: LayerBase,
    /// The number of bins (mask bin included).
    pub num_bins: usize,
    /// The value hashed to bin 0, if any.
    pub mask_value: Option<i64>,
}

impl Hashing {
    /// Hashing into `num_bins` bins (at least 1; at least 2 with a mask value).
    pub fn new(num_bins: usize) -> Result<Hashing> {
        Hashing::with_mask(num_bins, None)
    }
    /// Hashing with a mask value that gets bin 0.
    pub fn with_mask(num_bins: usize, mask_value: Option<i64>) -> Result<Hashing> {
        let least = 1 + mask_value.is_some() as usize;
        if num_bins < least {
            return Err(Error::invalid(
                "Hashing",
                format!("num_bins must be at least {least}, got {num_bins}"),
            ));
        }
        Ok(Hashing {
            base: LayerBase::new("hashing", None),
            num_bins,
            mask_value,
        })
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<Hashing> {
        if c.get("salt").is_some_and(|s| !s.is_null()) {
            return Err(Error::format(
                "Hashing config",
                "a salt (keyed SipHash) is not supported",
            ));
        }
        if let Some(mode) = c.get("output_mode").and_then(Value::as_str) {
            if mode != "int" {
                return Err(Error::format(
                    "Hashing config",
                    format!("output_mode {mode:?} is not supported (ferroflow has \"int\")"),
                ));
            }
        }
        Hashing::with_mask(
            cfg_usize(c, "Hashing", "num_bins")?,
            opt_i64(c, "mask_value"),
        )
    }
}

impl Layer for Hashing {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("Hashing");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = &inputs[0];
        let values = int_values("Hashing", x)?;
        let least = 1 + self.mask_value.is_some() as usize;
        if self.num_bins < least {
            return Err(Error::invalid(
                "Hashing",
                format!("num_bins must be at least {least}, got {}", self.num_bins),
            ));
        }
        let out = values
            .iter()
            .map(|&v| {
                // An i64's decimal text is at most 20 bytes: always hashed.
                let hash = fingerprint64(v.to_string().as_bytes())
                    .ok_or_else(|| Error::invalid("Hashing", format!("cannot hash {v}")))?;
                Ok(match self.mask_value {
                    Some(m) if m == v => 0,
                    Some(_) => 1 + (hash % (self.num_bins as u64 - 1)) as i64,
                    None => (hash % self.num_bins as u64) as i64,
                })
            })
            .collect::<Result<Vec<i64>>>()?;
        Ok(vec![Tensor::from_vec(out, x.shape())?])
    }
    fn get_config(&self) -> Value {
        json!({ "num_bins": self.num_bins, "mask_value": self.mask_value, "salt": null, "output_mode": "int" })
    }
}

// FarmHash's Fingerprint64 (farmhashna::Hash64) for keys of up to 32 bytes: what TF's
// `string_to_hash_bucket_fast` computes, here for the decimal text of an i64 (≤ 20 bytes).
const K0: u64 = 0xc3a5_c85c_97cb_3127;
const K1: u64 = 0xb492_b66f_be98_f273;
const K2: u64 = 0x9ae1_6a3b_2f90_404f;

fn fetch64(s: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(b)
}

fn fetch32(s: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&s[at..at + 4]);
    u32::from_le_bytes(b) as u64
}

fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

fn hash_len16(u: u64, v: u64, mul: u64) -> u64 {
    let mut a = (u ^ v).wrapping_mul(mul);
    a ^= a >> 47;
    let mut b = (v ^ a).wrapping_mul(mul);
    b ^= b >> 47;
    b.wrapping_mul(mul)
}

/// `None` for keys longer than 32 bytes (not implemented: never needed here).
fn fingerprint64(s: &[u8]) -> Option<u64> {
    let len = s.len() as u64;
    Some(match s.len() {
        0 => K2,
        1..=3 => {
            let (a, b, c) = (s[0] as u32, s[s.len() >> 1] as u32, s[s.len() - 1] as u32);
            let y = a.wrapping_add(b << 8);
            let z = (len as u32).wrapping_add(c << 2);
            shift_mix((y as u64).wrapping_mul(K2) ^ (z as u64).wrapping_mul(K0)).wrapping_mul(K2)
        }
        4..=7 => {
            let mul = K2.wrapping_add(len.wrapping_mul(2));
            let a = fetch32(s, 0);
            hash_len16(len.wrapping_add(a << 3), fetch32(s, s.len() - 4), mul)
        }
        8..=16 => {
            let mul = K2.wrapping_add(len.wrapping_mul(2));
            let a = fetch64(s, 0).wrapping_add(K2);
            let b = fetch64(s, s.len() - 8);
            let c = b.rotate_right(37).wrapping_mul(mul).wrapping_add(a);
            let d = a.rotate_right(25).wrapping_add(b).wrapping_mul(mul);
            hash_len16(c, d, mul)
        }
        17..=32 => {
            let mul = K2.wrapping_add(len.wrapping_mul(2));
            let a = fetch64(s, 0).wrapping_mul(K1);
            let b = fetch64(s, 8);
            let c = fetch64(s, s.len() - 8).wrapping_mul(mul);
            let d = fetch64(s, s.len() - 16).wrapping_mul(K2);
            hash_len16(
                a.wrapping_add(b)
                    .rotate_right(43)
                    .wrapping_add(c.rotate_right(30))
                    .wrapping_add(d),
                a.wrapping_add(b.wrapping_add(K2).rotate_right(18))
                    .wrapping_add(c),
                mul,
            )
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::fingerprint64;

    #[test]
    fn fingerprint64_matches_tensorflows_hash_buckets() {
        // tf.strings.to_hash_bucket_fast([...], 2**62) in TF 2.21 (Fingerprint64 mod 2^62).
        let m = 1u64 << 62;
        let f = |s: &[u8]| fingerprint64(s).unwrap() % m;
        assert_eq!(f(b"1"), 80785766752259041);
        assert_eq!(f(b"abcdefgh"), 4533385575889643785);
        assert_eq!(f(b"12345678901234567890"), 3955017958199149845);
        assert_eq!(fingerprint64(&[b'x'; 33]), None);
    }
}
