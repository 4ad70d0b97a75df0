//! Parsers of the command line's own value syntaxes: durations (`30s`, `5m`, `1h30m`) and
//! attachment keys (`NETWORK/CONTAINER/IFNAME`).

use corral_api::AttachmentKey;

/// Milliseconds of a duration written as numbers with units, largest first or not:
/// `250ms`, `30s`, `5m`, `1h`, `2d`, `1h30m`.
pub fn duration_ms(text: &str) -> Result<u64, String> {
    let invalid = || {
        format!("invalid duration {text:?}: expected e.g. 30s, 5m, 1h30m (units: ms, s, m, h, d)")
    };
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (number, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let number: u64 = number.parse().map_err(|_| invalid())?;
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(invalid()),
        };
        total = number
            .checked_mul(unit_ms)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("duration {text:?} is too long"))?;
        rest = after;
    }
    Ok(total)
}

/// An attachment key written `NETWORK/CONTAINER/IFNAME` (no part can hold a `/`).
pub fn attachment_key(text: &str) -> Result<AttachmentKey, String> {
    let parts: Vec<&str> = text.split('/').collect();
    match parts.as_slice() {
        [network, container_id, ifname]
            if !network.is_empty() && !container_id.is_empty() && !ifname.is_empty() =>
        {
            Ok(AttachmentKey {
                network: (*network).to_owned(),
                container_id: (*container_id).to_owned(),
                ifname: (*ifname).to_owned(),
            })
        }
        _ => Err(format!(
            "invalid attachment key {text:?}: expected NETWORK/CONTAINER/IFNAME"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration_ms("250ms"), Ok(250));
        assert_eq!(duration_ms("30s"), Ok(30_000));
        assert_eq!(duration_ms("5m"), Ok(300_000));
        assert_eq!(duration_ms("1h"), Ok(3_600_000));
        assert_eq!(duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(duration_ms("2d1s"), Ok(172_801_000));
        assert_eq!(duration_ms("0s"), Ok(0));
        for bad in [
            "",
            "30",
            "s",
            "1x",
            "1h 30m",
            "-1s",
            "1.5h",
            "99999999999999999999d",
            "ß",
        ] {
            assert!(duration_ms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys() {
        let key = attachment_key("net1/0123abcd/eth0").unwrap();
        assert_eq!(
            (
                key.network.as_str(),
                key.container_id.as_str(),
                key.ifname.as_str()
            ),
            ("net1", "0123abcd", "eth0")
        );
        for bad in ["", "a/b", "a/b/c/d", "a//c", "/b/c", "a/b/"] {
            assert!(attachment_key(bad).is_err(), "{bad:?}");
        }
    }
}
