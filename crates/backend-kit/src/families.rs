//! Syncing each IP family on its own.
//!
//! kube-proxy runs one proxier per family; a failure in one (IPv6 disabled, a refused
//! transaction) must not keep the other from converging. Every family is therefore attempted,
//! each failure is logged, and the sync as a whole reports the first one so that the runner
//! retries with a full sync.

use kpng_backend::BackendError;
use tracing::warn;

/// Runs `sync_one` for every family index in `0..count`, summing the operations. Every index is
/// attempted even after a failure; the first error is returned.
pub fn sync_each(
    count: usize,
    mut sync_one: impl FnMut(usize) -> Result<usize, BackendError>,
) -> Result<usize, BackendError> {
    let mut operations = 0;
    let mut first_error = None;
    for index in 0..count {
        match sync_one(index) {
            Ok(n) => operations += n,
            Err(e) => {
                warn!("{e}");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(operations),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_attempted_and_the_first_error_wins() {
        let mut seen = Vec::new();
        let result = sync_each(3, |i| {
            seen.push(i);
            match i {
                0 => Err(BackendError::Other("first".into())),
                1 => Err(BackendError::Other("second".into())),
                _ => Ok(5),
            }
        });
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(result.map_err(|e| e.to_string()), Err("first".to_string()));
        assert_eq!(sync_each(2, |_| Ok(3)).ok(), Some(6));
    }
}
