//! The `key=value,...` syntax shared by problem keys and `tune --shapes` specs.
//!
//! Parsing borrows from the spec and allocates nothing on success: the runtime parses every
//! stored problem key when it loads a database of up to hundreds of thousands of winners.

use std::str::FromStr;

use crate::{KernelError, Result};

/// Parsed fields of one spec; every read marks the key used so leftovers are reported as
/// unknown.
pub(crate) struct Fields<'a> {
    spec: &'a str,
    /// (key, value, used)
    pairs: Vec<(&'a str, &'a str, bool)>,
}

impl<'a> Fields<'a> {
    pub fn parse(spec: &'a str, body: &'a str) -> Result<Self> {
        let mut pairs: Vec<(&str, &str, bool)> = Vec::with_capacity(9);
        for part in body.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| KernelError::BadSpec {
                spec: spec.to_string(),
                reason: format!("`{part}` is not `key=value`"),
            })?;
            let key = k.trim();
            if pairs.iter().any(|(q, _, _)| q.eq_ignore_ascii_case(key)) {
                return Err(KernelError::BadSpec {
                    spec: spec.to_string(),
                    reason: format!("key `{}` given twice", key.to_ascii_lowercase()),
                });
            }
            pairs.push((key, v.trim(), false));
        }
        Ok(Fields { spec, pairs })
    }

    fn bad(&self, reason: String) -> KernelError {
        KernelError::BadSpec {
            spec: self.spec.to_string(),
            reason,
        }
    }

    /// A required field.
    pub fn req<T: FromStr>(&mut self, key: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.opt(key)? {
            Some(v) => Ok(v),
            None => Err(self.bad(format!("missing required key `{key}`"))),
        }
    }

    /// An optional field.
    pub fn opt<T: FromStr>(&mut self, key: &str) -> Result<Option<T>>
    where
        T::Err: std::fmt::Display,
    {
        let Some(pair) = self
            .pairs
            .iter_mut()
            .find(|(k, _, _)| k.eq_ignore_ascii_case(key))
        else {
            return Ok(None);
        };
        pair.2 = true;
        let v = pair.1;
        v.parse::<T>()
            .map(Some)
            .map_err(|e| self.bad(format!("`{key}={v}`: {e}")))
    }

    /// Fails on keys nobody read.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        if let Some((k, _, _)) = self.pairs.iter().find(|(_, _, used)| !used) {
            return Err(self.bad(format!(
                "unknown key `{}` (known keys: {})",
                k.to_ascii_lowercase(),
                known.join(", ")
            )));
        }
        Ok(())
    }
}
