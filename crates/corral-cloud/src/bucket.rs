//! EC2's per-action token buckets: [`BucketLimit`] (their sizes, EC2's numbers in one place)
//! and the exact integer-unit `TokenBucket` that both the fake (which throttles with it) and
//! the call scheduler (which waits on it so that EC2 never has to throttle) use.

use std::time::Duration;

use tokio::time::Instant;

use crate::Action;

/// A token bucket's size: `burst` calls at once, refilled by `per_second`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketLimit {
    /// Tokens when full.
    pub burst: u32,
    /// Tokens added per second.
    pub per_second: u32,
}

impl BucketLimit {
    /// EC2's bucket for an action (account and region wide): describes 100 burst / 20 per s;
    /// attach and detach 50 / 5; create, delete, assign, unassign and tags 100 / 5.
    pub fn default_for(action: Action) -> BucketLimit {
        let (burst, per_second) = match action {
            Action::DescribeInstances
            | Action::DescribeInstanceTypes
            | Action::DescribeSubnets
            | Action::DescribeNetworkInterfaces => (100, 20),
            Action::AttachNetworkInterface | Action::DetachNetworkInterface => (50, 5),
            Action::CreateNetworkInterface
            | Action::DeleteNetworkInterface
            | Action::AssignPrivateIpAddresses
            | Action::UnassignPrivateIpAddresses
            | Action::AssignIpv6Addresses
            | Action::UnassignIpv6Addresses
            | Action::CreateTags
            | Action::DeleteTags => (100, 5),
        };
        BucketLimit { burst, per_second }
    }
}

/// One token is this many units. The refill rate is kept in thousandths of a token per second,
/// so refilling adds exactly `rate_millis` units per nanosecond: integer arithmetic, no drift,
/// and fractional rates (the scheduler's adapted ones) are exact too.
const UNITS_PER_TOKEN: u128 = 1_000_000_000_000;

/// A token bucket on tokio's clock: full (`burst` tokens) when made, refilled continuously at
/// its rate (the limit's `per_second` unless changed with [`TokenBucket::set_rate_millis`]).
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    limit: BucketLimit,
    rate_millis: u64,
    /// The most units it holds: the burst, unless capped lower.
    cap: u128,
    units: u128,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of this size, refilled at its `per_second`.
    pub(crate) fn new(limit: BucketLimit, now: Instant) -> TokenBucket {
        TokenBucket {
            limit,
            rate_millis: u64::from(limit.per_second) * 1000,
            cap: u128::from(limit.burst) * UNITS_PER_TOKEN,
            units: u128::from(limit.burst) * UNITS_PER_TOKEN,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        self.units = (self.units + elapsed * u128::from(self.rate_millis)).min(self.cap);
        self.last = self.last.max(now);
    }

    /// Takes a token if there is one.
    pub(crate) fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.units >= UNITS_PER_TOKEN {
            self.units -= UNITS_PER_TOKEN;
            true
        } else {
            false
        }
    }

    /// The tokens in the bucket now (a fraction while one refills).
    pub(crate) fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.units as f64 / UNITS_PER_TOKEN as f64
    }

    /// Empties the bucket: the next token comes one refill period from now.
    pub(crate) fn drain(&mut self, now: Instant) {
        self.refill(now);
        self.units = 0;
    }

    /// Changes the refill rate (thousandths of a token per second) from `now` on; the time
    /// before `now` is refilled at the old rate.
    pub(crate) fn set_rate_millis(&mut self, now: Instant, rate_millis: u64) {
        self.refill(now);
        self.rate_millis = rate_millis;
    }

    /// Holds at most `tokens_millis` thousandths of a token (at least one token, at most the
    /// burst) from `now` on.
    pub(crate) fn set_cap_millis(&mut self, now: Instant, tokens_millis: u64) {
        self.refill(now);
        let burst = u128::from(self.limit.burst) * UNITS_PER_TOKEN;
        self.cap =
            (u128::from(tokens_millis) * (UNITS_PER_TOKEN / 1000)).clamp(UNITS_PER_TOKEN, burst);
        self.units = self.units.min(self.cap);
    }

    /// How long until a token is there at the current rate (zero if one is); `None` if never
    /// (a rate of zero).
    pub(crate) fn time_to_token(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        if self.units >= UNITS_PER_TOKEN {
            return Some(Duration::ZERO);
        }
        if self.rate_millis == 0 {
            return None;
        }
        let missing = UNITS_PER_TOKEN - self.units;
        let nanos = missing.div_ceil(u128::from(self.rate_millis));
        Some(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(burst: u32, per_second: u32) -> BucketLimit {
        BucketLimit { burst, per_second }
    }

    #[test]
    fn starts_full_and_refills_exactly() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(3, 5), start);
        assert!((0..3).all(|_| bucket.try_take(start)));
        assert!(!bucket.try_take(start));
        assert_eq!(
            bucket.time_to_token(start),
            Some(Duration::from_millis(200))
        );
        let almost = start + Duration::from_nanos(199_999_999);
        assert!(!bucket.try_take(almost));
        assert!(bucket.try_take(start + Duration::from_millis(200)));
        // A long idle time fills it to the burst, no more.
        let later = start + Duration::from_secs(3600);
        assert_eq!(bucket.tokens(later), 3.0);
    }

    #[test]
    fn a_thousand_seconds_give_exactly_rate_times_seconds() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(10_000, 7), start);
        bucket.drain(start);
        let mut taken = 0;
        // Take at odd times (1/7 s rounded down): the refill carries the remainders.
        let step = Duration::from_nanos(1_000_000_000 / 7);
        let end = start + Duration::from_secs(1000);
        let mut now = start + step;
        while now < end {
            taken += u32::from(bucket.try_take(now));
            now += step;
        }
        while bucket.try_take(end) {
            taken += 1;
        }
        assert_eq!(taken, 7000);
    }

    #[test]
    fn drain_and_a_lower_rate_delay_the_next_token() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(10, 5), start);
        bucket.drain(start);
        assert_eq!(bucket.tokens(start), 0.0);
        bucket.set_rate_millis(start, 2500);
        assert_eq!(
            bucket.time_to_token(start),
            Some(Duration::from_millis(400))
        );
        // The time before a change is refilled at the old rate.
        let half = start + Duration::from_millis(200);
        bucket.set_rate_millis(half, 5000);
        assert_eq!(bucket.time_to_token(half), Some(Duration::from_millis(100)));
        bucket.set_rate_millis(half, 0);
        assert_eq!(bucket.time_to_token(half), None);
    }
}
