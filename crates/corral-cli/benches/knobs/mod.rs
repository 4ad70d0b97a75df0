//! What the benches read from the environment: their sizes and durations.

/// The value of the environment variable `name`, else `default` (also when it does not
/// parse).
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
