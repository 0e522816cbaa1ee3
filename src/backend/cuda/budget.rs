//! The hard cap on what the CUDA engine may hold. Every device buffer and pinned host buffer
//! reserves its bytes here *before* the driver call and refunds them if the call fails or when
//! the buffer is freed, so concurrent allocations can never overshoot the cap and a refused one
//! leaves `used` and `peak` exactly as they were. Pure bookkeeping: testable without a GPU.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {requested} bytes requested with {used} of the {cap}-byte {pool} budget in use")]
pub struct OverBudget {
    pub what: String,
    pub pool: &'static str,
    pub requested: u64,
    pub used: u64,
    pub cap: u64,
}

/// One capped pool of bytes (device memory, or pinned host memory).
#[derive(Debug)]
pub struct Budget {
    pool: &'static str,
    cap: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

impl Budget {
    pub fn new(pool: &'static str, cap: u64) -> Budget {
        Budget { pool, cap, used: AtomicU64::new(0), peak: AtomicU64::new(0) }
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The highest `used` reached by allocations that succeeded (a reservation whose driver
    /// call failed is not counted: it never held memory).
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Reserves `bytes` for `what`, or refuses without changing anything.
    pub fn reserve(&self, what: &str, bytes: u64) -> Result<Reservation<'_>, OverBudget> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let next = used.checked_add(bytes).filter(|&n| n <= self.cap).ok_or_else(|| OverBudget {
                what: what.to_owned(),
                pool: self.pool,
                requested: bytes,
                used,
                cap: self.cap,
            })?;
            match self.used.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Reservation { budget: self, bytes, kept: false }),
                Err(now) => used = now,
            }
        }
    }

    fn refund(&self, bytes: u64) {
        let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "refund of more bytes than reserved");
    }
}

/// Bytes reserved for an allocation in flight: refunded on drop unless [`Reservation::keep`]
/// turns them into a [`Held`] (the driver call succeeded).
#[must_use = "a reservation is refunded when dropped"]
pub struct Reservation<'a> {
    budget: &'a Budget,
    bytes: u64,
    kept: bool,
}

impl<'a> Reservation<'a> {
    /// The allocation succeeded: keep the bytes until the returned [`Held`] is released.
    pub fn keep(mut self) -> Held {
        self.kept = true;
        self.budget.peak.fetch_max(self.budget.used(), Ordering::AcqRel);
        Held { bytes: self.bytes }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.budget.refund(self.bytes);
        }
    }
}

/// Bytes held by a live allocation; the owner calls [`Budget::release`] when it frees it.
#[derive(Debug)]
pub struct Held {
    bytes: u64,
}

impl Held {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Budget {
    /// Gives back the bytes of a freed allocation.
    pub fn release(&self, held: Held) {
        self.refund(held.bytes);
    }
}

/// Allocates through a budget: reserve, call the driver, keep or refund.
pub fn allocate<T, E>(
    budget: &Budget,
    what: &str,
    bytes: u64,
    driver_alloc: impl FnOnce() -> Result<T, E>,
) -> Result<(T, Held), AllocError<E>> {
    let reservation = budget.reserve(what, bytes).map_err(AllocError::OverBudget)?;
    match driver_alloc() {
        Ok(value) => Ok((value, reservation.keep())),
        Err(e) => Err(AllocError::Driver { what: what.to_owned(), bytes, source: e }),
    }
}

/// An allocation refused by the budget or failed by the driver (its bytes already refunded).
#[derive(Debug, thiserror::Error)]
pub enum AllocError<E> {
    #[error(transparent)]
    OverBudget(OverBudget),
    #[error("{what}: the driver refused {bytes} bytes: {source}")]
    Driver { what: String, bytes: u64, source: E },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn refused_reservation_changes_nothing() {
        let b = Budget::new("device", 100);
        let held = allocate(&b, "a", 60, || Ok::<_, ()>(1)).unwrap().1;
        assert_eq!((b.used(), b.peak()), (60, 60));
        let err = allocate(&b, "b", 41, || Ok::<_, ()>(2)).unwrap_err();
        assert!(matches!(err, AllocError::OverBudget(OverBudget { requested: 41, used: 60, cap: 100, .. })));
        assert_eq!((b.used(), b.peak()), (60, 60));
        b.release(held);
        assert_eq!((b.used(), b.peak()), (0, 60));
    }

    #[test]
    fn failed_driver_call_refunds_and_leaves_the_peak() {
        let b = Budget::new("device", 100);
        let err = allocate(&b, "weights", 80, || Err::<(), _>("out of memory")).unwrap_err();
        assert!(err.to_string().contains("weights: the driver refused 80 bytes"), "{err}");
        assert_eq!((b.used(), b.peak()), (0, 0));
    }

    #[test]
    fn concurrent_reservations_never_overshoot() {
        let b = Arc::new(Budget::new("device", 1000));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for _ in 0..200 {
                        if let Ok((_, h)) = allocate(&b, "x", 7, || Ok::<_, ()>(())) {
                            held.push(h);
                        }
                        assert!(b.used() <= 1000);
                        if held.len() > 10 {
                            b.release(held.remove(0));
                        }
                    }
                    held.into_iter().for_each(|h| b.release(h));
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(b.used(), 0);
        assert!(b.peak() <= 1000 && b.peak() >= 7);
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        let b = Budget::new("device", u64::MAX);
        let _held = allocate(&b, "a", u64::MAX - 1, || Ok::<_, ()>(())).unwrap();
        assert!(allocate(&b, "b", 2, || Ok::<_, ()>(())).is_err());
    }
}
