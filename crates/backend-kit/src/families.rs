//! Syncing each IP family on its own.
//!
//! kube-proxy runs one proxier per family; a failure in one (IPv6 disabled, a refused
//! transaction) must not keep the other from converging. Every family is therefore attempted,
//! each failure is logged, and the sync as a whole reports the first one so that the runner
//! retries with a full sync.

use kpng_backend::BackendError;
use kpng_model::Family;
use tracing::warn;

/// Runs `sync_one` for every index of `families`, summing the operations. Every index is
/// attempted even after a failure; the first error is returned, as
/// [`BackendError::InFamilies`] naming every family that failed (the others synced: their
/// health and last-sync timestamps move on, as kube-proxy's other proxier's would).
pub fn sync_each(
    families: &[Family],
    mut sync_one: impl FnMut(usize) -> Result<usize, BackendError>,
) -> Result<usize, BackendError> {
    let mut operations = 0;
    let mut first_error = None;
    let mut failed = Vec::new();
    for (index, family) in families.iter().enumerate() {
        match sync_one(index) {
            Ok(n) => operations += n,
            Err(e) => {
                warn!("{e}");
                failed.push(*family);
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(error) => Err(BackendError::InFamilies {
            failed,
            error: Box::new(error),
        }),
        None => Ok(operations),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_attempted_and_the_first_error_wins() {
        let mut seen = Vec::new();
        let result = sync_each(&[Family::V4, Family::V6, Family::V4], |i| {
            seen.push(i);
            match i {
                0 => Err(BackendError::Other("first".into())),
                1 => Err(BackendError::Other("second".into())),
                _ => Ok(5),
            }
        });
        assert_eq!(seen, [0, 1, 2]);
        let error = result.expect_err("failed");
        assert_eq!(error.to_string(), "first");
        assert_eq!(
            error.failed_families(),
            Some(&[Family::V4, Family::V6][..]),
            "the families that failed, the others synced"
        );
        assert_eq!(
            sync_each(&[Family::V4, Family::V6], |_| Ok(3)).ok(),
            Some(6)
        );
    }
}
