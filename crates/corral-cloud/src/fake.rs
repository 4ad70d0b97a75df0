//! The realistic in-process fake EC2 (filled in below).

/// The fake EC2.
#[derive(Debug)]
pub struct FakeEc2;
