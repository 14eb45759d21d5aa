//! The `key=value,...` syntax shared by problem keys and `tune --shapes` specs.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::{KernelError, Result};

/// Parsed fields of one spec; every read removes the key so leftovers are reported as unknown.
pub(crate) struct Fields {
    spec: String,
    map: BTreeMap<String, String>,
}

impl Fields {
    pub fn parse(spec: &str, body: &str) -> Result<Self> {
        let mut map = BTreeMap::new();
        for part in body.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| KernelError::BadSpec {
                spec: spec.to_string(),
                reason: format!("`{part}` is not `key=value`"),
            })?;
            let key = k.trim().to_ascii_lowercase();
            if map.insert(key.clone(), v.trim().to_string()).is_some() {
                return Err(KernelError::BadSpec {
                    spec: spec.to_string(),
                    reason: format!("key `{key}` given twice"),
                });
            }
        }
        Ok(Fields {
            spec: spec.to_string(),
            map,
        })
    }

    fn bad(&self, reason: String) -> KernelError {
        KernelError::BadSpec {
            spec: self.spec.clone(),
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
        match self.map.remove(key) {
            None => Ok(None),
            Some(v) => v
                .parse::<T>()
                .map(Some)
                .map_err(|e| self.bad(format!("`{key}={v}`: {e}"))),
        }
    }

    /// Fails on keys nobody read.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        if let Some(k) = self.map.keys().next() {
            return Err(self.bad(format!(
                "unknown key `{k}` (known keys: {})",
                known.join(", ")
            )));
        }
        Ok(())
    }
}
