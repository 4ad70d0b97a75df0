//! Time as a value: the engine never reads a clock, callers pass `now` in.

use std::fmt;
use std::time::Duration;

/// A point in time, in milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch itself; useful in tests.
    pub const ZERO: Timestamp = Timestamp(0);

    pub fn from_unix_millis(millis: u64) -> Timestamp {
        Timestamp(millis)
    }

    pub fn as_unix_millis(self) -> u64 {
        self.0
    }

    /// `self + duration`, saturating at the far future instead of overflowing.
    pub fn saturating_add(self, duration: Duration) -> Timestamp {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(millis))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// An expiration timer on an allocation: released by [`crate::Engine::expire`] once
/// `expires_at` has passed, unless stopped with its id first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    pub id: uuid::Uuid,
    pub expires_at: Timestamp,
}

/// Makes lease ids: UUIDv4-shaped values from a seeded counter.
///
/// The engine does no I/O, so it cannot ask the OS for randomness; the binary seeds it (from
/// the OS) and tests seed it with a constant. Each id mixes the seed with a counter through a
/// bijective mixer, so ids of one engine never repeat, and a new seed per process keeps ids of
/// different runs apart.
#[derive(Clone, Debug)]
pub(crate) struct LeaseIds {
    seed: u64,
    counter: u64,
}

fn mix(mut z: u64) -> u64 {
    // SplitMix64's finalizer: a bijection on u64 with good avalanche.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl LeaseIds {
    pub fn new(seed: u64) -> LeaseIds {
        LeaseIds { seed, counter: 0 }
    }

    pub fn next_id(&mut self) -> uuid::Uuid {
        self.counter = self.counter.wrapping_add(1);
        let high = mix(self.seed ^ mix(self.counter));
        let low = mix(self.counter.wrapping_add(self.seed.rotate_left(32)));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&high.to_be_bytes());
        bytes[8..].copy_from_slice(&low.to_be_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_do_not_repeat_and_are_v4() {
        let mut ids = LeaseIds::new(7);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = ids.next_id();
            assert_eq!(id.get_version_num(), 4);
            assert!(seen.insert(id));
        }
        assert_ne!(LeaseIds::new(1).next_id(), LeaseIds::new(2).next_id());
    }

    #[test]
    fn adding_time_saturates() {
        let t = Timestamp::from_unix_millis(u64::MAX - 5);
        assert_eq!(
            t.saturating_add(Duration::from_secs(1)).as_unix_millis(),
            u64::MAX
        );
        assert_eq!(
            Timestamp::ZERO
                .saturating_add(Duration::from_secs(2))
                .as_unix_millis(),
            2000
        );
    }
}
