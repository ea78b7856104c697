//! Element types that collectives move and reduce.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::Error;

/// The runtime tag of an element type; it travels in every frame header so that ranks that
/// disagree on the type get an error instead of garbage.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// `f32`
    F32 = 0,
    /// `f64`
    F64 = 1,
    /// `half::f16`
    F16 = 2,
    /// `half::bf16`
    BF16 = 3,
    /// `i8`
    I8 = 4,
    /// `i32`
    I32 = 5,
    /// `i64`
    I64 = 6,
    /// `u8`
    U8 = 7,
    /// `u32`
    U32 = 8,
    /// `u64`
    U64 = 9,
}

impl DType {
    /// Every element type, in tag order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Short lowercase name (`f32`, `bf16`, `u8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    /// Decodes a wire tag.
    pub(crate) fn from_tag(tag: u8) -> Option<DType> {
        DType::ALL.get(tag as usize).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Accepts the short names and the nccl-tests names (`float`, `double`, `half`, `int32`...).
    fn from_str(s: &str) -> Result<Self, Error> {
        let t = match s.to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => DType::F32,
            "f64" | "double" | "float64" => DType::F64,
            "f16" | "half" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i8" | "int8" => DType::I8,
            "i32" | "int" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "u8" | "uint8" => DType::U8,
            "u32" | "uint32" => DType::U32,
            "u64" | "uint64" => DType::U64,
            _ => {
                return Err(Error::Config(format!(
                    "unknown element type '{s}': expected one of f32 f64 f16 bf16 i8 i32 i64 u8 u32 u64"
                )));
            }
        };
        Ok(t)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain element type that collectives can move and reduce: `f32`, `f64`, `f16`, `bf16`,
/// `i8`, `i32`, `i64`, `u8`, `u32`, `u64`. Sealed: the reduction kernels exist for exactly these.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;

    /// Converts from `f64` as an `as` cast does (saturating for integers, rounding to
    /// nearest for floats); meant for building test and benchmark data.
    fn from_f64(v: f64) -> Self;

    /// Converts to `f64` (exact for every value of the 32-bit and smaller types).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}

element!(f32 => F32, f64 => F64, i8 => I8, i32 => I32, i64 => I64, u8 => U8, u32 => U32, u64 => U64);

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
        }
    )*};
}

half_element!(f16 => F16, bf16 => BF16);

/// Runs `$body` with the type alias `$T` set to the element type of `$dtype` (a [`DType`]):
/// how code that learns the type at run time (the C API, the Python package) calls the
/// typed API once per type.
///
/// ```
/// use xccl::{DType, Element, with_element};
/// let d = DType::BF16;
/// let size = with_element!(d, T => size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size(), size_of::<f32>());
        assert_eq!(DType::BF16.size(), size_of::<bf16>());
        assert_eq!(DType::U64.size(), size_of::<u64>());
        assert_eq!(DType::I8.size(), 1);
    }

    #[test]
    fn conversions_cast_like_as() {
        assert_eq!(<u8 as Element>::from_f64(300.0), 255);
        assert_eq!(<i8 as Element>::from_f64(-3.7), -3);
        assert_eq!(<bf16 as Element>::from_f64(2.0).to_f64(), 2.0);
        assert_eq!(<f16 as Element>::from_f64(0.5), f16::from_f32(0.5));
    }

    #[test]
    fn tags_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_tag(d as u8), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::from_tag(10), None);
        assert_eq!("float".parse::<DType>().unwrap(), DType::F32);
        assert!("f128".parse::<DType>().is_err());
    }
}
