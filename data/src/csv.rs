//! CSV files (`tf.data.experimental.CsvDataset`): one element per record, a `Vec` of scalar
//! tensors, one per selected column, typed by the column's [`CsvColumn`].
//!
//! Fields follow RFC 4180: a field may be quoted with `"`, a quoted field may hold the
//! delimiter, newlines and doubled quotes (`""`). An empty field takes the column's default,
//! or is an error for a required column; a field that does not parse as the column's dtype is
//! an error naming the file, line and column. A bad record is an `Err` item and iteration
//! goes on with the next record.
//!
//! ```
//! ferroflow::init();
//! use ferroflow_data::csv::{CsvColumn, CsvOptions};
//! use ferroflow_data::Dataset;
//! use ferroflow_tensor::DType;
//! let path = std::env::temp_dir().join("ferroflow-doc.csv");
//! std::fs::write(&path, "x,label\n1.5,3\n,4\n")?;
//! let ds = Dataset::csv(&[&path], CsvOptions {
//!     columns: vec![CsvColumn::with_default(DType::F32, 0.0), CsvColumn::required(DType::I32)],
//!     header: true,
//!     ..CsvOptions::default()
//! });
//! let rows: Vec<Vec<ferroflow_tensor::Tensor>> = ds.iter().collect::<Result<_, _>>()?;
//! assert_eq!(rows[1][0].item::<f32>()?, 0.0);
//! assert_eq!(rows[1][1].item::<i32>()?, 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use ferroflow_tensor::{DType, Error, HostData, Tensor};

use crate::dataset::{at_element, Cardinality, Dataset};
use crate::tfrecord::files_identity;

/// One column's type and default (TF's `record_defaults` entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CsvColumn {
    /// The dtype of the column's scalars.
    pub dtype: DType,
    /// The value of an empty field; `None` makes the field required.
    pub default: Option<f64>,
}

impl CsvColumn {
    /// A column whose fields must be present.
    pub fn required(dtype: DType) -> CsvColumn {
        CsvColumn {
            dtype,
            default: None,
        }
    }
    /// A column whose empty fields read as `default`.
    pub fn with_default(dtype: DType, default: f64) -> CsvColumn {
        CsvColumn {
            dtype,
            default: Some(default),
        }
    }
}

/// Options of [`Dataset::csv`].
#[derive(Debug, Clone, PartialEq)]
pub struct CsvOptions {
    /// One entry per selected column (per column of the file without `select_cols`).
    pub columns: Vec<CsvColumn>,
    /// The first line of each file names the columns and is skipped.
    pub header: bool,
    /// The field separator.
    pub field_delim: u8,
    /// Which columns (0-based, increasing) to keep; `None` keeps them all.
    pub select_cols: Option<Vec<usize>>,
    /// A field equal to this reads as empty (TF's `na_value`).
    pub na_value: String,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            columns: Vec::new(),
            header: false,
            field_delim: b',',
            select_cols: None,
            na_value: String::new(),
        }
    }
}

/// Splits one record into fields; `None` when a quote is still open (the record continues
/// on the next line).
fn split_record(line: &str, delim: char) -> std::result::Result<Option<Vec<String>>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut in_quotes = false;
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    in_quotes = false;
                }
            } else {
                field.push(c);
            }
        } else if c == '"' {
            if !field.is_empty() || quoted {
                return Err("a quote inside an unquoted field".into());
            }
            in_quotes = true;
            quoted = true;
        } else if c == delim {
            fields.push(std::mem::take(&mut field));
            quoted = false;
        } else if quoted {
            return Err(format!("text after a closing quote: {c:?}"));
        } else {
            field.push(c);
        }
    }
    if in_quotes {
        return Ok(None);
    }
    fields.push(field);
    Ok(Some(fields))
}

fn parse_field(text: &str, column: &CsvColumn, na: &str) -> std::result::Result<Tensor, String> {
    let text = text.trim();
    let dtype = column.dtype;
    if text.is_empty() || (!na.is_empty() && text == na) {
        let v = column
            .default
            .ok_or_else(|| "the field is empty and the column has no default".to_string())?;
        return Tensor::from_host(HostData::from_f64_slice(dtype, &[v]), &[])
            .map_err(|e| e.to_string());
    }
    let bad = || format!("{text:?} is not a valid {dtype}");
    let data = match dtype {
        DType::F32 => HostData::F32(vec![text.parse::<f32>().map_err(|_| bad())?]),
        DType::F64 => HostData::F64(vec![text.parse::<f64>().map_err(|_| bad())?]),
        DType::F16 | DType::BF16 => {
            HostData::from_f64_slice(dtype, &[text.parse::<f64>().map_err(|_| bad())?])
        }
        DType::I32 => HostData::I32(vec![text.parse::<i32>().map_err(|_| bad())?]),
        DType::I64 => HostData::I64(vec![text.parse::<i64>().map_err(|_| bad())?]),
        DType::I8 => HostData::I8(vec![text.parse::<i8>().map_err(|_| bad())?]),
        DType::U8 => HostData::U8(vec![text.parse::<u8>().map_err(|_| bad())?]),
        DType::I16 => HostData::I16(vec![text.parse::<i16>().map_err(|_| bad())?]),
        DType::U16 => HostData::U16(vec![text.parse::<u16>().map_err(|_| bad())?]),
        DType::U32 => HostData::U32(vec![text.parse::<u32>().map_err(|_| bad())?]),
        DType::U64 => HostData::U64(vec![text.parse::<u64>().map_err(|_| bad())?]),
        DType::Bool => HostData::Bool(vec![match text.to_ascii_lowercase().as_str() {
            "true" | "1" => true,
            "false" | "0" => false,
            _ => return Err(bad()),
        }]),
        DType::C64 | DType::C128 => {
            return Err(format!(
                "{dtype} columns are not read from CSV (TF's CsvDataset has none either)"
            ))
        }
    };
    Tensor::from_host(data, &[]).map_err(|e| e.to_string())
}

struct CsvReader {
    lines: std::io::Lines<BufReader<std::fs::File>>,
    path: PathBuf,
    line_no: usize,
}

impl CsvReader {
    /// The next record's fields and its first line number.
    fn next_record(
        &mut self,
        delim: char,
    ) -> Option<std::result::Result<(usize, Vec<String>), String>> {
        let mut text = String::new();
        let mut first = 0;
        loop {
            let line = match self.lines.next() {
                None if text.is_empty() => return None,
                None => return Some(Err(format!("line {first}: a quoted field is never closed"))),
                Some(Err(e)) => return Some(Err(format!("line {}: {e}", self.line_no + 1))),
                Some(Ok(l)) => l,
            };
            self.line_no += 1;
            if text.is_empty() {
                first = self.line_no;
                if line.trim().is_empty() {
                    continue; // blank lines separate nothing
                }
            } else {
                text.push('\n');
            }
            text.push_str(line.strip_suffix('\r').unwrap_or(&line));
            match split_record(&text, delim) {
                Ok(Some(fields)) => return Some(Ok((first, fields))),
                Ok(None) => continue,
                Err(msg) => return Some(Err(format!("line {first}: {msg}"))),
            }
        }
    }
}

fn record_to_tensors(
    fields: &[String],
    options: &CsvOptions,
) -> std::result::Result<Vec<Tensor>, String> {
    let cols: Vec<usize> = match &options.select_cols {
        Some(c) => c.clone(),
        None => (0..fields.len()).collect(),
    };
    if cols.len() != options.columns.len() {
        return Err(format!(
            "{} fields selected, {} column types given",
            cols.len(),
            options.columns.len()
        ));
    }
    cols.iter()
        .zip(&options.columns)
        .map(|(&c, column)| {
            let text = fields.get(c).ok_or_else(|| {
                format!(
                    "column {c} is missing: the record has {} fields",
                    fields.len()
                )
            })?;
            parse_field(text, column, &options.na_value).map_err(|m| format!("column {c}: {m}"))
        })
        .collect()
}

impl Dataset<Vec<Tensor>> {
    /// The records of CSV files, file after file (`CsvDataset`); see the [module](crate::csv)
    /// docs for the format.
    pub fn csv<P: AsRef<Path>>(paths: &[P], options: CsvOptions) -> Dataset<Vec<Tensor>> {
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let fp_paths = paths.clone();
        let fp_options = format!("{options:?}");
        Dataset::from_parts(
            Cardinality::Unknown,
            move || Ok(format!("csv({},{fp_options})", files_identity(&fp_paths))),
            move || {
                let options = options.clone();
                let delim = options.field_delim as char;
                let mut files = paths.clone().into_iter();
                let mut current: Option<CsvReader> = None;
                let mut index = 0u64;
                let mut stop = false;
                Box::new(std::iter::from_fn(move || loop {
                    if stop {
                        return None;
                    }
                    if let Some(r) = &mut current {
                        match r.next_record(delim) {
                            None => current = None,
                            Some(rec) => {
                                let i = index;
                                index += 1;
                                let what = r.path.display().to_string();
                                let out = rec.and_then(|(line, fields)| {
                                    record_to_tensors(&fields, &options)
                                        .map_err(|m| format!("line {line}: {m}"))
                                });
                                return Some(out.map_err(|m| {
                                    at_element("CsvDataset", i, Error::format(what, m))
                                }));
                            }
                        }
                    }
                    let path = files.next()?;
                    match std::fs::File::open(&path) {
                        Ok(f) => {
                            let mut r = CsvReader {
                                lines: BufReader::new(f).lines(),
                                path: path.clone(),
                                line_no: 0,
                            };
                            if options.header {
                                if let Some(Err(m)) = r.next_record(delim) {
                                    stop = true;
                                    return Some(Err(at_element(
                                        "CsvDataset",
                                        index,
                                        Error::format(path.display().to_string(), m),
                                    )));
                                }
                            }
                            current = Some(r);
                        }
                        Err(e) => {
                            stop = true;
                            return Some(Err(at_element(
                                "CsvDataset",
                                index,
                                Error::io(&path, &e),
                            )));
                        }
                    }
                }))
            },
        )
    }
}
