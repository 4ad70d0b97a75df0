//! How values sit in SQLite's columns, shared by the store (`sqlite.rs`) and its history
//! (`history.rs`): times, address families, addresses, and the error of a row that does not
//! decode.

use std::net::IpAddr;

use corral_core::{Family, Timestamp, addr_value};

use crate::StoreError;

/// A time as SQLite stores it (an i64), saturating: real times are far from the limit.
pub(super) fn millis(at: Timestamp) -> i64 {
    i64::try_from(at.as_unix_millis()).unwrap_or(i64::MAX)
}

/// An address as stored: its family's code (4 or 6) and 16 big-endian bytes; `what` names
/// the row in errors.
pub(super) fn read_addr(what: &str, family: i64, addr: Vec<u8>) -> Result<IpAddr, StoreError> {
    let family = match family {
        4 => Family::V4,
        6 => Family::V6,
        other => return Err(corrupt(what, format!("family {other}"))),
    };
    let bytes: [u8; 16] = addr
        .try_into()
        .map_err(|_| corrupt(what, "address is not 16 bytes"))?;
    let value = u128::from_be_bytes(bytes);
    if value > family.max_value() {
        return Err(corrupt(what, "address out of range"));
    }
    Ok(family.addr(value))
}

pub(super) fn family_code(family: Family) -> i64 {
    match family {
        Family::V4 => 4,
        Family::V6 => 6,
    }
}

pub(super) fn addr_blob(addr: IpAddr) -> [u8; 16] {
    addr_value(addr).to_be_bytes()
}

pub(super) fn corrupt(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}
