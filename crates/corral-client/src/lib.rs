//! corral-client (being written).
