//! Recurrent layers: SimpleRNN, LSTM and GRU (TF 2 defaults: sigmoid recurrent activation,
//! orthogonal recurrent kernels, LSTM forget-gate bias 1, GRU `reset_after`), and
//! MultiHeadAttention. All are composed from differentiable ops, so tapes see through them.

use ferroflow_tensor::{Error, Result, Tensor, Variable};
use serde_json::{json, Value};

use crate::activations::Activation as Act;
use crate::initializers::Initializer;
use crate::layer::{cfg_usize, Layer, LayerBase};
use crate::layers::core::layer_base;

/// Which recurrent cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Simple,
    Lstm,
    Gru,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Simple => 1,
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
}

/// The shared machinery of the three recurrent layers.
struct Recurrent {
    base: LayerBase,
    cell: Cell,
    units: usize,
    return_sequences: bool,
    go_backwards: bool,
    activation: Act,
    kernel: Option<Variable>,
    recurrent: Option<Variable>,
    bias: Option<Variable>,
}

impl Recurrent {
    fn new(prefix: &str, cell: Cell, units: usize) -> Recurrent {
        Recurrent {
            base: LayerBase::new(prefix, None),
            cell,
            units,
            return_sequences: false,
            go_backwards: false,
            activation: Act::Tanh,
            kernel: None,
            recurrent: None,
            bias: None,
        }
    }

    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let f = match s.first().map(Vec::as_slice) {
            Some(&[_, _, f]) => f,
            other => {
                return Err(Error::invalid(
                    "RNN",
                    format!("expects [batch, timesteps, features], got {other:?}"),
                ))
            }
        };
        let g = self.cell.gates() * self.units;
        self.kernel = Some(self.base.add_weight(
            "kernel",
            &[f, g],
            &Initializer::GlorotUniform { seed: None },
            true,
            None,
        )?);
        self.recurrent = Some(self.base.add_weight(
            "recurrent_kernel",
            &[self.units, g],
            &Initializer::Orthogonal {
                gain: 1.0,
                seed: None,
            },
            true,
            None,
        )?);
        let bias_shape = if self.cell == Cell::Gru {
            vec![2, g]
        } else {
            vec![g]
        };
        let bias = self
            .base
            .add_weight("bias", &bias_shape, &Initializer::Zeros, true, None)?;
        if self.cell == Cell::Lstm {
            // unit_forget_bias: the forget gate's bias starts at 1.
            let u = self.units;
            let v: Vec<f64> = (0..g)
                .map(|i| if (u..2 * u).contains(&i) { 1.0 } else { 0.0 })
                .collect();
            bias.assign(&Tensor::from_vec(v, &[g])?.cast(bias.peek().dtype())?)?;
        }
        self.bias = Some(bias);
        Ok(())
    }

    fn call(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let x = inputs.first().filter(|x| x.rank() == 3).ok_or_else(|| {
            Error::invalid(
                "RNN",
                "expects one input of shape [batch, timesteps, features]",
            )
        })?;
        let (Some(k), Some(r), Some(b)) = (&self.kernel, &self.recurrent, &self.bias) else {
            return Err(Error::invalid(
                "RNN",
                "call before build: use `apply`/`forward`",
            ));
        };
        let read = crate::mixed_precision::read_variable;
        let (k, r, b) = (read(k)?, read(r)?, read(b)?);
        let [n, t, f] = [x.shape()[0], x.shape()[1], x.shape()[2]];
        let u = self.units;
        let g = self.cell.gates() * u;
        // Input projections for every step at once.
        let (b_in, b_rec) = if self.cell == Cell::Gru {
            let parts = b.unstack(0)?;
            (parts[0].clone(), Some(parts[1].clone()))
        } else {
            (b.clone(), None)
        };
        let xw = x
            .reshape_to(&[n * t, f])?
            .matmul(&k)?
            .add(&b_in)?
            .reshape_to(&[n, t, g])?;
        let mut steps = xw.unstack(1)?;
        if self.go_backwards {
            // Keras: the sequence is read from the end; the outputs come in that order.
            steps.reverse();
        }
        let mut h = Tensor::zeros(&[n, u], x.dtype())?;
        let mut c = h.clone();
        let mut outs = Vec::with_capacity(t);
        let gate = |z: &Tensor, i: usize| z.slice(&[0, i * u], &[n as isize, u as isize]);
        for xt in steps {
            let hr = h.matmul(&r)?;
            h = match self.cell {
                Cell::Simple => self.activation.apply(&xt.add(&hr)?)?,
                Cell::Lstm => {
                    let z = xt.add(&hr)?;
                    let i = gate(&z, 0)?.sigmoid()?;
                    let fg = gate(&z, 1)?.sigmoid()?;
                    let cand = self.activation.apply(&gate(&z, 2)?)?;
                    let o = gate(&z, 3)?.sigmoid()?;
                    c = fg.mul(&c)?.add(&i.mul(&cand)?)?;
                    o.mul(&self.activation.apply(&c)?)?
                }
                Cell::Gru => {
                    let hr = hr.add(b_rec.as_ref().expect("GRU has a recurrent bias"))?;
                    let z = gate(&xt, 0)?.add(&gate(&hr, 0)?)?.sigmoid()?;
                    let rg = gate(&xt, 1)?.add(&gate(&hr, 1)?)?.sigmoid()?;
                    let cand = self
                        .activation
                        .apply(&gate(&xt, 2)?.add(&rg.mul(&gate(&hr, 2)?)?)?)?;
                    // h = z·h_prev + (1 - z)·candidate
                    z.mul(&h)?
                        .add(&z.neg()?.add(&z.scalar_like(1.0)?)?.mul(&cand)?)?
                }
            };
            if self.return_sequences {
                outs.push(h.clone());
            }
        }
        Ok(vec![if self.return_sequences {
            Tensor::stack(&outs, 1)?
        } else {
            h
        }])
    }

    fn config(&self) -> Value {
        json!({"units": self.units, "return_sequences": self.return_sequences,
               "go_backwards": self.go_backwards, "activation": self.activation.name()})
    }

    fn from_config(prefix: &str, cell: Cell, c: &Value, class: &str) -> Result<Recurrent> {
        let mut r = Recurrent::new(prefix, cell, cfg_usize(c, class, "units")?);
        r.return_sequences = c["return_sequences"].as_bool().unwrap_or(false);
        r.go_backwards = c["go_backwards"].as_bool().unwrap_or(false);
        for unsupported in ["return_state", "stateful", "unroll"] {
            if c[unsupported].as_bool() == Some(true) {
                return Err(Error::format(
                    format!("{class} config"),
                    format!("{unsupported}=True is not supported"),
                ));
            }
        }
        if c["use_bias"].as_bool() == Some(false) {
            return Err(Error::format(
                format!("{class} config"),
                "use_bias=False is not supported",
            ));
        }
        if let Some(ra) = c["recurrent_activation"].as_str() {
            if ra != "sigmoid" {
                return Err(Error::format(
                    format!("{class} config"),
                    format!("recurrent_activation {ra:?} is not supported (sigmoid only)"),
                ));
            }
        }
        for rate in ["dropout", "recurrent_dropout"] {
            if c[rate].as_f64().is_some_and(|r| r > 0.0) {
                return Err(Error::format(
                    format!("{class} config"),
                    format!("{rate} > 0 is not supported; put a Dropout layer before the RNN"),
                ));
            }
        }
        if cell == Cell::Gru && c["reset_after"].as_bool() == Some(false) {
            return Err(Error::format(
                format!("{class} config"),
                "reset_after=False is not supported (TF 2's default, True, is)",
            ));
        }
        if let Some(a) = c["activation"].as_str() {
            r.activation = Act::parse(a)?;
        }
        Ok(r)
    }
}

macro_rules! recurrent_layer {
    ($name:ident, $class:literal, $prefix:literal, $cell:expr, $doc:literal) => {
        #[doc = $doc]
        pub struct $name(Recurrent);

        impl $name {
            /// A layer of `units` units returning the last output.
            pub fn new(units: usize) -> $name {
                $name(Recurrent::new($prefix, $cell, units))
            }
            /// Return the output of every step (`[batch, timesteps, units]`).
            pub fn return_sequences(mut self, r: bool) -> $name {
                self.0.return_sequences = r;
                self
            }
            /// Read the sequence from its end (Keras' `go_backwards`; outputs in that order).
            pub fn go_backwards(mut self, b: bool) -> $name {
                self.0.go_backwards = b;
                self
            }
            /// The activation (tanh by default).
            pub fn activation(mut self, a: Act) -> $name {
                self.0.activation = a;
                self
            }
            /// Rebuilds from [`Layer::get_config`].
            pub fn from_config(c: &Value) -> Result<$name> {
                Recurrent::from_config($prefix, $cell, c, $class).map($name)
            }
        }

        impl Layer for $name {
            fn base(&self) -> &LayerBase {
                &self.0.base
            }
            fn base_mut(&mut self) -> &mut LayerBase {
                &mut self.0.base
            }
            fn class_name(&self) -> &'static str {
                $class
            }
            fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
                self.0.build(s)
            }
            fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
                self.0.call(inputs)
            }
            fn get_config(&self) -> Value {
                self.0.config()
            }
        }
    };
}

recurrent_layer!(
    SimpleRNN,
    "SimpleRNN",
    "simple_rnn",
    Cell::Simple,
    "`tf.keras.layers.SimpleRNN`: `h = tanh(x·W + h·U + b)`."
);
recurrent_layer!(
    Lstm,
    "LSTM",
    "lstm",
    Cell::Lstm,
    "`tf.keras.layers.LSTM`: gates i, f, c, o in Keras' order; sigmoid recurrent activation."
);
recurrent_layer!(
    Gru,
    "GRU",
    "gru",
    Cell::Gru,
    "`tf.keras.layers.GRU` (TF 2's `reset_after=True`): gates z, r, h; bias `[2, 3·units]`."
);

/// `tf.keras.layers.MultiHeadAttention` (new in TF 2.4): scaled dot-product attention over
/// `num_heads` heads of size `key_dim`, projected back to the query's feature size.
///
/// As a layer its inputs are `[query, value]`, `[query, value, key]` or
/// `[query, value, key, attention_mask]`, each `[batch, steps, features]`; the mask
/// (`[batch, query steps, value steps]`, any dtype, nonzero = attend) hides positions from
/// every head. [`MultiHeadAttention::attend`] takes the same with Keras' keywords and also
/// returns the attention scores. In training, `dropout` drops attention probabilities.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::layers::MultiHeadAttention;
/// use ferroflow_tensor::{DType, Tensor};
/// let mut mha = MultiHeadAttention::new(2, 4);
/// let x = Tensor::ones(&[1, 3, 8], DType::F32)?;
/// // Causal mask: step i sees steps 0..=i.
/// let mask = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0], &[1, 3, 3])?;
/// let (out, scores) = mha.attend(&x, &x, None, Some(&mask), false)?;
/// assert_eq!(out.shape(), &[1, 3, 8]);
/// assert_eq!(scores.to_vec::<f32>()?[1], 0.0); // head 0, step 0 does not see step 1
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct MultiHeadAttention {
    base: LayerBase,
    /// Heads.
    pub num_heads: usize,
    /// Size of each head for queries and keys.
    pub key_dim: usize,
    /// Size of each head for values (default `key_dim`).
    pub value_dim: usize,
    /// Dropout rate on the attention probabilities, in training (0).
    pub dropout: f64,
    /// Also output the attention probabilities (Keras' `return_attention_scores`).
    pub return_attention_scores: bool,
    weights: Option<[Variable; 8]>,
}

impl MultiHeadAttention {
    /// `num_heads` heads of size `key_dim`.
    pub fn new(num_heads: usize, key_dim: usize) -> MultiHeadAttention {
        MultiHeadAttention {
            base: LayerBase::new("multi_head_attention", None),
            num_heads,
            key_dim,
            value_dim: key_dim,
            dropout: 0.0,
            return_attention_scores: false,
            weights: None,
        }
    }
    /// Sets the attention dropout rate.
    pub fn with_dropout(mut self, rate: f64) -> MultiHeadAttention {
        self.dropout = rate;
        self
    }
    /// Rebuilds from [`Layer::get_config`].
    pub fn from_config(c: &Value) -> Result<MultiHeadAttention> {
        let mut m = MultiHeadAttention::new(
            cfg_usize(c, "MultiHeadAttention", "num_heads")?,
            cfg_usize(c, "MultiHeadAttention", "key_dim")?,
        );
        m.value_dim = cfg_usize(c, "MultiHeadAttention", "value_dim")?;
        m.dropout = c["dropout"].as_f64().unwrap_or(0.0);
        Ok(m)
    }

    /// Keras' `call(query, value, key=None, attention_mask=None, training=...,
    /// return_attention_scores=True)`: the output `[batch, query steps, query features]` and
    /// the attention probabilities `[batch, heads, query steps, value steps]`. Builds the
    /// layer on first use.
    pub fn attend(
        &mut self,
        query: &Tensor,
        value: &Tensor,
        key: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        training: bool,
    ) -> Result<(Tensor, Tensor)> {
        let key = key.unwrap_or(value);
        let mut inputs = vec![query.clone(), value.clone(), key.clone()];
        if let Some(m) = attention_mask {
            inputs.push(m.clone());
        }
        // Through `apply`: building, autocasting and the layer's dtype policy.
        let keep = std::mem::replace(&mut self.return_attention_scores, true);
        let out = self.apply(&inputs, training);
        self.return_attention_scores = keep;
        let mut out = out?;
        if out.len() != 2 {
            return Err(Error::invalid(
                "MultiHeadAttention",
                "expected output and scores",
            ));
        }
        let scores = out.pop().expect("two outputs");
        Ok((out.pop().expect("two outputs"), scores))
    }
}

/// `[b, t, d] · [d, h·k] -> [b, h, t, k]`.
fn heads(x: &Tensor, w: &Tensor, b: &Tensor, h: usize, k: usize) -> Result<Tensor> {
    let (n, t, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    x.reshape_to(&[n * t, d])?
        .matmul(&w.reshape_to(&[d, h * k])?)?
        .add(&b.reshape_to(&[h * k])?)?
        .reshape_to(&[n, t, h, k])?
        .transpose(&[0, 2, 1, 3])
}

impl Layer for MultiHeadAttention {
    layer_base!("MultiHeadAttention");
    fn build(&mut self, s: &[Vec<usize>]) -> Result<()> {
        let dim = |i: usize| -> Result<usize> {
            match s.get(i).map(Vec::as_slice) {
                Some(&[_, _, d]) => Ok(d),
                other => Err(Error::invalid(
                    "MultiHeadAttention",
                    format!("input {i} must be [batch, steps, features], got {other:?}"),
                )),
            }
        };
        let (dq, dv) = (dim(0)?, dim(1)?);
        let dk = if s.len() > 2 { dim(2)? } else { dv };
        let (h, k, v) = (self.num_heads, self.key_dim, self.value_dim);
        let g = Initializer::GlorotUniform { seed: None };
        let z = Initializer::Zeros;
        let b = &mut self.base;
        self.weights = Some([
            b.add_weight("query/kernel", &[dq, h, k], &g, true, None)?,
            b.add_weight("query/bias", &[h, k], &z, true, None)?,
            b.add_weight("key/kernel", &[dk, h, k], &g, true, None)?,
            b.add_weight("key/bias", &[h, k], &z, true, None)?,
            b.add_weight("value/kernel", &[dv, h, v], &g, true, None)?,
            b.add_weight("value/bias", &[h, v], &z, true, None)?,
            b.add_weight("attention_output/kernel", &[h, v, dq], &g, true, None)?,
            b.add_weight("attention_output/bias", &[dq], &z, true, None)?,
        ]);
        Ok(())
    }
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        if !(2..=4).contains(&inputs.len()) {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!(
                    "takes [query, value], [query, value, key] or [query, value, key, \
                     attention_mask], got {} inputs",
                    inputs.len()
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!("dropout must be in [0, 1), got {}", self.dropout),
            ));
        }
        let w = self.weights.as_ref().ok_or_else(|| {
            Error::invalid("MultiHeadAttention", "call before build: use `apply`")
        })?;
        let w: Vec<Tensor> = w
            .iter()
            .map(crate::mixed_precision::read_variable)
            .collect::<Result<_>>()?;
        let (query, value) = (&inputs[0], &inputs[1]);
        let key = inputs.get(2).unwrap_or(value);
        let (h, k, v) = (self.num_heads, self.key_dim, self.value_dim);
        let q = heads(query, &w[0], &w[1], h, k)?;
        let kk = heads(key, &w[2], &w[3], h, k)?;
        let vv = heads(value, &w[4], &w[5], h, v)?;
        let mut logits = q
            .mul(&q.scalar_like(1.0 / (k as f64).sqrt())?)?
            .matmul_t(&kk, false, true)?; // [b, h, tq, tv]
        if let Some(mask) = inputs.get(3) {
            let want = [query.shape()[0], query.shape()[1], key.shape()[1]];
            let fits = mask.rank() == 3
                && mask
                    .shape()
                    .iter()
                    .zip(&want)
                    .all(|(&m, &w)| m == w || m == 1);
            if !fits {
                return Err(Error::ShapeMismatch {
                    op: "MultiHeadAttention",
                    msg: "attention_mask must broadcast to [batch, query steps, value steps]",
                    lhs: mask.shape().to_vec(),
                    rhs: want.to_vec(),
                });
            }
            // Keras: logits += (1 - mask) · (a large negative number for the dtype).
            let large = if logits.dtype() == ferroflow_tensor::DType::F16 {
                -65500.0
            } else {
                -1e9
            };
            let hidden = mask
                .equal(&mask.scalar_like(0.0)?)?
                .cast(logits.dtype())?
                .expand_dims(1)?;
            logits = logits.add(&hidden.mul(&hidden.scalar_like(large)?)?)?;
        }
        let scores = logits.softmax(-1)?;
        let dropped = crate::layers::core::dropout(&scores, self.dropout, None, training)?;
        let ctx = dropped.matmul(&vv)?.transpose(&[0, 2, 1, 3])?; // [b, tq, h, v]
        let (n, tq, dq) = (query.shape()[0], query.shape()[1], query.shape()[2]);
        let out = ctx
            .reshape_to(&[n * tq, h * v])?
            .matmul(&w[6].reshape_to(&[h * v, dq])?)?
            .add(&w[7])?
            .reshape_to(&[n, tq, dq])?;
        Ok(if self.return_attention_scores {
            vec![out, scores]
        } else {
            vec![out]
        })
    }
    fn get_config(&self) -> Value {
        json!({"num_heads": self.num_heads, "key_dim": self.key_dim, "value_dim": self.value_dim, "dropout": self.dropout})
    }
}
