//! Layers that pad, crop or resize images (NHWC): ZeroPadding2D, Cropping2D, UpSampling2D,
//! and the image preprocessing layers Resizing and CenterCrop. All are compositions of
//! tensor ops (pad, slice, gather), so their gradients come from the tape.

use ferroflow_tensor::{DType, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::layer::{cfg, cfg_pair, cfg_usize, Layer, LayerBase};
use crate::layers::conv::check_channels_last;
use crate::layers::core::layer_base;
use crate::layers::expect_inputs;

/// The input as NHWC, or an error naming the layer and the shape it got.
fn nhwc<'a>(class: &'static str, inputs: &'a [Tensor]) -> Result<&'a Tensor> {
    let x = &inputs[0];
    if x.rank() != 4 {
        return Err(Error::invalid(
            class,
            format!(
                "expects NHWC input (rank 4: batch, height, width, channels), got shape {:?}",
                x.shape()
            ),
        ));
    }
    Ok(x)
}

/// `((top, bottom), (left, right))` from a Keras config value: an int, a pair of ints
/// (symmetric per axis) or a pair of pairs.
fn pairs_from(v: &Value, class: &str, key: &str) -> Result<[(usize, usize); 2]> {
    let bad = || {
        Error::format(
            format!("{class} config"),
            format!("{key:?} must be an integer, a pair or a pair of pairs, got {v}"),
        )
    };
    let int = |x: &Value| x.as_u64().map(|u| u as usize);
    if let Some(n) = int(v) {
        return Ok([(n, n), (n, n)]);
    }
    let a = v.as_array().filter(|a| a.len() == 2).ok_or_else(bad)?;
    let axis = |x: &Value| -> Result<(usize, usize)> {
        if let Some(n) = int(x) {
            return Ok((n, n));
        }
        match x
            .as_array()
            .map(|p| p.iter().map(int).collect::<Option<Vec<_>>>())
        {
            Some(Some(p)) if p.len() == 2 => Ok((p[0], p[1])),
            _ => Err(bad()),
        }
    };
    Ok([axis(&a[0])?, axis(&a[1])?])
}

/// `tf.keras.layers.ZeroPadding2D`: zeros around height and width.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::ZeroPadding2D, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut pad = ZeroPadding2D::new([(1, 1), (2, 0)]);
/// let y = pad.forward(&Tensor::ones(&[1, 2, 2, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[1, 4, 4, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct ZeroPadding2D {
    base: LayerBase,
    /// `((top, bottom), (left, right))`.
    pub padding: [(usize, usize); 2],
}

impl ZeroPadding2D {
    /// Pads `((top, bottom), (left, right))` rows and columns of zeros.
    pub fn new(padding: [(usize, usize); 2]) -> ZeroPadding2D {
        ZeroPadding2D {
            base: LayerBase::new("zero_padding2d", None),
            padding,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<ZeroPadding2D> {
        check_channels_last(c, "ZeroPadding2D")?;
        Ok(ZeroPadding2D::new(pairs_from(
            cfg(c, "ZeroPadding2D", "padding")?,
            "ZeroPadding2D",
            "padding",
        )?))
    }
}

impl Layer for ZeroPadding2D {
    layer_base!("ZeroPadding2D");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc("ZeroPadding2D", inputs)?;
        let [h, w] = self.padding;
        Ok(vec![x.pad(&[(0, 0), h, w, (0, 0)], 0.0)?])
    }
    fn get_config(&self) -> Value {
        let [h, w] = self.padding;
        json!({ "padding": [[h.0, h.1], [w.0, w.1]], "data_format": "channels_last" })
    }
}

/// `tf.keras.layers.Cropping2D`: removes rows and columns at the edges.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Cropping2D, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut crop = Cropping2D::new([(1, 0), (1, 1)]);
/// let y = crop.forward(&Tensor::ones(&[2, 4, 5, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 3, 3, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Cropping2D {
    base: LayerBase,
    /// `((top, bottom), (left, right))`.
    pub cropping: [(usize, usize); 2],
}

impl Cropping2D {
    /// Crops `((top, bottom), (left, right))` rows and columns.
    pub fn new(cropping: [(usize, usize); 2]) -> Cropping2D {
        Cropping2D {
            base: LayerBase::new("cropping2d", None),
            cropping,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<Cropping2D> {
        check_channels_last(c, "Cropping2D")?;
        Ok(Cropping2D::new(pairs_from(
            cfg(c, "Cropping2D", "cropping")?,
            "Cropping2D",
            "cropping",
        )?))
    }
}

/// The window `[start, start + len)` of a dimension of `n` after removing `before` and
/// `after`, or an error when nothing would remain.
fn kept(
    class: &'static str,
    what: &str,
    n: usize,
    before: usize,
    after: usize,
) -> Result<(usize, usize)> {
    match n.checked_sub(before).and_then(|r| r.checked_sub(after)) {
        Some(len) if len > 0 => Ok((before, len)),
        _ => Err(Error::invalid(
            class,
            format!("cropping {before} + {after} leaves nothing of the input's {what} of {n}"),
        )),
    }
}

impl Layer for Cropping2D {
    layer_base!("Cropping2D");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc("Cropping2D", inputs)?;
        let s = x.shape();
        let [(t, b), (l, r)] = self.cropping;
        let (h0, hn) = kept("Cropping2D", "height", s[1], t, b)?;
        let (w0, wn) = kept("Cropping2D", "width", s[2], l, r)?;
        Ok(vec![x.slice(
            &[0, h0, w0, 0],
            &[-1, hn as isize, wn as isize, -1],
        )?])
    }
    fn get_config(&self) -> Value {
        let [h, w] = self.cropping;
        json!({ "cropping": [[h.0, h.1], [w.0, w.1]], "data_format": "channels_last" })
    }
}

/// How an image is resampled (`interpolation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// The nearest source pixel (TF's `nearest`, half-pixel centres).
    Nearest,
    /// Linear in height and width (TF's `bilinear`, half-pixel centres, no antialiasing).
    Bilinear,
}

impl Interpolation {
    fn name(self) -> &'static str {
        match self {
            Interpolation::Nearest => "nearest",
            Interpolation::Bilinear => "bilinear",
        }
    }
    fn parse(c: &Value, class: &str) -> Result<Interpolation> {
        match c.get("interpolation").and_then(Value::as_str) {
            None | Some("bilinear") => Ok(Interpolation::Bilinear),
            Some("nearest") => Ok(Interpolation::Nearest),
            Some(other) => Err(Error::format(
                format!("{class} config"),
                format!(
                    "interpolation {other:?} is not supported (ferroflow has \"nearest\" and \
                     \"bilinear\")"
                ),
            )),
        }
    }
}

/// `tf.image.resize` of NHWC images to `size` (TF 2's `resize_images_v2` without
/// antialiasing: half-pixel centres), as gathers along height and width so gradients flow.
/// Integer images are resized as float32 (TF's bilinear output type).
pub fn resize_images(x: &Tensor, size: [usize; 2], method: Interpolation) -> Result<Tensor> {
    if x.rank() != 4 {
        return Err(Error::invalid(
            "resize",
            format!("expects NHWC images (rank 4), got shape {:?}", x.shape()),
        ));
    }
    if size[0] == 0 || size[1] == 0 {
        return Err(Error::invalid(
            "resize",
            format!("the target size must be positive, got {size:?}"),
        ));
    }
    let dtype = match method {
        Interpolation::Bilinear if !x.dtype().is_float() => DType::F32,
        _ => x.dtype(),
    };
    let mut y = x.cast(dtype)?;
    for (axis, out) in [(1usize, size[0]), (2, size[1])] {
        let n = y.shape()[axis];
        if n == 0 {
            return Err(Error::invalid(
                "resize",
                format!("cannot resize an image with an empty axis: {:?}", y.shape()),
            ));
        }
        // TF computes the scale in float32.
        let scale = n as f32 / out as f32;
        y = match method {
            Interpolation::Nearest => {
                let idx: Vec<i64> = (0..out)
                    .map(|i| (((i as f32 + 0.5) * scale).floor() as i64).clamp(0, n as i64 - 1))
                    .collect();
                y.gather(&Tensor::from_vec(idx, &[out])?, axis as isize)?
            }
            Interpolation::Bilinear => {
                let mut lo = Vec::with_capacity(out);
                let mut hi = Vec::with_capacity(out);
                let mut lerp = Vec::with_capacity(out);
                for i in 0..out {
                    let v = (i as f32 + 0.5) * scale - 0.5;
                    let f = v.floor();
                    lo.push((f as i64).max(0));
                    hi.push((v.ceil() as i64).min(n as i64 - 1));
                    lerp.push((v - f) as f64);
                }
                let top = y.gather(&Tensor::from_vec(lo, &[out])?, axis as isize)?;
                let bottom = y.gather(&Tensor::from_vec(hi, &[out])?, axis as isize)?;
                let mut shape = vec![1usize; 4];
                shape[axis] = out;
                let lerp = Tensor::from_host(
                    ferroflow_tensor::HostData::from_f64_slice(dtype, &lerp),
                    &shape,
                )?;
                top.add(&bottom.sub(&top)?.mul(&lerp)?)?
            }
        };
    }
    Ok(y)
}

/// `tf.keras.layers.UpSampling2D`: repeats rows and columns `size` times (`nearest`) or
/// resizes bilinearly to `size` times the height and width.
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::UpSampling2D, Layer};
/// use ferroflow_tensor::Tensor;
/// let mut up = UpSampling2D::new([2, 3]);
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 2, 2, 1])?;
/// let y = up.forward(&x, false)?;
/// assert_eq!(y.shape(), &[1, 4, 6, 1]);
/// assert_eq!(y.to_vec::<f32>()?[..6], [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct UpSampling2D {
    base: LayerBase,
    /// Factors for height and width.
    pub size: [usize; 2],
    /// `nearest` (the default) or `bilinear`.
    pub interpolation: Interpolation,
}

impl UpSampling2D {
    /// Nearest-neighbour upsampling by `size`.
    pub fn new(size: [usize; 2]) -> UpSampling2D {
        UpSampling2D {
            base: LayerBase::new("up_sampling2d", None),
            size,
            interpolation: Interpolation::Nearest,
        }
    }
    /// Sets the interpolation.
    pub fn interpolation(mut self, interpolation: Interpolation) -> UpSampling2D {
        self.interpolation = interpolation;
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<UpSampling2D> {
        check_channels_last(c, "UpSampling2D")?;
        let interpolation = match c.get("interpolation") {
            None => Interpolation::Nearest,
            Some(_) => Interpolation::parse(c, "UpSampling2D")?,
        };
        Ok(UpSampling2D::new(cfg_pair(c, "UpSampling2D", "size")?).interpolation(interpolation))
    }
}

impl Layer for UpSampling2D {
    layer_base!("UpSampling2D");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc("UpSampling2D", inputs)?;
        if self.size.contains(&0) {
            return Err(Error::invalid(
                "UpSampling2D",
                format!("size must be positive, got {:?}", self.size),
            ));
        }
        let s = x.shape();
        let target = [
            s[1].checked_mul(self.size[0]),
            s[2].checked_mul(self.size[1]),
        ];
        let [Some(h), Some(w)] = target else {
            return Err(Error::invalid(
                "UpSampling2D",
                format!("{:?} times {:?} overflows", s, self.size),
            ));
        };
        Ok(vec![resize_images(x, [h, w], self.interpolation)?])
    }
    fn get_config(&self) -> Value {
        json!({
            "size": self.size,
            "interpolation": self.interpolation.name(),
            "data_format": "channels_last",
        })
    }
}

/// `tf.keras.layers.experimental.preprocessing.Resizing`: images to `height × width`
/// (`bilinear` by default, or `nearest`).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::Resizing, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut r = Resizing::new(3, 5);
/// let y = r.forward(&Tensor::ones(&[2, 6, 4, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[2, 3, 5, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct Resizing {
    base: LayerBase,
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
    /// `bilinear` (the default) or `nearest`.
    pub interpolation: Interpolation,
}

impl Resizing {
    /// Bilinear resizing to `height × width`.
    pub fn new(height: usize, width: usize) -> Resizing {
        Resizing {
            base: LayerBase::new("resizing", None),
            height,
            width,
            interpolation: Interpolation::Bilinear,
        }
    }
    /// Sets the interpolation.
    pub fn interpolation(mut self, interpolation: Interpolation) -> Resizing {
        self.interpolation = interpolation;
        self
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config; `crop_to_aspect_ratio` is
    /// refused).
    pub fn from_config(c: &Value) -> Result<Resizing> {
        check_channels_last(c, "Resizing")?;
        if c.get("crop_to_aspect_ratio").and_then(Value::as_bool) == Some(true) {
            return Err(Error::format(
                "Resizing config",
                "crop_to_aspect_ratio is not supported (TF 2.4's Resizing has no such option)",
            ));
        }
        Ok(Resizing::new(
            cfg_usize(c, "Resizing", "height")?,
            cfg_usize(c, "Resizing", "width")?,
        )
        .interpolation(Interpolation::parse(c, "Resizing")?))
    }
}

impl Layer for Resizing {
    layer_base!("Resizing");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc("Resizing", inputs)?;
        Ok(vec![resize_images(
            x,
            [self.height, self.width],
            self.interpolation,
        )?])
    }
    fn get_config(&self) -> Value {
        json!({
            "height": self.height,
            "width": self.width,
            "interpolation": self.interpolation.name(),
        })
    }
}

/// `tf.keras.layers.experimental.preprocessing.CenterCrop`: the central `height × width`
/// of each image (an input smaller than that is an error, as in TF 2.4).
///
/// ```
/// ferroflow::init();
/// use ferroflow_keras::{layers::CenterCrop, Layer};
/// use ferroflow_tensor::{DType, Tensor};
/// let mut c = CenterCrop::new(2, 2);
/// let y = c.forward(&Tensor::ones(&[1, 5, 4, 3], DType::F32)?, false)?;
/// assert_eq!(y.shape(), &[1, 2, 2, 3]);
/// # Ok::<(), ferroflow_tensor::Error>(())
/// ```
pub struct CenterCrop {
    base: LayerBase,
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
}

impl CenterCrop {
    /// The central `height × width`.
    pub fn new(height: usize, width: usize) -> CenterCrop {
        CenterCrop {
            base: LayerBase::new("center_crop", None),
            height,
            width,
        }
    }
    /// Rebuilds from [`Layer::get_config`] (or Keras' own config).
    pub fn from_config(c: &Value) -> Result<CenterCrop> {
        check_channels_last(c, "CenterCrop")?;
        Ok(CenterCrop::new(
            cfg_usize(c, "CenterCrop", "height")?,
            cfg_usize(c, "CenterCrop", "width")?,
        ))
    }
}

impl Layer for CenterCrop {
    layer_base!("CenterCrop");
    fn call(&mut self, inputs: &[Tensor], _training: bool) -> Result<Vec<Tensor>> {
        expect_inputs(self, inputs, 1)?;
        let x = nhwc("CenterCrop", inputs)?;
        let s = x.shape();
        if self.height == 0 || self.width == 0 || s[1] < self.height || s[2] < self.width {
            return Err(Error::invalid(
                "CenterCrop",
                format!(
                    "the crop {}x{} must be non-empty and fit the input's {}x{}",
                    self.height, self.width, s[1], s[2]
                ),
            ));
        }
        let (top, left) = ((s[1] - self.height) / 2, (s[2] - self.width) / 2);
        Ok(vec![x.slice(
            &[0, top, left, 0],
            &[-1, self.height as isize, self.width as isize, -1],
        )?])
    }
    fn get_config(&self) -> Value {
        json!({ "height": self.height, "width": self.width })
    }
}
