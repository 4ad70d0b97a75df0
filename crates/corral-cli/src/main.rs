//! corral: the command line (being written).

fn main() {}
