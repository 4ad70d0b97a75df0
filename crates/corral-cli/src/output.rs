//! Rendering for people and scripts: aligned text tables, times and durations, and the
//! API's JSON pretty-printed.

use corral_api::FamilyName;
use serde::Serialize;

use crate::exit::Failure;

/// A table of text cells, rendered with columns padded to their widest cell and two spaces
/// between columns. Numeric columns can be aligned right.
#[derive(Debug)]
pub struct Table {
    header: Vec<&'static str>,
    right_aligned: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            right_aligned: vec![false; header.len()],
            rows: Vec::new(),
        }
    }

    /// Aligns the named columns to the right.
    pub fn right(mut self, columns: &[&str]) -> Table {
        for (index, name) in self.header.iter().enumerate() {
            if columns.contains(name) {
                self.right_aligned[index] = true;
            }
        }
        self
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn push(&mut self, mut row: Vec<String>) {
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let header: Vec<String> = self.header.iter().map(|name| (*name).to_owned()).collect();
        let mut widths: Vec<usize> = vec![0; self.header.len()];
        for row in std::iter::once(&header).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut text = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if index > 0 {
                    line.push_str("  ");
                }
                let padding = " ".repeat(width.saturating_sub(cell.chars().count()));
                if self.right_aligned[index] {
                    line.push_str(&padding);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&padding);
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

/// The API's JSON for a value, pretty-printed, with a final newline.
pub fn json<T: Serialize>(value: &T) -> Result<String, Failure> {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            Ok(text)
        }
        Err(error) => Err(Failure::Agent(corral_client::Error::Protocol(format!(
            "cannot render the answer as JSON: {error}"
        )))),
    }
}

/// A time given in milliseconds since the Unix epoch, as UTC: `2026-03-01T12:00:05Z`.
pub fn utc(unix_ms: u64) -> String {
    let seconds = unix_ms / 1000;
    let days = i64::try_from(seconds / 86_400).unwrap_or(i64::MAX / 2);
    let second_of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era.saturating_mul(400) + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// A duration in milliseconds in the syntax `corral` reads: `1h30m`, `250ms`, `0s`.
pub fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut text = String::new();
    let mut rest = ms;
    for (unit, unit_ms) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if rest >= unit_ms {
            text.push_str(&format!("{}{unit}", rest / unit_ms));
            rest %= unit_ms;
        }
    }
    text
}

/// A family as the API names it.
pub fn family(family: FamilyName) -> &'static str {
    match family {
        FamilyName::Ipv4 => "ipv4",
        FamilyName::Ipv6 => "ipv6",
    }
}

/// Where a range came from, as `pool list` shows it.
pub fn range_source(source: corral_api::RangeSource) -> &'static str {
    match source {
        corral_api::RangeSource::File => "file",
        corral_api::RangeSource::Api => "api",
        corral_api::RangeSource::Cni => "cni",
        corral_api::RangeSource::Cluster => "cluster",
        corral_api::RangeSource::Interface => "interface",
    }
}

/// A cell for something absent.
pub fn none() -> String {
    "-".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new(&["NAME", "COUNT", "NOTE"]).right(&["COUNT"]);
        table.push(vec!["a".into(), "1".into(), "".into()]);
        table.push(vec!["longer".into(), "1234".into(), "ü note".into()]);
        table.push(vec!["short".into()]);
        assert_eq!(
            table.render(),
            "NAME    COUNT  NOTE\n\
             a           1\n\
             longer   1234  ü note\n\
             short\n"
        );
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_767_225_599_999), "2025-12-31T23:59:59Z");
        assert_eq!(utc(4_102_444_800_000), "2100-01-01T00:00:00Z");
        // No panic at the far end.
        assert!(utc(u64::MAX).ends_with('Z'));
    }

    #[test]
    fn durations_round_trip() {
        for ms in [
            0,
            1,
            999,
            1000,
            30_000,
            90_000,
            5_400_000,
            86_400_001,
            u64::MAX,
        ] {
            assert_eq!(crate::parse::duration_ms(&duration(ms)), Ok(ms), "{ms}");
        }
        assert_eq!(duration(5_400_000), "1h30m");
    }
}
