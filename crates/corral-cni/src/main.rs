//! corral-ipam: the CNI IPAM plugin binary.

fn main() {}
