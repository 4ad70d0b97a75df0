//! nodeipam's `Timeout`: when to look at a node again, after a success or a run of errors (time passed in, never slept).

use std::time::Duration;

use crate::config::ResyncConfig;

/// The resync timing shared by every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resync {
    /// The wait after a success.
    pub resync: Duration,
    /// The wait after the first error.
    pub initial_retry: Duration,
    /// The longest wait after repeated errors.
    pub max_backoff: Duration,
}

impl From<&ResyncConfig> for Resync {
    fn from(config: &ResyncConfig) -> Self {
        Resync {
            resync: Duration::from_millis(config.resync_ms),
            initial_retry: Duration::from_millis(config.initial_retry_ms),
            max_backoff: Duration::from_millis(config.max_backoff_ms),
        }
    }
}

impl Resync {
    /// When a resync falls due: `None` to read now; the wait before it is due again while
    /// nodes wait for grants (`backlog`): a full read stalls granting for its time and costs
    /// etcd every key, so a burst of registrations is served first, for at most
    /// `RESYNC_DEFERRAL` intervals since the last full read.
    pub fn deferral(&self, since_read: Duration, backlog: bool) -> Option<Duration> {
        let latest = self.resync.saturating_mul(RESYNC_DEFERRAL);
        (backlog && since_read < latest).then(|| self.resync.min(latest - since_read))
    }
}

impl Default for Resync {
    fn default() -> Self {
        Resync::from(&ResyncConfig::default())
    }
}

/// The least wait after a full read, in multiples of the time it took (`RetryState::read_all`).
const RESYNC_SPACING: u32 = 20;

/// The most resync intervals between two full reads while nodes wait for grants.
const RESYNC_DEFERRAL: u32 = 4;

/// One node's retry state: the number of consecutive errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryState {
    consecutive_errors: u32,
}

impl RetryState {
    /// A node with no errors.
    pub fn new() -> RetryState {
        RetryState::default()
    }

    /// The errors since the last success.
    pub fn consecutive_errors(&self) -> u32 {
        self.consecutive_errors
    }

    /// Records a success; returns the wait before the next resync (`resync`).
    pub fn success(&mut self, timing: &Resync) -> Duration {
        self.consecutive_errors = 0;
        timing.resync
    }

    /// Records an error; returns the wait before the next try: `initial_retry` after the first,
    /// `min(initial_retry · 2^(n−1), max_backoff)` after n consecutive errors (overflow-safe).
    pub fn error(&mut self, timing: &Resync) -> Duration {
        self.consecutive_errors = self.consecutive_errors.saturating_add(1);
        let doublings = self.consecutive_errors - 1;
        let factor = 1u32.checked_shl(doublings).filter(|_| doublings < 32);
        let wait = factor
            .and_then(|f| timing.initial_retry.checked_mul(f))
            .unwrap_or(Duration::MAX);
        wait.min(timing.max_backoff)
            .max(timing.initial_retry.min(timing.max_backoff))
    }

    /// Records a success of a full read that took `took` (the leader's resync); returns the
    /// wait before the next one: `resync`, stretched to `RESYNC_SPACING · took` when the read
    /// is slow. A resync rereads the whole prefix (600,000 keys and 2 to 3 s at 100,000
    /// nodes, no grant made meanwhile), so resyncs take at most a twentieth of the leader's
    /// time and of the member's reads whatever the cluster's size.
    pub fn read_all(&mut self, timing: &Resync, took: Duration) -> Duration {
        self.success(timing)
            .max(took.saturating_mul(RESYNC_SPACING))
    }

    /// The wait after the outcome `ok` (success or error), as `success` and `error`.
    pub fn next(&mut self, ok: bool, timing: &Resync) -> Duration {
        if ok {
            self.success(timing)
        } else {
            self.error(timing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeipam_sequence() {
        let timing = Resync::default();
        let mut state = RetryState::new();
        let waits: Vec<u64> = (0..8)
            .map(|_| state.error(&timing).as_millis() as u64)
            .collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        assert_eq!(state.success(&timing), Duration::from_secs(30));
        assert_eq!(state.error(&timing), Duration::from_millis(250));
        assert_eq!(state.consecutive_errors(), 1);
    }

    #[test]
    fn a_slow_full_read_spaces_the_next_one_out() {
        let timing = Resync::default();
        let mut state = RetryState::new();
        state.error(&timing);
        // A read of 280 ms (10,000 nodes): the configured 30 s.
        assert_eq!(
            state.read_all(&timing, Duration::from_millis(280)),
            Duration::from_secs(30)
        );
        assert_eq!(state.consecutive_errors(), 0);
        // A read of 2.5 s (100,000 nodes): twenty times that.
        assert_eq!(
            state.read_all(&timing, Duration::from_millis(2500)),
            Duration::from_secs(50)
        );
        assert_eq!(state.read_all(&timing, Duration::MAX), Duration::MAX);
    }

    #[test]
    fn a_resync_waits_for_a_backlog_of_grants_up_to_four_intervals() {
        let timing = Resync::default();
        let s = Duration::from_secs;
        assert_eq!(timing.deferral(s(30), false), None);
        assert_eq!(timing.deferral(s(30), true), Some(s(30)));
        assert_eq!(timing.deferral(s(100), true), Some(s(20)));
        assert_eq!(timing.deferral(s(120), true), None);
        assert_eq!(timing.deferral(Duration::MAX, true), None);
    }

    #[test]
    fn many_errors_do_not_overflow() {
        let timing = Resync {
            resync: Duration::from_secs(30),
            initial_retry: Duration::MAX / 2,
            max_backoff: Duration::MAX,
        };
        let mut state = RetryState::new();
        for _ in 0..200 {
            assert!(state.next(false, &timing) >= Duration::MAX / 2);
        }
        let mut small = RetryState {
            consecutive_errors: u32::MAX - 1,
        };
        assert_eq!(small.error(&Resync::default()), Duration::from_secs(10));
        assert_eq!(small.error(&Resync::default()), Duration::from_secs(10));
    }
}
