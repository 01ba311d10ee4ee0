//! Element types and their rounding rules.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// An element type of a tensor or an accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    BF16,
    F16,
    F32,
    I8,
    U8,
    I32,
    /// 16-bit integers: what int8 operands are widened to for AVX2's `vpmaddwd`.
    I16,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 7] = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I16,
    ];

    /// Size of one element in bytes.
    pub fn bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::BF16 | DType::F16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// The accumulator type that tensorized instructions use for this input type:
    /// f32 for floating point, i32 for integers.
    pub fn default_accumulator(self) -> DType {
        if self.is_float() {
            DType::F32
        } else {
            DType::I32
        }
    }

    /// The canonical lower-case name, as used in workload specs.
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I16 => "i16",
        }
    }

    /// Rounds an exact value to the nearest value this type can hold.
    ///
    /// Floats round to nearest even (bf16 and f16 emulated through `half`); integers wrap like the
    /// two's-complement registers of the hardware (i32) or saturate (i8/u8, as a cast with
    /// saturation, which is what quantised epilogues do).
    pub fn round(self, value: f64) -> f64 {
        match self {
            DType::F32 => value as f32 as f64,
            DType::BF16 => half::bf16::from_f64(value).to_f64(),
            DType::F16 => half::f16::from_f64(value).to_f64(),
            DType::I32 => (value.round() as i64) as i32 as f64,
            DType::I8 => value.round().clamp(-128.0, 127.0),
            DType::U8 => value.round().clamp(0.0, 255.0),
            DType::I16 => value.round().clamp(-32768.0, 32767.0),
        }
    }

    /// Whether `self` reaches an instruction taking `to` without changing a value: the same
    /// type, or an exact widening on the way in.
    pub fn fits_exactly_in(self, to: DType) -> bool {
        self == to || self.widens_exactly_to(to)
    }

    /// Whether every value of `self` is exactly a value of `to` (bf16/f16 -> f32, 8-bit
    /// integers -> i16 or i32, i16 -> i32): the conversions a pack may apply on the way to
    /// an instruction without changing the result. A type does not widen to itself.
    pub fn widens_exactly_to(self, to: DType) -> bool {
        use DType::*;
        matches!(
            (self, to),
            (BF16 | F16, F32) | (I8 | U8, I16) | (I8 | U8 | I16, I32)
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = match s {
            "bf16" => DType::BF16,
            "f16" | "fp16" => DType::F16,
            "f32" | "fp32" => DType::F32,
            "i8" | "s8" | "int8" => DType::I8,
            "u8" | "uint8" => DType::U8,
            "i32" | "s32" | "int32" => DType::I32,
            "i16" | "s16" | "int16" => DType::I16,
            other => {
                return Err(SpecError::UnknownDType {
                    value: other.to_string(),
                });
            }
        };
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names_round_trip() {
        for t in DType::ALL {
            assert_eq!(t.name().parse::<DType>().unwrap(), t);
        }
        assert_eq!(DType::BF16.bytes(), 2);
        assert_eq!(DType::U8.bytes(), 1);
        assert_eq!(DType::I32.bytes(), 4);
    }

    #[test]
    fn rounding_matches_the_formats() {
        // 1 + 2^-8 is not representable in bf16 (7 mantissa bits): it rounds to even, i.e. 1.0.
        assert_eq!(DType::BF16.round(1.0 + 1.0 / 256.0), 1.0);
        // f16 has 10 mantissa bits.
        assert_eq!(DType::F16.round(1.0 + 1.0 / 1024.0), 1.0 + 1.0 / 1024.0);
        assert_eq!(DType::I32.round(2_147_483_648.0), -2_147_483_648.0);
        assert_eq!(DType::I8.round(300.0), 127.0);
        assert_eq!(DType::I16.round(40000.0), 32767.0);
        assert!("q4".parse::<DType>().is_err());
    }

    #[test]
    fn exact_widenings_are_the_lossless_ones() {
        use DType::*;
        assert!(BF16.widens_exactly_to(F32) && F16.widens_exactly_to(F32));
        assert!(U8.widens_exactly_to(I16) && I8.widens_exactly_to(I16));
        assert!(!F32.widens_exactly_to(BF16) && !BF16.widens_exactly_to(F16));
        assert!(!I16.widens_exactly_to(I8) && !F32.widens_exactly_to(F32));
        // Integers never become floats: f32 holds every i8 but the instruction would
        // round its i32 sums.
        assert!(!I8.widens_exactly_to(F32));
    }
}
