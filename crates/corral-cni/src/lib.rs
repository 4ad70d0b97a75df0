//! corral-cni: the CNI protocol (environment, configuration, results, errors) for corral-ipam.
