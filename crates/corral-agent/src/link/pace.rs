//! The pace of one node's demand writes, as a value: a token bucket filled at the node's share
//! of the cluster's demand write budget (one token per `corral_cluster::demand_interval`),
//! holding at most [`DemandPace::BURST`] tokens. A change that is not urgent waits for a full
//! bucket, so one token is kept for an urgent one (free addresses below the watermark, an ADD
//! waiting): a starving node is served first within its share, at once unless it already
//! wrote urgently within the last interval, and within one interval whatever it wrote before.
//!
//! Over any time `t`, a node writes at most `BURST + t / interval` times, so every node
//! together at most `nodes × BURST + t × budget`: the budget holds as a rate, and the burst only
//! adds a fixed count however long the window. No I/O, no clock: `now` comes in.

use std::time::Duration;

use tokio::time::Instant;

/// Tokens are counted in billionths, so a share of one write in 100 s still fills exactly.
const UNIT: u128 = 1_000_000_000;

/// One node's token bucket of demand writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemandPace {
    /// One token per this time (the node's share of the budget).
    interval: Duration,
    /// Tokens held at `at`, in [`UNIT`]s of a token (at most `BURST` tokens).
    credit: u128,
    at: Instant,
}

impl DemandPace {
    /// The most tokens a node holds: one write that is not urgent and one urgent.
    pub const BURST: u128 = 2;

    /// A full bucket at `now`, one token per `interval`.
    pub fn new(now: Instant, interval: Duration) -> DemandPace {
        DemandPace {
            interval: interval.max(Duration::from_nanos(1)),
            credit: Self::BURST * UNIT,
            at: now,
        }
    }

    /// The time per token.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The credit at `now` (not before `at`), filled at the current interval.
    fn credit_at(&self, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let earned = elapsed.saturating_mul(UNIT) / self.interval.as_nanos();
        self.credit.saturating_add(earned).min(Self::BURST * UNIT)
    }

    fn fill(&mut self, now: Instant) {
        if now > self.at {
            self.credit = self.credit_at(now);
            self.at = now;
        }
    }

    /// From `now` on, one token per `interval` (what was earned until `now` is kept).
    pub fn set_interval(&mut self, now: Instant, interval: Duration) {
        self.fill(now);
        self.interval = interval.max(Duration::from_nanos(1));
    }

    /// The tokens a write needs in the bucket: one if `urgent`, else a full bucket.
    fn needed(urgent: bool) -> u128 {
        if urgent { UNIT } else { Self::BURST * UNIT }
    }

    /// The earliest time from `now` a write may go (`now` itself if it may go now): an urgent
    /// one needs a token, one that is not urgent a full bucket.
    pub fn allowed_at(&self, now: Instant, urgent: bool) -> Instant {
        let now = now.max(self.at);
        let credit = self.credit_at(now);
        let needed = Self::needed(urgent);
        if credit >= needed {
            return now;
        }
        // The credit is filled from `self.at`: the time from there at which it reaches
        // `needed`, rounded up so the bucket holds it then.
        let missing = needed - self.credit;
        let nanos = (missing * self.interval.as_nanos()).div_ceil(UNIT);
        let wait = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        (self.at + wait).max(now)
    }

    /// A write went at `now` (allowed then: see [`DemandPace::allowed_at`]): one token less.
    pub fn wrote(&mut self, now: Instant) {
        self.fill(now);
        self.credit = self.credit.saturating_sub(UNIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_quiet_node_writes_at_once_and_keeps_a_token_for_urgency() {
        let start = Instant::now();
        let mut pace = DemandPace::new(start, 10 * SECOND);
        assert_eq!(pace.allowed_at(start, false), start);
        pace.wrote(start);
        // The reserve: an urgent write goes at once, one that is not urgent waits an interval.
        assert_eq!(pace.allowed_at(start, true), start);
        assert_eq!(pace.allowed_at(start, false), start + 10 * SECOND);
        pace.wrote(start);
        // Empty: the next urgent write waits one interval, the next other one two.
        assert_eq!(pace.allowed_at(start, true), start + 10 * SECOND);
        assert_eq!(pace.allowed_at(start, false), start + 20 * SECOND);
        let later = start + 4 * SECOND;
        assert_eq!(pace.allowed_at(later, true), start + 10 * SECOND);
        // A longer share from now: what was earned is kept, the rest comes slower.
        pace.set_interval(later, 20 * SECOND);
        assert_eq!(pace.allowed_at(later, true), later + 12 * SECOND);
        assert_eq!(
            pace.allowed_at(later + 30 * SECOND, true),
            later + 30 * SECOND
        );
    }

    /// One step of a node's life: time passes, its share changes (the cluster's nodes or
    /// budget), a change of its demand comes, urgent or not.
    #[derive(Debug, Clone)]
    struct Step {
        after_ms: u64,
        interval_ms: Option<u64>,
        change: Option<bool>,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0u64..30_000,
            proptest::option::weighted(0.1, 1_000u64..120_000),
            proptest::option::weighted(0.7, any::<bool>()),
        )
            .prop_map(|(after_ms, interval_ms, change)| Step {
                after_ms,
                interval_ms,
                change,
            })
    }

    proptest! {
        /// Random interleavings of churn and shares: the writes the pace lets through never
        /// exceed the share (in every window between two writes, at most `BURST` plus what
        /// the intervals in force earned), and an urgent change waits at most the longest
        /// interval in force while it waits.
        #[test]
        fn writes_never_exceed_the_share_and_urgency_waits_at_most_an_interval(
            steps in proptest::collection::vec(step(), 1..300)
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut pace = DemandPace::new(start, 5 * SECOND);
            // The share's history: (from, interval).
            let mut shares = vec![(start, pace.interval())];
            let mut writes: Vec<Instant> = Vec::new();
            // A change waiting to be written: (since, urgent, longest interval meanwhile).
            let mut waiting: Option<(Instant, bool, Duration)> = None;
            for step in steps {
                let until = now + Duration::from_millis(step.after_ms);
                // Writes owed meanwhile, at the time the pace allows them (a writer looks
                // exactly then: the link sleeps until that time).
                while let Some((since, urgent, longest)) = waiting {
                    let at = pace.allowed_at(now, urgent);
                    if at > until {
                        break;
                    }
                    prop_assert!(at >= now);
                    if urgent {
                        // (A refill rounds down to a billionth of a token: nanoseconds.)
                        let slack = Duration::from_micros(1);
                        prop_assert!(
                            at - since <= longest + slack,
                            "{:?} > {longest:?}",
                            at - since
                        );
                    }
                    pace.wrote(at);
                    writes.push(at);
                    now = at;
                    waiting = None;
                }
                now = until;
                if let Some(ms) = step.interval_ms {
                    pace.set_interval(now, Duration::from_millis(ms));
                    shares.push((now, pace.interval()));
                    if let Some((_, _, longest)) = &mut waiting {
                        *longest = (*longest).max(pace.interval());
                    }
                }
                if let Some(urgent) = step.change {
                    waiting = Some(match waiting {
                        Some((since, was, longest)) if was || !urgent => {
                            (since, was || urgent, longest)
                        }
                        _ => (now, urgent, pace.interval()),
                    });
                }
            }
            // Tokens earned between two instants under the share's history.
            let earned = |from: Instant, to: Instant| -> f64 {
                let mut sum = 0.0;
                for (i, (at, interval)) in shares.iter().enumerate() {
                    let end = shares.get(i + 1).map_or(to, |(next, _)| *next).min(to);
                    let begin = (*at).max(from);
                    if end > begin {
                        sum += (end - begin).as_secs_f64() / interval.as_secs_f64();
                    }
                }
                sum
            };
            for i in 0..writes.len() {
                for j in i..writes.len() {
                    let count = (j - i + 1) as f64;
                    let allowed = DemandPace::BURST as f64 + earned(writes[i], writes[j]);
                    prop_assert!(
                        count <= allowed + 1e-6,
                        "{count} writes in {:?}, {allowed} allowed",
                        writes[j] - writes[i]
                    );
                }
            }
        }
    }
}
