//! JSON has no NaN or infinity: serde_json writes them as `null`. Fields that may hold one read
//! `null` back as NaN, so a stored finding with a non-finite error still loads.

use serde::{Deserialize, Deserializer};

pub fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_check_with_a_nan_error_round_trips() {
        let c = super::super::StatCheck {
            stat: super::super::Stat::Max,
            error: f64::NAN,
            noise: 1.0,
            bound: f64::INFINITY,
            ratio: f64::NAN,
            pass: false,
            member: None,
        };
        let back: super::super::StatCheck = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert!(back.error.is_nan() && back.bound.is_nan() && back.noise == 1.0);
    }
}
