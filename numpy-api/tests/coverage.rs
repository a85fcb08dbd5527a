//! NUMPY_COVERAGE.md, generated from the code: every NumPy function named in
//! `numpy_names.txt` (NumPy's public callables), marked supported when a `pub fn` of that
//! name exists in this crate's source (`linalg.*` and `random.*` in their modules), else
//! with the reason it is missing. The test fails when the committed file is out of date;
//! `cargo xtask numpy-coverage` (or `FERROFLOW_UPDATE_COVERAGE=1`) rewrites it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Why a NumPy function is missing.
fn reason(name: &str) -> String {
    const ALIASES: &[(&str, &str)] = &[
        ("acos", "arccos"),
        ("asin", "arcsin"),
        ("atan", "arctan"),
        ("atan2", "arctan2"),
        ("acosh", "arccosh"),
        ("asinh", "arcsinh"),
        ("atanh", "arctanh"),
        ("pow", "power"),
        ("concat", "concatenate"),
        ("permute_dims", "transpose"),
        ("amax", "max"),
        ("true_divide", "divide"),
        ("row_stack", "vstack"),
        ("round", "around"),
    ];
    if let Some((_, of)) = ALIASES.iter().find(|(a, _)| *a == name) {
        return format!("NumPy 2 alias of `{of}`, which is supported");
    }
    let groups: &[(&[&str], &str)] = &[
        (
            &["sort_complex", "real_if_close"],
            "orders or narrows complex numbers: complex numbers have no order in ferroflow (TF's rule)",
        ),
        (
            &["linalg.eig", "linalg.eigvals", "vecdot"],
            "complex results of host linear algebra (nalgebra's): not implemented",
        ),
        (
            &["fft.fftn", "fft.ifftn", "fft.rfft2", "fft.irfft2", "fft.rfftn", "fft.irfftn",
              "fft.hfft", "fft.ihfft"],
            "n-dimensional and Hermitian transforms: not implemented (compose the 1-D ones)",
        ),
        (
            &["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_invert", "invert",
              "left_shift", "right_shift", "bitwise_left_shift", "bitwise_right_shift",
              "bitwise_count", "packbits", "unpackbits", "gcd", "lcm"],
            "bit and integer-theory operations: no primitive for them yet",
        ),
        (
            &["datetime_as_string", "datetime_data", "busday_count", "busday_offset", "is_busday",
              "busdaycalendar"],
            "datetime dtypes: ferroflow has none",
        ),
        (
            &["loadtxt", "savetxt", "genfromtxt", "fromfile", "fromstring", "frombuffer", "fromregex",
              "fromiter", "memmap", "fromfunction", "fromstring", "load", "save", "savez",
              "savez_compressed", "from_dlpack"],
            "file and buffer I/O other than .npy/.npz (those are `load`/`save`/`savez` in `io`)",
        ),
        (
            &["array2string", "array_repr", "array_str", "set_printoptions", "get_printoptions",
              "printoptions", "format_float_positional", "format_float_scientific", "base_repr",
              "binary_repr", "info", "show_config", "show_runtime", "get_include", "test",
              "typename", "mintypecode", "isscalar", "ndim", "shape", "size", "iterable",
              "may_share_memory", "shares_memory", "isfortran", "byte_bounds", "setbufsize",
              "getbufsize"],
            "Python-object utilities: use the `Tensor` methods (`shape()`, `rank()`, `Debug`)",
        ),
        (
            &["poly", "polyadd", "polyder", "polydiv", "polyfit", "polyint", "polymul", "polysub",
              "polyval", "roots"],
            "polynomials: not implemented",
        ),
        (
            &["intersect1d", "union1d", "setdiff1d", "setxor1d", "isin", "in1d"],
            "set operations: not implemented (`unique` is)",
        ),
        (
            &["errstate", "seterr", "geterr", "seterrcall", "geterrcall", "seterrobj", "geterrobj"],
            "floating-point error state: ferroflow returns errors as values",
        ),
        (
            &["issubdtype", "isdtype", "min_scalar_type", "common_type", "obj2sctype", "sctype2char",
              "issctype", "issubclass_", "issubsctype", "find_common_type", "astype"],
            "dtype introspection: use `DType` (`promote_types`, `result_type`, `can_cast` are here)",
        ),
        (
            &["apply_along_axis", "apply_over_axes", "vectorize", "frompyfunc", "piecewise",
              "nditer", "nested_iters", "ndenumerate", "ndindex", "broadcast"],
            "applies Python callables: write a Rust closure over tensors instead",
        ),
        (
            &["copyto", "put", "putmask", "place", "put_along_axis", "fill_diagonal", "resize"],
            "in-place writes: tensors are immutable values (TF's rule); build a new array",
        ),
        (
            &["random.choice", "random.shuffle", "random.permutation", "random.normal",
              "random.random_sample", "random.binomial", "random.poisson", "random.exponential",
              "random.beta", "random.gamma"],
            "not in TF 2.4's tf.experimental.numpy.random: not implemented",
        ),
        (
            &["linalg.matrix_rank", "linalg.slogdet", "linalg.cond", "linalg.multi_dot",
              "linalg.tensorinv", "linalg.tensorsolve", "linalg.svdvals", "linalg.vector_norm",
              "linalg.matrix_norm", "linalg.cross", "linalg.diagonal", "linalg.matmul",
              "linalg.outer", "linalg.tensordot", "linalg.trace", "linalg.vecdot",
              "linalg.matrix_transpose"],
            "not in TF 2.4's subset: not implemented (the top-level function may be)",
        ),
    ];
    for (names, why) in groups {
        if names.contains(&name) {
            return why.to_string();
        }
    }
    "not implemented".to_string()
}

fn generate() -> String {
    let names_file =
        std::fs::read_to_string(crate_dir().join("numpy_names.txt")).expect("numpy_names.txt");
    let header: Vec<&str> = names_file.lines().filter(|l| l.starts_with('#')).collect();
    let numpy: BTreeSet<&str> = names_file
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let ours = common::public_functions();
    let supported: Vec<&&str> = numpy.iter().filter(|n| ours.contains_key(**n)).collect();
    let mut md = String::new();
    md.push_str("# NumPy coverage of ferroflow-numpy\n\n");
    md.push_str("Generated from the code by `cargo xtask numpy-coverage` (the test `numpy-api/tests/coverage.rs`\nfails when this file is out of date). A name is supported when `numpy-api/src` defines a\n`pub fn` of that name; every supported function is checked against NumPy by\n`numpy-api/tests/numpy_differential.rs` (random and file functions by their own tests).\n\n");
    for h in header {
        md.push_str(&format!("Names: {}\n", h.trim_start_matches("# ")));
    }
    md.push_str(&format!(
        "\n**{} of {} NumPy names supported.**\n\n| NumPy | ferroflow | module / reason |\n|---|---|---|\n",
        supported.len(),
        numpy.len()
    ));
    for n in &numpy {
        match ours.get(*n) {
            Some(module) => md.push_str(&format!("| `{n}` | yes | `{module}` |\n")),
            None => md.push_str(&format!("| `{n}` | no | {} |\n", reason(n))),
        }
    }
    let extras: Vec<&String> = ours
        .keys()
        .filter(|k| !numpy.contains(k.as_str()))
        .collect();
    md.push_str("\n## ferroflow additions (no NumPy function of that name)\n\n");
    for e in extras {
        md.push_str(&format!("- `{e}` (`{}`)\n", ours[e]));
    }
    md
}

#[test]
fn coverage_table_is_current() {
    let path = crate_dir()
        .parent()
        .expect("workspace")
        .join("NUMPY_COVERAGE.md");
    let md = generate();
    if std::env::var("FERROFLOW_UPDATE_COVERAGE").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &md).expect("write NUMPY_COVERAGE.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == md,
        "NUMPY_COVERAGE.md is out of date: run `cargo xtask numpy-coverage`"
    );
}
