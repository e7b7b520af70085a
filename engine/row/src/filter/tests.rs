//! Filter evaluation against typed values computed in Rust: each row is
//! built with the mapper's own encoding (put_scalar), each predicate is
//! also evaluated on the Rust values, and the two must agree.

use proptest::prelude::*;

use super::*;
use crate::coerce::{EpochUnit, Put, Tok, put_scalar};
use crate::spec::{MissingValue, simple_columns};
use crate::types::ChType;

fn ty(t: &str) -> ChType {
    ChType::parse(t).unwrap()
}

fn rules() -> TimeRules {
    TimeRules {
        epoch_unit: EpochUnit::Seconds,
        ..TimeRules::default()
    }
}

/// The columns every test row has.
const TYPES: [(&str, &str); 12] = [
    ("i8", "Int8"),
    ("u32", "UInt32"),
    ("i64", "Int64"),
    ("u64", "UInt64"),
    ("f64", "Float64"),
    ("f32", "Float32"),
    ("s", "String"),
    ("ni", "Nullable(Int32)"),
    ("lc", "LowCardinality(String)"),
    ("lcn", "LowCardinality(Nullable(String))"),
    ("dt", "DateTime"),
    ("i128", "Int128"),
];

fn columns() -> Vec<ColumnSpec> {
    simple_columns(TYPES.iter().map(|(n, t)| (*n, ty(t))))
}

/// One row's values.
#[derive(Clone, Debug)]
struct Row {
    i8: i8,
    u32: u32,
    i64: i64,
    u64: u64,
    f64: f64,
    f32: f32,
    s: String,
    ni: Option<i32>,
    lc: String,
    lcn: Option<String>,
    dt: u32,
    i128: i128,
}

fn put(out: &mut Vec<u8>, t: &str, tok: Tok<'_>) {
    assert_eq!(
        put_scalar(&ty(t), tok, &rules(), out),
        Ok(Put::Written),
        "{t}"
    );
}

fn encode(r: &Row, markers: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let num = |v: String| v;
    let cells: Vec<(&str, Option<String>, bool)> = vec![
        ("Int8", Some(num(r.i8.to_string())), false),
        ("UInt32", Some(r.u32.to_string()), false),
        ("Int64", Some(r.i64.to_string()), false),
        ("UInt64", Some(r.u64.to_string()), false),
        ("Float64", Some(format!("{:?}", r.f64)), false),
        ("Float32", Some(format!("{:?}", r.f32)), false),
        ("String", Some(r.s.clone()), true),
        ("Nullable(Int32)", r.ni.map(|v| v.to_string()), false),
        ("LowCardinality(String)", Some(r.lc.clone()), true),
        ("LowCardinality(Nullable(String))", r.lcn.clone(), true),
        ("DateTime", Some(r.dt.to_string()), false),
        ("Int128", Some(r.i128.to_string()), false),
    ];
    for (t, v, string) in &cells {
        if markers {
            out.push(0);
        }
        match v {
            None => put(&mut out, t, Tok::Null),
            Some(v) if v == "NaN" => put(&mut out, t, Tok::Str(b"nan")),
            Some(v) if *string => put(&mut out, t, Tok::Str(v.as_bytes())),
            Some(v) => put(&mut out, t, Tok::Number(v.as_bytes())),
        }
    }
    out
}

fn arb_row() -> impl Strategy<Value = Row> {
    let s = prop::sample::select(vec!["", "a", "ab", "b", "drop", "C", "hPa", "é"]);
    (
        (
            any::<i8>(),
            prop_oneof![any::<u32>(), 0u32..4],
            any::<i64>(),
            any::<u64>(),
            prop_oneof![-4.0f64..4.0, Just(f64::NAN), Just(-0.0), Just(0.25)],
            prop_oneof![-4.0f32..4.0, Just(0.5f32)],
        ),
        (
            s.clone().prop_map(str::to_owned),
            prop::option::of(-3i32..3),
            s.clone().prop_map(str::to_owned),
            prop::option::of(s.prop_map(str::to_owned)),
            prop_oneof![any::<u32>(), 1_700_000_000u32..1_700_000_003],
            prop_oneof![any::<i128>(), -2i128..2],
        ),
    )
        .prop_map(
            |((i8, u32, i64, u64, f64, f32), (s, ni, lc, lcn, dt, i128))| Row {
                i8,
                u32,
                i64,
                u64,
                f64,
                f32,
                s,
                ni,
                lc,
                lcn,
                dt,
                i128,
            },
        )
}

fn holds<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// A predicate on one column and what it gives on `r`, computed in Rust.
#[derive(Clone, Debug)]
struct Case {
    text: String,
    column: usize,
    op: CmpOp,
    constant: String,
}

fn arb_op() -> impl Strategy<Value = CmpOp> {
    prop::sample::select(vec![
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ])
}

fn arb_case() -> impl Strategy<Value = Case> {
    let consts = prop::sample::select(vec![
        "0",
        "1",
        "-1",
        "2",
        "3",
        "127",
        "-128",
        "0.25",
        "-0.0",
        "4294967295",
        "1700000001",
        "\"\"",
        "\"a\"",
        "\"ab\"",
        "\"drop\"",
        "\"é\"",
    ]);
    (0usize..TYPES.len(), arb_op(), consts).prop_map(|(column, op, constant)| Case {
        text: format!("{} {} {constant}", TYPES[column].0, op.as_str()),
        column,
        op,
        constant: constant.to_owned(),
    })
}

/// What `case` gives on `r` in Rust, or `None` when the constant does not
/// fit the column's type (the filter must refuse to compile then).
fn reference(case: &Case, r: &Row) -> Option<bool> {
    let c = case.constant.as_str();
    let quoted = c.starts_with('"');
    let text = c.trim_matches('"');
    let op = case.op;
    let string_col = matches!(TYPES[case.column].1, t if t.contains("String"));
    if string_col {
        // Numbers into a String column are their text (the mapper's rule).
        let k = text.as_bytes();
        return Some(match case.column {
            6 => holds(op, r.s.as_bytes(), k),
            8 => holds(op, r.lc.as_bytes(), k),
            9 => r.lcn.as_ref().is_some_and(|v| holds(op, v.as_bytes(), k)),
            _ => unreachable!(),
        });
    }
    if quoted && text.parse::<f64>().is_err() {
        return None;
    }
    let int = |lo: i128, hi: i128| -> Option<i128> {
        // An exact decimal (`-0.0`, `2.00`) is its integer (the mapper's
        // rule); any other fraction is refused.
        let whole = match text.split_once('.') {
            Some((w, f)) if f.bytes().all(|b| b == b'0') => w,
            Some(_) => return None,
            None => text,
        };
        let v: i128 = whole.parse().ok()?;
        (lo..=hi).contains(&v).then_some(v)
    };
    Some(match case.column {
        0 => holds(op, i128::from(r.i8), int(-128, 127)?),
        1 => holds(op, i128::from(r.u32), int(0, u32::MAX.into())?),
        2 => holds(
            op,
            i128::from(r.i64),
            int(i64::MIN.into(), i64::MAX.into())?,
        ),
        3 => holds(op, i128::from(r.u64), int(0, u64::MAX.into())?),
        4 => {
            let k: f64 = text.parse().ok()?;
            op == CmpOp::Ne && r.f64.is_nan() || holds(op, r.f64, k)
        }
        5 => {
            let k: f32 = text.parse().ok()?;
            holds(op, r.f32, k)
        }
        7 => {
            let k = int(i32::MIN.into(), i32::MAX.into())?;
            r.ni.is_some_and(|v| holds(op, i128::from(v), k))
        }
        10 => {
            // Epoch seconds, a fraction cut toward zero (the mapper's rule,
            // as ClickHouse converts numbers).
            let k = text.parse::<f64>().ok()?.trunc();
            if !(0.0..=f64::from(u32::MAX)).contains(&k) {
                return None;
            }
            holds(op, i128::from(r.dt), k as i128)
        }
        11 => holds(op, r.i128, int(i128::MIN, i128::MAX)?),
        _ => unreachable!(),
    })
}

fn compile(text: &str, markers: bool) -> Result<RowFilter, FilterError> {
    let e = FilterExpr::parse_predicate(text).expect("parses");
    let format = if markers {
        RowFormat::RowBinaryWithDefaults
    } else {
        RowFormat::RowBinary
    };
    RowFilter::compile(&e, &columns(), format, &rules())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Typed comparisons per column type (ints of every width, floats with
    /// NaN and -0.0, strings, Nullable, LowCardinality, DateTime, Int128)
    /// agree with Rust's on the same values, in both row formats.
    #[test]
    fn comparisons_agree_with_rust_values(r in arb_row(), case in arb_case(), markers in any::<bool>()) {
        let row = encode(&r, markers);
        match (reference(&case, &r), compile(&case.text, markers)) {
            (Some(want), Ok(mut f)) => prop_assert_eq!(f.keep(&row), want, "{} on {:?}", case.text, r),
            (None, Err(_)) => {}
            (want, got) => prop_assert!(false, "{}: reference {:?}, compile {:?}", case.text, want, got.err()),
        }
    }

    /// `all` / `any` are conjunction and disjunction of their parts.
    #[test]
    fn groups_combine_their_parts(r in arb_row(), a in arb_case(), b in arb_case()) {
        let row = encode(&r, false);
        let (Some(x), Some(y)) = (reference(&a, &r), reference(&b, &r)) else {
            return Ok(());
        };
        let pa = FilterExpr::parse_predicate(&a.text).unwrap();
        let pb = FilterExpr::parse_predicate(&b.text).unwrap();
        for (e, want) in [
            (FilterExpr::All(vec![pa.clone(), pb.clone()]), x && y),
            (FilterExpr::Any(vec![pa.clone(), pb.clone()]), x || y),
            (FilterExpr::Any(vec![FilterExpr::All(vec![pa.clone()]), FilterExpr::All(vec![pb.clone(), pa.clone()])]), x),
        ] {
            let mut f = RowFilter::compile(&e, &columns(), RowFormat::RowBinary, &rules()).unwrap();
            prop_assert_eq!(f.keep(&row), want, "{}", e);
        }
    }
}

fn row0() -> Row {
    Row {
        i8: -5,
        u32: 7,
        i64: -1,
        u64: u64::MAX,
        f64: 0.25,
        f32: 1.5,
        s: "drop".into(),
        ni: None,
        lc: "hPa".into(),
        lcn: Some("eu-1".into()),
        dt: 1_700_000_000,
        i128: -2,
    }
}

#[test]
fn nulls_compare_false_and_is_null_sees_them() {
    let row = encode(&row0(), false);
    for (text, want) in [
        ("ni == 0", false),
        ("ni != 0", false),
        ("ni is null", true),
        ("ni is not null", false),
        ("lcn is not null", true),
        ("lcn in [\"eu-0\", \"eu-1\"]", true),
        ("lcn in [\"eu-0\"]", false),
        ("s != 'drop'", false),
        ("s == \"drop\"", true),
        ("u64 == 18446744073709551615", true),
        ("u64 > 0", true),
        ("i8 < -4", true),
        ("i128 < -1", true),
        ("dt >= \"2023-11-14 22:13:20\"", true),
        ("dt > \"2023-11-14 22:13:20\"", false),
        ("dt == 1700000000", true),
        ("f64 >= 0", true),
        ("f64 in [0.25, 3]", true),
    ] {
        let mut f = compile(text, false).unwrap();
        assert_eq!(f.keep(&row), want, "{text}");
    }
}

#[test]
fn compile_refuses_what_it_cannot_see_naming_the_column() {
    for (text, column, says) in [
        ("nope == 1", "nope", "not a column of the INSERT"),
        ("u32 == -1", "u32", "does not fit"),
        ("i8 == 300", "i8", "does not fit"),
        ("u32 == \"x\"", "u32", "does not fit"),
        ("s is null", "s", "not Nullable"),
        ("dt == \"yesterday\"", "dt", "does not fit"),
    ] {
        let e = compile(text, false).unwrap_err();
        assert_eq!(e.column, column, "{text}");
        assert!(e.to_string().contains(says), "{text}: {e}");
    }
    let cols = simple_columns([("a", ty("Array(Int32)")), ("u", ty("UUID"))]);
    for (text, says) in [
        ("a == 1", "only scalar columns"),
        ("u < \"x\"", "==, != and in only"),
    ] {
        let e = FilterExpr::parse_predicate(text).unwrap();
        let err = RowFilter::compile(&e, &cols, RowFormat::RowBinary, &rules()).unwrap_err();
        assert!(err.to_string().contains(says), "{text}: {err}");
    }
    // A column whose value may be the server's per-row DEFAULT.
    let mut cols = simple_columns([("x", ty("UInt32"))]);
    cols[0].missing = MissingValue::ServerDefault;
    let e = FilterExpr::parse_predicate("x > 1").unwrap();
    let err =
        RowFilter::compile(&e, &cols, RowFormat::RowBinaryWithDefaults, &rules()).unwrap_err();
    assert!(err.to_string().contains("per-row DEFAULT"), "{err}");
}

#[test]
fn predicates_parse_and_print_back() {
    for (text, printed) in [
        ("unit != \"drop\"", "unit != \"drop\""),
        ("value>=0", "value >= 0"),
        ("region in [\"eu-0\", 'x']", ""),
        ("quality is null", "quality is null"),
        ("quality IS NOT NULL", "quality is not null"),
        ("`odd name` == 'it\\'s'", "odd name == \"it's\""),
        ("n in [1, 2.5, true]", "n in [1, 2.5, true]"),
    ] {
        match FilterExpr::parse_predicate(text) {
            Ok(e) if !printed.is_empty() => assert_eq!(e.to_string(), printed, "{text}"),
            Ok(_) => {}
            Err(e) if printed.is_empty() => assert!(e.reason.contains("JSON list"), "{e}"),
            Err(e) => panic!("{text}: {e}"),
        }
    }
    for bad in [
        "",
        "== 1",
        "x = 1",
        "x == ",
        "x == drop",
        "x == null",
        "x in []",
        "x is nil",
        "x ~ 1",
    ] {
        assert!(FilterExpr::parse_predicate(bad).is_err(), "{bad}");
    }
}
