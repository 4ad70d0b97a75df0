//! `GET /v1/history`: the agent's allocation history as data, and the times it is asked and
//! answered in (RFC 3339 in UTC, or milliseconds since the epoch).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{AttachmentKey, FamilyName};

/// What happened to an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum HistoryKind {
    /// Allocated to its owner.
    Allocated,
    /// Released by its owner (a CNI DEL, a release through the API).
    Released,
    /// Its lease ran out.
    Expired,
    /// Released by the leak collector (its attachment was gone).
    Collected,
    /// Released because the space holding it went away (an interface or its address removed
    /// with `force`).
    Surrendered,
}

/// One event of an agent's allocation history.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HistoryEvent {
    /// When, in milliseconds since the epoch.
    pub at_ms: u64,
    /// The same time in RFC 3339 (UTC).
    pub at: String,
    pub event: HistoryKind,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub family: FamilyName,
    pub scope: String,
    pub pool: String,
    /// The CNI attachment, if the allocation had one.
    pub key: Option<AttachmentKey>,
    /// Who held it: `NAMESPACE/NAME` for a pod whose CNI call named it, else the container ID,
    /// or the `owner` of an allocation through the API.
    pub owner: String,
    pub generation: u64,
}

/// The answer of `GET /v1/history`.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HistoryResponse {
    /// The events matching every filter, newest first, at most `limit`.
    pub events: Vec<HistoryEvent>,
    /// With `address` and `at`: the allocations of that address in force at that instant
    /// (one per scope holding it; empty when nobody held it).
    pub held: Option<Vec<HistoryEvent>>,
}

/// The filters of `GET /v1/history` as a client sends them (times in milliseconds since the
/// epoch); [`HistoryFilter::path`] is the request's path and query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryFilter {
    pub address: Option<IpAddr>,
    /// With `address`: who held it at this instant.
    pub at: Option<u64>,
    /// The owner: a pod as `NAMESPACE/NAME`.
    pub pod: Option<String>,
    /// `CONTAINER_ID` or `CONTAINER_ID/IFNAME`.
    pub key: Option<String>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub limit: Option<u64>,
}

impl HistoryFilter {
    /// `/v1/history` with the filters given, percent-encoded.
    pub fn path(&self) -> String {
        let mut query = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                query.push(format!("{name}={}", crate::percent_encode(&value)));
            }
        };
        add("address", self.address.map(|a| a.to_string()));
        add("at", self.at.map(|t| t.to_string()));
        add("pod", self.pod.clone());
        add("key", self.key.clone());
        add("since", self.since.map(|t| t.to_string()));
        add("until", self.until.map(|t| t.to_string()));
        add("limit", self.limit.map(|n| n.to_string()));
        if query.is_empty() {
            crate::paths::HISTORY.to_owned()
        } else {
            format!("{}?{}", crate::paths::HISTORY, query.join("&"))
        }
    }
}

/// The most events one answer holds.
pub const MAX_HISTORY_LIMIT: u64 = 10_000;
/// The default `limit`.
pub const DEFAULT_HISTORY_LIMIT: u64 = 100;

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date of a day since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `ms` since the epoch in RFC 3339, UTC, to the millisecond: `2026-11-27T14:02:00.000Z`.
pub fn format_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rest = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        ms % 1000
    )
}

/// A time as the history is asked it: RFC 3339 (`2026-11-27T14:02:00Z`, an offset such as
/// `+01:00`, fractions of a second to the millisecond; seconds and the zone may be left out,
/// and then the time is UTC: `2026-11-27T14:02`), or milliseconds since the epoch.
/// Answers milliseconds since the epoch, or why the text is not a time.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let bad = |why: &str| {
        format!(
            "{text:?} is not a time: {why} (give RFC 3339, e.g. 2026-11-27T14:02:00Z, or \
             milliseconds since the epoch)"
        )
    };
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| bad("too large"));
    }
    let bytes = text.as_bytes();
    let number = |from: usize, len: usize| -> Result<u32, String> {
        let part = text.get(from..from + len).ok_or_else(|| bad("too short"))?;
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("a field is not a number"));
        }
        part.parse().map_err(|_| bad("a field is not a number"))
    };
    let expect = |at: usize, what: &[u8]| -> Result<(), String> {
        match bytes.get(at) {
            Some(b) if what.contains(b) => Ok(()),
            _ => Err(bad("it is not YYYY-MM-DDTHH:MM[:SS[.fff]][Z|±HH:MM]")),
        }
    };
    let year = number(0, 4)?;
    expect(4, b"-")?;
    let month = number(5, 2)?;
    expect(7, b"-")?;
    let day = number(8, 2)?;
    expect(10, b"Tt ")?;
    let hour = number(11, 2)?;
    expect(13, b":")?;
    let minute = number(14, 2)?;
    let mut at = 16;
    let mut second = 0;
    let mut millis = 0;
    if bytes.get(at) == Some(&b':') {
        second = number(at + 1, 2)?;
        at += 3;
        if bytes.get(at) == Some(&b'.') {
            let digits = bytes[at + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits == 0 {
                return Err(bad("no digits after the decimal point"));
            }
            let fraction = &text[at + 1..at + 1 + digits.min(3)];
            millis = format!("{fraction:0<3}").parse::<u32>().unwrap_or(0);
            at += 1 + digits;
        }
    }
    let offset_minutes: i64 = match &text[at..] {
        "" | "Z" | "z" => 0,
        zone => {
            let sign = match zone.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(bad("the zone is not Z or ±HH:MM")),
            };
            if zone.len() != 6 || zone.as_bytes()[3] != b':' {
                return Err(bad("the zone is not Z or ±HH:MM"));
            }
            let hours = number(at + 1, 2)?;
            let minutes = number(at + 4, 2)?;
            if hours > 23 || minutes > 59 {
                return Err(bad("the zone's offset is out of range"));
            }
            sign * i64::from(hours * 60 + minutes)
        }
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad("the month is out of range")),
    };
    if day == 0 || day > days_in_month {
        return Err(bad("the day is out of range"));
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err(bad("the time of day is out of range"));
    }
    let days = days_from_civil(i64::from(year), month, day);
    let secs =
        days * 86_400 + i64::from(hour * 3600 + minute * 60 + second.min(59)) - offset_minutes * 60;
    let ms = secs * 1000 + i64::from(millis);
    u64::try_from(ms).map_err(|_| bad("it is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_parse_in_every_form() {
        for ms in [
            0,
            1,
            86_399_999,
            951_782_400_000,
            1_795_788_120_123,
            4_102_444_800_000,
        ] {
            assert_eq!(parse_time(&format_time(ms)), Ok(ms), "{}", format_time(ms));
        }
        assert_eq!(format_time(1_795_788_120_000), "2026-11-27T14:02:00.000Z");
        let at = 1_795_788_120_000;
        for text in [
            "2026-11-27T14:02",
            "2026-11-27T14:02Z",
            "2026-11-27T14:02:00",
            "2026-11-27t14:02:00z",
            "2026-11-27 14:02:00Z",
            "2026-11-27T15:02:00+01:00",
            "2026-11-27T13:32:00-00:30",
            "2026-11-27T14:02:00.0000Z",
            "1795788120000",
        ] {
            assert_eq!(parse_time(text), Ok(at), "{text}");
        }
        assert_eq!(parse_time("2026-11-27T14:02:00.5Z"), Ok(at + 500));
        assert_eq!(parse_time("2028-02-29T00:00Z").map(|_| ()), Ok(()));
        for bad in [
            "",
            "yesterday",
            "2026-11-27",
            "2026-13-01T00:00",
            "2026-02-29T00:00",
            "2026-11-27T24:00",
            "2026-11-27T14:02:00+1",
            "2026-11-27T14:02:00.Z",
            "2026-11-27T14:02:00Q",
            "1969-12-31T23:59Z",
            "99999999999999999999999",
        ] {
            let error = parse_time(bad).unwrap_err();
            assert!(error.contains("is not a time"), "{bad}: {error}");
        }
    }
}
