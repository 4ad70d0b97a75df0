//! corral's cloud provider on the official AWS SDK for EC2.
