//! The shared contract suite (filled in below).
