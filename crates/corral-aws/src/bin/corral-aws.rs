//! `corral-aws`: the corral command line with `--cloud aws` (the AWS SDK for EC2, which only
//! this crate links): `corral-aws operator --cloud aws` manages the cloud pools' interfaces
//! on EC2, `corral-aws cluster check --cloud aws` compares their records with EC2's view.
//! Every other subcommand is the plain `corral`'s.
//!
//! EC2 is found as every AWS tool finds it: the region from `AWS_REGION` (or the profile, or
//! the instance metadata service), credentials from the default chain (environment, profile,
//! web identity as on EKS, ECS task role, instance profile), the endpoint from
//! `--cloud-endpoint`, else `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL`, else EC2's own.

fn main() -> std::process::ExitCode {
    let providers = corral_cli::Providers::builtin().with("aws", |settings| async move {
        let endpoint = settings.endpoint.as_deref();
        Ok(corral_aws::Ec2::from_env_at(endpoint, corral_aws::Timeouts::default()).await)
    });
    corral_cli::main_with(providers)
}
