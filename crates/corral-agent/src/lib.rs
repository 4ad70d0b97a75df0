//! corral-agent (being written).
