//! TF 2.4's random image augmentation layers (`tf.keras.layers.experimental.preprocessing`):
//! RandomFlip, RandomRotation, RandomZoom, RandomContrast, and [`transform_images`], TF's
//! `ImageProjectiveTransformV3` (projective maps with reflect / wrap / constant / nearest
//! filling, bilinear or nearest sampling) they are built on. In inference (`training` false)
//! every one of them is the identity, as in TF. The sampling is gathers and weighted sums,
//! so gradients reach the input.

use ferroflow_tensor::{random, DType, Error, HostData, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{Layer, LayerBase};
use crate::layers::core::layer_base;
use crate::layers::expect_inputs;
use crate::layers::Interpolation;

/// How [`transform_images`] fills points that map outside the image (TF's `fill_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillMode {
    /// Mirror at the edge, the edge pixel repeated (`d c b a | a b c d | d c b a`).
    Reflect,
    /// Tile the image (`a b c d | a b c d | a b c d`).
    Wrap,
    /// A constant value (`fill_value`).
    Constant,
    /// The nearest edge pixel (`a a a a | a b c d | d d d d`).
    Nearest,
}

impl FillMode {
    fn name(self) -> &'static str {
        match self {
            FillMode::Reflect => "reflect",
            FillMode::Wrap => "wrap",
            FillMode::Constant => "constant",
            FillMode::Nearest => "nearest",
        }
    }
    fn parse(c: &Value, class: &str) -> Result<FillMode> {
        match c.get("fill_mode").and_then(Value::as_str) {
            None | Some("reflect") => Ok(FillMode::Reflect),
            Some("wrap") => Ok(FillMode::Wrap),
            Some("constant") => Ok(FillMode::Constant),
            Some("nearest") => Ok(FillMode::Nearest),
            Some(other) => Err(Error::format(
                format!("{class} config"),
                format!("fill_mode {other:?} is not one of reflect, wrap, constant, nearest"),
            )),
        }
    }
    /// TF's `MapCoordinate`: a coordinate of a dimension of `len` moved inside it.
    fn map(self, coord: f32, len: usize) -> f32 {
        let len_f = len as f32;
        let mut c = coord;
        match self {
            FillMode::Constant => return coord,
            FillMode::Nearest => {}
            FillMode::Reflect => {
                if len <= 1 {
                    c = 0.0;
                } else if c < 0.0 {
                    let sz2 = 2.0 * len_f;
                    if c < sz2 {
                        c += sz2 * ((-c / sz2) as i64) as f32;
                    }
                    c = if c < -len_f { c + sz2 } else { -c - 1.0 };
                } else if c > len_f - 1.0 {
                    let sz2 = 2.0 * len_f;
                    c -= sz2 * ((c / sz2) as i64) as f32;
                    if c >= len_f {
                        c = sz2 - c - 1.0;
                    }
                }
            }
            FillMode::Wrap => {
                if len <= 1 {
                    c = 0.0;
                } else if c < 0.0 {
                    let sz = len_f - 1.0;
                    c += len_f * (((-c / sz) as i64) + 1) as f32;
                } else if c > len_f - 1.0 {
                    let sz = len_f - 1.0;
                    c -= len_f * ((c / sz) as i64) as f32;
                }
            }
        }
        c.clamp(0.0, len_f - 1.0)
    }
}

/// TF's `transform` (`ImageProjectiveTransformV3`) of NHWC images: output pixel `(x, y)`
/// samples the input at `((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2) / k)` with
/// `k = c0 x + c1 y + 1`, one `[a0, a1, a2, b0, b1, b2, c0, c1]` per image (or one for
/// all), outside points filled as `fill_mode` says. Float images only.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::layers::{transform_images, FillMode, Interpolation};
/// use ferroflow_tensor::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 4, 1])?;
/// // Shift right by one pixel: each output x reads input x - 1.
/// let shift = [1.0, 0.0, -1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
/// let y = transform_images(&x, &[shift], Interpolation::Nearest, FillMode::Constant, 0.0)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 1.0, 2.0, 3.0]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub fn transform_images(
    x: &Tensor,
    transforms: &[[f32; 8]],
    interpolation: Interpolation,
    fill_mode: FillMode,
    fill_value: f64,
) -> Result<Tensor> {
    let [b, h, w, c] = match *x.shape() {
        [b, h, w, c] => [b, h, w, c],
        _ => {
            return Err(Error::invalid(
                "transform",
                format!("expects NHWC images (rank 4), got shape {:?}", x.shape()),
            ))
        }
    };
    if !x.dtype().is_float() {
        return Err(Error::invalid(
            "transform",
            format!("needs float images, got {} (cast first)", x.dtype()),
        ));
    }
    if transforms.len() != b && transforms.len() != 1 {
        return Err(Error::invalid(
            "transform",
            format!(
                "needs one transform per image ({b}) or one for all, got {}",
                transforms.len()
            ),
        ));
    }
    let pixels = b * h * w;
    // The images' pixels as rows, and one more row: the fill value (index `pixels`).
    let fill_row = Tensor::from_host(
        HostData::from_f64_slice(x.dtype(), &vec![fill_value; c]),
        &[1, c],
    )?;
    let table = Tensor::concat(&[x.reshape_to(&[pixels, c])?, fill_row], 0)?;
    let read = |bi: usize, yi: f32, xi: f32| -> i64 {
        // Outside the image: the fill row (only reachable in constant mode).
        if yi < 0.0 || xi < 0.0 || yi > (h as f32 - 1.0) || xi > (w as f32 - 1.0) {
            return pixels as i64;
        }
        ((bi * h + yi as usize) * w + xi as usize) as i64
    };
    let mut corners: [Vec<i64>; 4] = [vec![], vec![], vec![], vec![]];
    let mut weights: [Vec<f64>; 4] = [vec![], vec![], vec![], vec![]];
    for bi in 0..b {
        let t = transforms[if transforms.len() == 1 { 0 } else { bi }];
        for oy in 0..h {
            for ox in 0..w {
                let (fx, fy) = (ox as f32, oy as f32);
                let k = t[6] * fx + t[7] * fy + 1.0;
                if k == 0.0 {
                    // TF: a point at infinity is the fill value.
                    for (i, (cs, ws)) in corners.iter_mut().zip(weights.iter_mut()).enumerate() {
                        cs.push(pixels as i64);
                        ws.push(if i % 2 == 0 { 1.0 } else { 0.0 });
                    }
                    continue;
                }
                let ix = fill_mode.map((t[0] * fx + t[1] * fy + t[2]) / k, w);
                let iy = fill_mode.map((t[3] * fx + t[4] * fy + t[5]) / k, h);
                match interpolation {
                    Interpolation::Nearest => {
                        corners[0].push(read(bi, iy.round(), ix.round()));
                        weights[0].push(1.0);
                    }
                    Interpolation::Bilinear => {
                        let (yf, xf) = (iy.floor(), ix.floor());
                        let (yc, xc) = (yf + 1.0, xf + 1.0);
                        corners[0].push(read(bi, yf, xf));
                        corners[1].push(read(bi, yf, xc));
                        corners[2].push(read(bi, yc, xf));
                        corners[3].push(read(bi, yc, xc));
                        // (x weights within a row, then y weights between the rows)
                        weights[0].push((xc - ix) as f64);
                        weights[1].push((ix - xf) as f64);
                        weights[2].push((yc - iy) as f64);
                        weights[3].push((iy - yf) as f64);
                    }
                }
            }
        }
    }
    let gather = |idx: &Vec<i64>| -> Result<Tensor> {
        table.gather(&Tensor::from_vec(idx.clone(), &[idx.len()])?, 0)
    };
    let col = |v: &Vec<f64>| -> Result<Tensor> {
        Tensor::from_host(HostData::from_f64_slice(x.dtype(), v), &[v.len(), 1])
    };
    let y = match interpolation {
        Interpolation::Nearest => gather(&corners[0])?,
        Interpolation::Bilinear => {
            let top = gather(&corners[0])?
                .mul(&col(&weights[0])?)?
                .add(&gather(&corners[1])?.mul(&col(&weights[1])?)?)?;
            let bottom = gather(&corners[2])?
                .mul(&col(&weights[0])?)?
                .add(&gather(&corners[3])?.mul(&col(&weights[1])?)?)?;
            top.mul(&col(&weights[2])?)?
                .add(&bottom.mul(&col(&weights[3])?)?)?
        }
    };
    y.reshape_to(&[b, h, w, c])
}

/// TF 2.4's `get_rotation_matrix`: rotations by `angles` (radians, counter-clockwise)
/// about the centre of an `h × w` image, as transforms for [`transform_images`].
pub fn rotation_matrices(angles: &[f32], h: usize, w: usize) -> Vec<[f32; 8]> {
    let (hf, wf) = ((h as f32) - 1.0, (w as f32) - 1.0);
    angles
        .iter()
        .map(|&a| {
            let (s, c) = a.sin_cos();
            let x_offset = (wf - (c * wf - s * hf)) / 2.0;
            let y_offset = (hf - (s * wf + c * hf)) / 2.0;
            [c, -s, x_offset, s, c, y_offset, 0.0, 0.0]
        })
        .collect()
}

/// TF 2.4's `get_zoom_matrix`: zooms by `(width_zoom, height_zoom)` about the centre of an
/// `h × w` image (a zoom above 1 shows more of the image: it zooms out).
pub fn zoom_matrices(zooms: &[(f32, f32)], h: usize, w: usize) -> Vec<[f32; 8]> {
    zooms
        .iter()
        .map(|&(zx, zy)| {
            let x_offset = ((w as f32 - 1.0) / 2.0) * (1.0 - zx);
            let y_offset = ((h as f32 - 1.0) / 2.0) * (1.0 - zy);
            [zx, 0.0, x_offset, 0.0, zy, y_offset, 0.0, 0.0]
        })
        .collect()
}

/// `n` uniform draws in `[lo, hi)` as f32 (the layer's seed, or the global generator's).
fn draws(n: usize, lo: f64, hi: f64, seed: Option<u64>) -> Result<Vec<f32>> {
    random::uniform(&[n], lo, hi, DType::F32, seed)?.to_vec::<f32>()
}

fn nhwc_float<'a>(class: &'static str, inputs: &'a [Tensor]) -> Result<&'a Tensor> {
    let x = &inputs[0];
    if x.rank() != 4 {
        return Err(Error::invalid(
            class,
            format!("expects NHWC images (rank 4), got shape {:?}", x.shape()),
        ));
    }
    Ok(x)
}

/// A factor as Keras gives it: `f` (meaning `[-f, f]`) or `[lower, upper]`.
fn factor_range(v: &Value, class: &str, key: &str) -> Result<(f64, f64)> {
    if let Some(f) = v.as_f64() {
        return Ok((-f.abs(), f.abs()));
    }
    match v
        .as_array()
        .map(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
    {
        Some(Some(p)) if p.len() == 2 && p[0] <= p[1] => Ok((p[0], p[1])),
        _ => Err(Error::format(
            format!("{class} config"),
            format!("{key} must be a number or an ordered pair, got {v}"),
        )),
    }
}

/// `RandomFlip`: in training, each image flipped left-right and/or up-down with
/// probability ½ (`mode`: `horizontal`, `vertical` or `horizontal_and_vertical`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::RandomFlip, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut flip = RandomFlip::new("horizontal")?;
/// let x = Tensor::ones(&[4, 2, 3, 1], DType::F32)?;
/// assert_eq!(flip.forward(&x, true)?.shape(), &[4, 2, 3, 1]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct RandomFlip {
    base: LayerBase,
    horizontal: bool,
    vertical: bool,
    /// The seed of the flips (`None`: the global generator).
    pub seed: Option<u64>,
}

impl RandomFlip {
    /// Flips as `mode` says.
    pub fn new(mode: &str) -> Result<RandomFlip> {
        let (horizontal, vertical) = match mode {
            "horizontal" => (true, false),
            "vertical" => (false, true),
            "horizontal_and_vertical" => (true, true),
            other => {
                return Err(Error::invalid(
                    "RandomFlip",
                    format!(
                    "mode must be horizontal, vertical or horizontal_and_vertical, got {other:?}"
                ),
                ))
            }
        };
        Ok(RandomFlip {
            base: LayerBase::new("random_flip", None),
            horizontal,
            vertical,
            seed: None,
        })
    }
    fn mode(&self) -> &'static str {
        match (self.horizontal, self.vertical) {
            (true, false) => "horizontal",
            (false, true) => "vertical",
            _ => "horizontal_and_vertical",
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<RandomFlip> {
        let mut f = RandomFlip::new(
            c.get("mode")
                .and_then(Value::as_str)
                .unwrap_or("horizontal_and_vertical"),
        )?;
        f.seed = c.get("seed").and_then(Value::as_u64);
        Ok(f)
    }
}

impl Layer for RandomFlip {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("RandomFlip");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc_float("RandomFlip", inputs)?;
        if !training {
            return Ok(vec![x.clone()]);
        }
        let b = x.shape()[0];
        let mut y = x.clone();
        for (on, axis) in [(self.horizontal, 2isize), (self.vertical, 1)] {
            if !on {
                continue;
            }
            let flip: Vec<bool> = draws(b, 0.0, 1.0, self.seed)?
                .into_iter()
                .map(|u| u < 0.5)
                .collect();
            let mask = Tensor::from_vec(flip, &[b, 1, 1, 1])?;
            y = Tensor::select(&mask, &y.reverse(&[axis])?, &y)?;
        }
        Ok(vec![y])
    }
    fn get_config(&self) -> Value {
        json!({ "mode": self.mode(), "seed": self.seed })
    }
}

macro_rules! geometric_options {
    ($name:ident) => {
        impl $name {
            /// Sets how outside points are filled.
            pub fn fill_mode(mut self, mode: FillMode) -> $name {
                self.fill_mode = mode;
                self
            }
            /// Sets the value of `FillMode::Constant`.
            pub fn fill_value(mut self, value: f64) -> $name {
                self.fill_value = value;
                self
            }
            /// Sets the sampling.
            pub fn interpolation(mut self, interpolation: Interpolation) -> $name {
                self.interpolation = interpolation;
                self
            }
            /// Sets the seed.
            pub fn seed(mut self, seed: u64) -> $name {
                self.seed = Some(seed);
                self
            }
        }
    };
}

fn interpolation_of(c: &Value, class: &str) -> Result<Interpolation> {
    match c.get("interpolation").and_then(Value::as_str) {
        None | Some("bilinear") => Ok(Interpolation::Bilinear),
        Some("nearest") => Ok(Interpolation::Nearest),
        Some(other) => Err(Error::format(
            format!("{class} config"),
            format!("interpolation {other:?} is not supported (bilinear, nearest)"),
        )),
    }
}

fn interpolation_name(i: Interpolation) -> &'static str {
    match i {
        Interpolation::Bilinear => "bilinear",
        Interpolation::Nearest => "nearest",
    }
}

/// `RandomRotation`: in training, each image rotated by an angle drawn uniformly from
/// `factor · 2π` (`factor` `f` meaning `[-f, f]`), filled by `fill_mode` (`reflect`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::RandomRotation, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut rot = RandomRotation::new(0.1).seed(3);
/// let x = Tensor::ones(&[2, 5, 5, 1], DType::F32)?;
/// // The reflect filling keeps a constant image constant.
/// let y = rot.forward(&x, true)?.to_vec::<f32>()?;
/// assert!(y.iter().all(|v| (v - 1.0).abs() < 1e-5));
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct RandomRotation {
    base: LayerBase,
    /// The range of the angle, as a fraction of a full turn.
    pub factor: (f64, f64),
    /// How outside points are filled.
    pub fill_mode: FillMode,
    /// The value of `FillMode::Constant`.
    pub fill_value: f64,
    /// The sampling.
    pub interpolation: Interpolation,
    /// The seed (`None`: the global generator).
    pub seed: Option<u64>,
}

impl RandomRotation {
    /// Angles in `[-factor, factor]` of a full turn.
    pub fn new(factor: f64) -> RandomRotation {
        RandomRotation {
            base: LayerBase::new("random_rotation", None),
            factor: (-factor.abs(), factor.abs()),
            fill_mode: FillMode::Reflect,
            fill_value: 0.0,
            interpolation: Interpolation::Bilinear,
            seed: None,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<RandomRotation> {
        let factor = factor_range(
            c.get("factor").unwrap_or(&Value::Null),
            "RandomRotation",
            "factor",
        )?;
        Ok(RandomRotation {
            factor,
            fill_mode: FillMode::parse(c, "RandomRotation")?,
            fill_value: c.get("fill_value").and_then(Value::as_f64).unwrap_or(0.0),
            interpolation: interpolation_of(c, "RandomRotation")?,
            seed: c.get("seed").and_then(Value::as_u64),
            ..RandomRotation::new(0.0)
        })
    }
}

geometric_options!(RandomRotation);

impl Layer for RandomRotation {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("RandomRotation");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc_float("RandomRotation", inputs)?;
        if !training {
            return Ok(vec![x.clone()]);
        }
        let [b, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2]];
        let turn = 2.0 * std::f64::consts::PI;
        let angles = draws(b, self.factor.0 * turn, self.factor.1 * turn, self.seed)?;
        let t = rotation_matrices(&angles, h, w);
        Ok(vec![transform_images(
            x,
            &t,
            self.interpolation,
            self.fill_mode,
            self.fill_value,
        )?])
    }
    fn get_config(&self) -> Value {
        json!({
            "factor": [self.factor.0, self.factor.1],
            "fill_mode": self.fill_mode.name(),
            "fill_value": self.fill_value,
            "interpolation": interpolation_name(self.interpolation),
            "seed": self.seed,
        })
    }
}

/// `RandomZoom`: in training, each image zoomed by `1 + h` in height (`h` drawn from
/// `height_factor`; negative zooms in) and by `1 + w` in width (`width_factor`, or the
/// height's zoom when none is given), filled by `fill_mode` (`reflect`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::RandomZoom, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut zoom = RandomZoom::new(0.2);
/// let y = zoom.forward(&Tensor::ones(&[2, 4, 4, 3], DType::F32)?, true)?;
/// assert_eq!(y.shape(), &[2, 4, 4, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct RandomZoom {
    base: LayerBase,
    /// The range of the height zoom's offset from 1.
    pub height_factor: (f64, f64),
    /// The width's, or `None` to zoom the width as the height.
    pub width_factor: Option<(f64, f64)>,
    /// How outside points are filled.
    pub fill_mode: FillMode,
    /// The value of `FillMode::Constant`.
    pub fill_value: f64,
    /// The sampling.
    pub interpolation: Interpolation,
    /// The seed (`None`: the global generator).
    pub seed: Option<u64>,
}

impl RandomZoom {
    /// Zooms by `1 + [-height_factor, height_factor]`, the width as the height.
    pub fn new(height_factor: f64) -> RandomZoom {
        RandomZoom {
            base: LayerBase::new("random_zoom", None),
            height_factor: (-height_factor.abs(), height_factor.abs()),
            width_factor: None,
            fill_mode: FillMode::Reflect,
            fill_value: 0.0,
            interpolation: Interpolation::Bilinear,
            seed: None,
        }
    }
    /// Zooms the width independently, by `1 + [lower, upper]`.
    pub fn width_factor(mut self, lower: f64, upper: f64) -> RandomZoom {
        self.width_factor = Some((lower, upper));
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<RandomZoom> {
        let height = factor_range(
            c.get("height_factor").unwrap_or(&Value::Null),
            "RandomZoom",
            "height_factor",
        )?;
        let width = match c.get("width_factor") {
            None | Some(Value::Null) => None,
            Some(v) => Some(factor_range(v, "RandomZoom", "width_factor")?),
        };
        Ok(RandomZoom {
            height_factor: height,
            width_factor: width,
            fill_mode: FillMode::parse(c, "RandomZoom")?,
            fill_value: c.get("fill_value").and_then(Value::as_f64).unwrap_or(0.0),
            interpolation: interpolation_of(c, "RandomZoom")?,
            seed: c.get("seed").and_then(Value::as_u64),
            ..RandomZoom::new(0.0)
        })
    }
}

geometric_options!(RandomZoom);

impl Layer for RandomZoom {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("RandomZoom");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc_float("RandomZoom", inputs)?;
        if !training {
            return Ok(vec![x.clone()]);
        }
        let [b, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2]];
        let (lo, hi) = self.height_factor;
        let zy = draws(b, 1.0 + lo, 1.0 + hi, self.seed)?;
        let zx = match self.width_factor {
            Some((lo, hi)) => draws(b, 1.0 + lo, 1.0 + hi, self.seed)?,
            None => zy.clone(),
        };
        let zooms: Vec<(f32, f32)> = zx.into_iter().zip(zy).collect();
        let t = zoom_matrices(&zooms, h, w);
        Ok(vec![transform_images(
            x,
            &t,
            self.interpolation,
            self.fill_mode,
            self.fill_value,
        )?])
    }
    fn get_config(&self) -> Value {
        json!({
            "height_factor": [self.height_factor.0, self.height_factor.1],
            "width_factor": self.width_factor.map(|(a, b)| json!([a, b])),
            "fill_mode": self.fill_mode.name(),
            "fill_value": self.fill_value,
            "interpolation": interpolation_name(self.interpolation),
            "seed": self.seed,
        })
    }
}

/// TF's `adjust_contrast`: each channel of each image moved away from (factor > 1) or
/// towards its mean over height and width: `(x - mean) · factor + mean`.
pub fn adjust_contrast(x: &Tensor, factors: &Tensor) -> Result<Tensor> {
    let mean = x.reduce_mean(ferroflow_tensor::Axes::from(&[1isize, 2][..]), true)?;
    x.sub(&mean)?.mul(factors)?.add(&mean)
}

/// `RandomContrast`: in training, the contrast of the batch scaled by a factor drawn from
/// `[1 - lower, 1 + upper]` (one factor per call, as TF 2.4's `random_contrast`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::RandomContrast, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut rc = RandomContrast::new(0.5)?;
/// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[1, 2, 2, 1])?;
/// let y = rc.forward(&x, true)?.to_vec::<f32>()?;
/// // The mean (1.5) stays.
/// assert!(((y.iter().sum::<f32>() / 4.0) - 1.5).abs() < 1e-6);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct RandomContrast {
    base: LayerBase,
    /// `(lower, upper)`: factors in `[1 - lower, 1 + upper]`.
    pub factor: (f64, f64),
    /// The seed (`None`: the global generator).
    pub seed: Option<u64>,
}

impl RandomContrast {
    /// Factors in `[1 - factor, 1 + factor]` (`factor` in `[0, 1]`).
    pub fn new(factor: f64) -> Result<RandomContrast> {
        RandomContrast::with_range(factor, factor)
    }
    /// Factors in `[1 - lower, 1 + upper]`.
    pub fn with_range(lower: f64, upper: f64) -> Result<RandomContrast> {
        if !((0.0..=1.0).contains(&lower) && upper >= 0.0 && upper.is_finite()) {
            return Err(Error::invalid(
                "RandomContrast",
                format!("factor must be in [0, 1] below and ≥ 0 above, got ({lower}, {upper})"),
            ));
        }
        Ok(RandomContrast {
            base: LayerBase::new("random_contrast", None),
            factor: (lower, upper),
            seed: None,
        })
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<RandomContrast> {
        let f = c.get("factor").unwrap_or(&Value::Null);
        let (lower, upper) = match f.as_f64() {
            Some(v) => (v, v),
            None => match f
                .as_array()
                .map(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
            {
                Some(Some(p)) if p.len() == 2 => (p[0], p[1]),
                _ => {
                    return Err(Error::format(
                        "RandomContrast config",
                        format!("factor must be a number or a pair, got {f}"),
                    ))
                }
            },
        };
        let mut rc = RandomContrast::with_range(lower, upper)?;
        rc.seed = c.get("seed").and_then(Value::as_u64);
        Ok(rc)
    }
}

impl Layer for RandomContrast {
    /// Computes on the host (reads its input's values): a model holding it runs eagerly.
    fn traceable(&self) -> bool {
        false
    }
    layer_base!("RandomContrast");
    fn call(&mut self, inputs: &[Tensor], training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc_float("RandomContrast", inputs)?;
        if !training {
            return Ok(vec![x.clone()]);
        }
        let f = draws(1, 1.0 - self.factor.0, 1.0 + self.factor.1, self.seed)?[0];
        Ok(vec![adjust_contrast(x, &x.scalar_like(f as f64)?)?])
    }
    fn get_config(&self) -> Value {
        json!({ "factor": [self.factor.0, self.factor.1], "seed": self.seed })
    }
}
