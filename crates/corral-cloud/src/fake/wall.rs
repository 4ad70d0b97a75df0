//! The fake's clock as a state file writes it: tokio's [`Instant`] (which a test may pause and
//! advance) anchored once to the wall clock, so deadlines written by one process mean the same
//! in another, and serde helpers for instants in the persisted model.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The longest delay the fake takes (latency, attachment and detachment delays, consistency
/// lag, timeout): the builder refuses more and the runtime setters clamp to it, so that no
/// `Instant + Duration` can overflow.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// This process's pairing of tokio's clock with the wall clock, taken once.
fn anchor() -> (Instant, i128) {
    static ANCHOR: OnceLock<(Instant, i128)> = OnceLock::new();
    *ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        (Instant::now(), wall)
    })
}

/// An instant as wall-clock nanoseconds since the epoch.
fn to_wall(at: Instant) -> i64 {
    let (base, wall) = anchor();
    let offset = match at.checked_duration_since(base) {
        Some(after) => after.as_nanos() as i128,
        None => -(base.duration_since(at).as_nanos() as i128),
    };
    (wall + offset).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Wall-clock nanoseconds as an instant of this process (saturating at the clock's ends).
fn from_wall(nanos: i64) -> Instant {
    let (base, wall) = anchor();
    let offset = i128::from(nanos) - wall;
    let magnitude = Duration::from_nanos(offset.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    if offset >= 0 {
        base.checked_add(magnitude)
            .unwrap_or(base + 1000 * MAX_DELAY)
    } else {
        base.checked_sub(magnitude).unwrap_or(base)
    }
}

/// `#[serde(with)]` for an [`Instant`].
pub(crate) mod instant {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tokio::time::Instant;

    pub(crate) fn serialize<S: Serializer>(at: &Instant, s: S) -> Result<S::Ok, S::Error> {
        super::to_wall(*at).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Instant, D::Error> {
        i64::deserialize(d).map(super::from_wall)
    }
}

/// `#[serde(with)]` for an optional [`Instant`].
pub(crate) mod instant_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tokio::time::Instant;

    pub(crate) fn serialize<S: Serializer>(at: &Option<Instant>, s: S) -> Result<S::Ok, S::Error> {
        at.map(super::to_wall).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Instant>, D::Error> {
        Option::<i64>::deserialize(d).map(|at| at.map(super::from_wall))
    }
}

/// `#[serde(with)]` for an interface's versions (each with the instant it shows from).
pub(crate) mod instant_versions {
    use std::collections::VecDeque;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tokio::time::Instant;

    type Versions<T> = VecDeque<(Instant, Option<T>)>;

    pub(crate) fn serialize<S: Serializer, T: Serialize>(
        versions: &Versions<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let list: Vec<(i64, &Option<T>)> = versions
            .iter()
            .map(|(at, version)| (super::to_wall(*at), version))
            .collect();
        list.serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Versions<T>, D::Error> {
        let list = Vec::<(i64, Option<T>)>::deserialize(d)?;
        Ok(list
            .into_iter()
            .map(|(at, version)| (super::from_wall(at), version))
            .collect())
    }
}
